"""Held-out evaluation of an RL policy through the harness (pass@k rows, cached per output dir).

`evaluate(params, ...)` runs the sampling engine + harness + grader on held-out tasks and returns
{"rows", "results"}; the RL stage (before / after), `sft_matched` and the difficulty sweep
(`c2jax.train.rl_difficulty`) all score policies through it, so their figures are comparable.
Grading is memoised per evaluation on (task, diff) (`c2jax.envs.grade_cache`; ``rl.grade_cache``):
the verdicts are the grader's, the duplicates just are not re-run.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from c2jax.atomic import atomic_write_json

log = logging.getLogger(__name__)


def eval_samples(ev: dict) -> int:
    """Samples per task of an evaluation section: ``samples`` (>= ``k``; pass@k is the unbiased estimate
    from them), or ``k`` where it is None or absent."""
    return int(ev.get("samples") or ev["k"])


def cached_rows_mismatch(rows: list, tasks: list, samples: int) -> str | None:
    """Why evaluation rows cached on disk cannot stand for this evaluation (None when they can): they
    must hold the same tasks in the same order with `samples` samples each. A rerun with another
    ``rl.eval.samples`` (or task list) in the same workdir would otherwise report the old numbers."""
    want = [t.instance_id for t in tasks]
    got = [r.get("instance_id") for r in rows]
    if got != want:
        return f"tasks differ ({len(got)} cached, {len(want)} wanted; first cached {got[:2]}, wanted {want[:2]})"
    counts = sorted({len(r.get("samples", ())) for r in rows})
    if rows and counts != [samples]:
        return f"samples per task differ (cached {counts}, wanted {samples})"
    return None


def evaluate(params: Any, cfg: Any, tokenizer: Any, config: Any, rl: dict, tasks: list, out_dir: str,
             seed: int) -> dict:
    """Held-out pass@k of `params` through the harness (cached in out_dir/rows.jsonl)."""
    from c2jax.agent.policies import EnginePolicy
    from c2jax.bench.agent_eval import evaluate_agent, summarize_agent
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.envs.grade_cache import GradeCache
    from c2jax.train.rl_family import make_harness
    from c2jax.train.rl_rollouts import grade_validated

    rows_path = os.path.join(out_dir, "rows.json")
    ev = rl["eval"]
    rows = None
    if os.path.exists(rows_path):
        with open(rows_path) as f:
            rows = json.load(f)
        why = cached_rows_mismatch(rows, tasks, eval_samples(ev))
        if why is not None:
            log.warning("%s: cached rows not reused, %s; evaluating again", rows_path, why)
            rows = None
    if rows is None:
        os.makedirs(out_dir, exist_ok=True)
        engine = Engine(params, cfg, EngineConfig(max_slots=int(ev["max_in_flight"]), max_len=int(rl["max_len"])),
                        tokenizer=tokenizer)
        try:
            harness, fmt = make_harness(config, tokenizer)
            policy = EnginePolicy(engine, fmt, temperature=float(ev["temperature"]), seed=seed)
            grade_fn = GradeCache(grade_validated) if rl["grade_cache"] else grade_validated
            rows = evaluate_agent(tasks, harness, policy, k=eval_samples(ev), max_in_flight=int(ev["max_in_flight"]),
                                  grade_fn=grade_fn)
            if isinstance(grade_fn, GradeCache):
                atomic_write_json(os.path.join(out_dir, "grade_cache.json"), grade_fn.stats())
        finally:
            engine.shutdown()
        atomic_write_json(rows_path, rows, default=str)
    res = summarize_agent(rows, ks=(1, int(ev["k"])), seed=seed)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    return {"rows": rows, "results": res}
