"""Score an agent checkpoint on a c2bench suite through the real harness: k graded episodes per task,
many in flight at once (the sampling engine batches them), pass@k with bootstrap CIs, masked rate.

    rows = evaluate_agent(tasks, Harness(fmt, cfg), EnginePolicy(engine, fmt, seed=0), k=8, max_in_flight=32)
    summary = summarize_agent(rows, ks=(1, 8))     # pass@k [95% CI] overall / per category / per split
    diff = paired_bootstrap_diff(rows_a, rows_b, k=1)   # c2jax.bench.metrics: B - A, tasks paired

Rows are the per-task rows of `c2jax.bench.run` (``{"instance_id", "category", "codebase", "split",
"samples": [...]}``, what `summarize` / `format_table` / the journal use); each sample adds the agent's
details: ``stop_reason``, ``turns``, ``tool_calls``, ``malformed_tool_calls``, ``policy_tokens``,
``summaries``, ``masked_reason``, ``trainable``, ``seed_id``.

Masking in evaluation: a sample is ``masked`` when infrastructure failed (a `SandboxError` while
acting, a sandbox that would not start, a masked grade, or the policy raising, e.g. the endpoint
refused the connection); the reason is kept. Unlike training, a masked sample COUNTS AS A FAILURE
for pass@k (`summarize_agent`), and the masked rate is reported next to it. A stop caused by the
policy (turn / token / wall-clock budgets, the context filling up, a sandbox killed for running past
its lifetime, an engine that rejected an over-long prompt) is never infrastructure: a plain failure.

Concurrency: an asyncio semaphore keeps at most `max_in_flight` episodes in flight; each one takes a
sandbox (from `pool` when given: give it ``max_concurrency >= max_in_flight`` or episodes wait for
sandboxes, and ``max_queue >= max_in_flight`` or they are refused with `PoolFull`, i.e. masked) and
sends its turns to the policy; an `EnginePolicy` puts them all into the engine's continuous batch
(build the engine with ``max_slots >= max_in_flight``). An episode holds its place only while it
solves; its grading then waits for one of another `max_in_flight` grading places, so the next
episode starts on the engine while the grader runs (`c2jax.agent.rollout`, solve_gate / grade_gate).
Sandbox starts, tools and grading run in worker threads: the loop's default executor is given enough
of them.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import concurrent.futures as cf
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Sequence

from c2jax.bench.metrics import pass_at_k
from c2jax.envs.tasks import TaskRecord

log = logging.getLogger(__name__)

POLICY_KILLS = ("lifetime", "timeout", "oom", "pids", "fsize", "disk", "output")  # the agent's own doing


def _infra_error(ep: Any) -> str:
    errs = [e.get("error", "") for e in ep.events if e.get("type") == "infra_error"]
    return errs[-1] if errs else str(ep.trajectory.metadata.get("error", ""))


def sample_row(ep: Any, sample: int) -> dict[str, Any]:
    """One graded episode -> a sample row (the `c2jax.bench.run` sample keys plus agent details)."""
    traj = ep.trajectory
    rt = traj.reward_terms
    meta = traj.metadata
    g = meta.get("grade") or {}
    stop = ep.stop_reason
    masked, reason = False, ""
    if stop == "infra":
        err = _infra_error(ep)
        if any(f"was killed ({k})" in err for k in POLICY_KILLS):
            stop = "sandbox_killed"  # e.g. the sandbox's lifetime ran out under the agent: its failure
        else:
            masked, reason = True, f"infra: {err}"[:500]
    elif g.get("masked"):
        masked, reason = True, "grade: " + ",".join(g.get("flags", []))
    graded = bool(g) and not masked
    resolved = bool(rt.get("resolved", 0.0)) and graded
    return {
        "sample": sample, "resolved": resolved, "reward": float(rt.get("reward", 0.0)) if graded else 0.0,
        "masked": masked, "masked_reason": reason,
        "f2p_fraction": float(rt.get("f2p_fraction", 0.0)) if graded else 0.0,
        "p2p_regressions": int(rt.get("p2p_regressions", 0)) if graded else 0,
        "flags": list(g.get("flags", [])), "tokens": int(traj.num_policy_tokens),
        "policy_tokens": int(traj.num_policy_tokens), "stop_reason": stop, "turns": int(traj.effort.turns),
        "tool_calls": int(traj.effort.tool_calls),
        "malformed_tool_calls": sum(bool(t.malformed) for t in traj.tool_events),
        "summaries": int(meta.get("summaries", 0) or 0), "trainable": bool(meta.get("trainable", False)),
        "solve_s": round(float(meta.get("wall_s", 0.0) or 0.0), 3),
        "grade_s": round(float(g.get("duration_s", 0.0) or 0.0), 3),
        "sample_id": traj.sample_id, "diff": ep.diff or ""}


def _exception_row(task: TaskRecord, sample: int, e: BaseException) -> dict[str, Any]:
    return {"sample": sample, "resolved": False, "reward": 0.0, "masked": True,
            "masked_reason": f"exception: {type(e).__name__}: {e}"[:500], "f2p_fraction": 0.0, "p2p_regressions": 0,
            "flags": [], "tokens": 0, "policy_tokens": 0, "stop_reason": "exception", "turns": 0, "tool_calls": 0,
            "malformed_tool_calls": 0, "summaries": 0, "trainable": False, "solve_s": 0.0, "grade_s": 0.0,
            "sample_id": f"{task.instance_id}#{sample}", "diff": ""}


def task_row(task: TaskRecord, samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"instance_id": task.instance_id, "category": task.category, "codebase": task.codebase,
            "split": task.split, "samples": sorted(samples, key=lambda s: s["sample"])}


def ensure_threads(n: int) -> None:
    """Give the running loop's default executor >= n workers (sandbox starts, tools, grading run in
    `asyncio.to_thread`; the stock executor has min(32, cpus + 4), so pool waits could starve it)."""
    loop = asyncio.get_running_loop()
    ex = getattr(loop, "_default_executor", None)
    if ex is None or getattr(ex, "_max_workers", n) < n:
        loop.set_default_executor(cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="c2jax-agent-eval"))


async def aevaluate_agent(tasks: Sequence[TaskRecord], harness: Any, policy: Any, *, k: int, pool: Any = None,
                          max_in_flight: int = 32, grade_fn: Callable | None = None, progress: Any = None,
                          journal: str | None = None, journal_key: str | None = None,
                          stats: dict | None = None, transcripts: str | None = None,
                          hold_place_while_grading: bool = False) -> list[dict[str, Any]]:
    """k graded episodes per task (`c2jax.agent.rollout.arollout`), at most `max_in_flight` at once.

    Returns per-task rows in task order (see the module docstring). progress: a callable
    ``(tasks_done, tasks_total, row)`` called as each task finishes, or True for a tqdm bar.
    journal: a JSONL file every finished task is appended to; rows of an earlier run with the same
    `journal_key` and k for identical tasks are reused (resume). stats: filled with
    ``max_in_flight_seen`` (the most episodes in flight together) and ``episodes``. transcripts: a
    JSONL file each finished episode's OpenAI-shaped messages are appended to (one line per sample:
    instance_id, sample, resolved, stop_reason, diff, messages: one list per context), to read what
    the agent did. hold_place_while_grading: the schedule before 2026-12-07 (an episode keeps its
    place through grading), kept as the baseline of the comparison in the README.
    """
    from c2jax.agent.rollout import arollout
    from c2jax.bench.run import load_journal, task_digest

    if k < 1 or max_in_flight < 1:
        raise ValueError(f"need k >= 1 and max_in_flight >= 1 (k={k}, max_in_flight={max_in_flight})")
    key = journal_key or getattr(policy, "name", "agent")
    done = load_journal(journal, key, k) if journal else {}
    digests = [task_digest(t) for t in tasks] if journal else [""] * len(tasks)
    rows: list[dict[str, Any] | None] = [done.get((t.instance_id, d)) for t, d in zip(tasks, digests)]
    todo = [i for i, r in enumerate(rows) if r is None]
    ensure_threads(2 * max_in_flight + 8)
    sem = asyncio.Semaphore(max_in_flight)  # episodes solving (sandbox + policy): the engine's batch
    grade_sem = asyncio.Semaphore(max_in_flight)  # graders running; a finished episode frees its solve slot
    st = stats if stats is not None else {}
    st.update(max_in_flight_seen=0, episodes=0, exceptions=0)
    in_flight = 0
    per_task: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    jf = open(journal, "a", encoding="utf-8") if journal else None
    tf = open(transcripts, "a", encoding="utf-8") if transcripts else None
    bar = None
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=key, unit="task")
    n_done = len(tasks) - len(todo)

    def finished(i: int) -> None:
        nonlocal n_done
        rows[i] = task_row(tasks[i], per_task.pop(i))
        n_done += 1
        if jf is not None:
            jf.write(json.dumps({"policy": key, "k": k, "instance_id": tasks[i].instance_id,
                                 "task_digest": digests[i], "row": rows[i]}) + "\n")
            jf.flush()
            os.fsync(jf.fileno())
        if bar is not None:
            bar.update(1)
        elif callable(progress):
            progress(n_done, len(tasks), rows[i])
        else:
            log.info("%s: %d/%d %s resolved=%s", key, n_done, len(tasks), tasks[i].instance_id,
                     [s["resolved"] for s in rows[i]["samples"]])

    @contextlib.asynccontextmanager
    async def solving():
        nonlocal in_flight
        async with sem:
            in_flight += 1
            st["max_in_flight_seen"] = max(st["max_in_flight_seen"], in_flight)
            try:
                yield
            finally:
                in_flight -= 1

    async def one(i: int, s: int) -> None:
        task = tasks[i]
        try:
            if hold_place_while_grading:
                async with solving():
                    ep = await arollout(harness, policy, task, pool=pool, sample=s, grade_fn=grade_fn)
            else:
                ep = await arollout(harness, policy, task, pool=pool, sample=s, grade_fn=grade_fn,
                                    solve_gate=solving(), grade_gate=grade_sem)
            row = sample_row(ep, s)
            if tf is not None:
                tf.write(json.dumps({"instance_id": task.instance_id, "sample": s, "resolved": row["resolved"],
                                     "stop_reason": row["stop_reason"], "diff": row["diff"],
                                     "messages": ep.messages}) + "\n")
                tf.flush()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the policy/endpoint failed: masked, reported
            log.warning("%s#%d: %s: %s", task.instance_id, s, type(e).__name__, e)
            st["exceptions"] += 1
            row = _exception_row(task, s, e)
        st["episodes"] += 1
        per_task[i].append(row)
        if len(per_task[i]) == k:
            finished(i)

    try:
        # sample-major order: the first sample of every task starts before any task's second one
        await asyncio.gather(*(one(i, s) for s in range(k) for i in todo))
    finally:
        if bar is not None:
            bar.close()
        if jf is not None:
            jf.close()
        if tf is not None:
            tf.close()
    if todo and st["exceptions"] == len(todo) * k:
        raise RuntimeError("every episode raised (see the masked_reason of any sample): "
                           + rows[todo[0]]["samples"][0]["masked_reason"])
    return [r for r in rows if r is not None]


def evaluate_agent(tasks: Sequence[TaskRecord], harness: Any, policy: Any, *, k: int, **kw: Any) -> list[dict]:
    """Synchronous `aevaluate_agent` (not from inside a running event loop)."""
    return asyncio.run(aevaluate_agent(tasks, harness, policy, k=k, **kw))


# ---- summaries ------------------------------------------------------------------------------------

def as_eval_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows where a masked sample is an unresolved live one (evaluation: infra failure = failure)."""
    return [dict(r, samples=[dict(s, masked=False, resolved=bool(s["resolved"]) and not s.get("masked"))
                             for s in r["samples"]]) for r in rows]


def _agent_block(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    samples = [s for r in rows for s in r["samples"]]
    n = len(samples)
    masked = [s for s in samples if s.get("masked")]
    reasons = collections.Counter(s.get("masked_reason", "").split(":")[0] or "?" for s in masked)
    stops = collections.Counter(s.get("stop_reason", "?") for s in samples)
    mean = lambda key: (sum(s.get(key, 0) for s in samples) / n) if n else 0.0  # noqa: E731
    calls = sum(s.get("tool_calls", 0) for s in samples)
    return {"samples": n, "masked_samples": len(masked), "masked_rate": len(masked) / n if n else 0.0,
            "masked_reasons": dict(reasons), "all_masked_tasks": sum(
                bool(r["samples"]) and all(s.get("masked") for s in r["samples"]) for r in rows),
            "stop_reasons": dict(stops), "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
            "malformed_tool_call_rate": (sum(s.get("malformed_tool_calls", 0) for s in samples) / calls) if calls
            else 0.0, "mean_policy_tokens": mean("policy_tokens"), "mean_reward": mean("reward"),
            "test_timeouts": timeout_tally(samples)}


def timeout_tally(samples: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How the hidden tests' timeouts were settled (`c2jax.envs.grading._settle_timeout`), from each
    sample's grading flags: `retried` timed out once and finished when graded again (a loaded machine:
    scored as that second run), `policy` timed out again while the gold patch ran in time (scored 0),
    `masked` timed out with the gold patch timing out too (infrastructure). Non-zero `retried` or
    `masked` says the evaluation shared its machine with more than it could run in time."""
    flags = [s.get("flags") or [] for s in samples]
    return {"retried": sum("retried:timeout" in f for f in flags),
            "policy": sum("timeout" in f and "infra:timeout" not in f for f in flags),
            "masked": sum("infra:timeout" in f for f in flags)}


def summarize_agent(rows: Sequence[dict[str, Any]], ks: Sequence[int] = (1, 8), seed: int = 0) -> dict[str, Any]:
    """`c2jax.bench.run.summarize` with masked samples counted as failures (n = all samples), plus per
    block (overall, by_category, by_split): masked_samples / masked_rate / masked reasons, stop
    reasons, mean turns / tool calls / policy tokens, the malformed tool-call rate. pass@k for a k
    larger than a task's samples is left out (as summarize does)."""
    from c2jax.bench.run import summarize

    rows = list(rows)
    out = summarize(as_eval_rows(rows), ks, seed)
    out["overall"].update(_agent_block(rows))
    for c, b in out["by_category"].items():
        b.update(_agent_block([r for r in rows if r["category"] == c]))
    for sp, b in out["by_split"].items():
        b.update(_agent_block([r for r in rows if r.get("split", "train") == sp]))
    out["ks"] = list(ks)
    out["masked_counts_as_failure"] = True
    return out


def format_agent_table(summary: dict[str, Any], ks: Sequence[int]) -> str:
    """`format_table` plus a masked-rate line per group."""
    from c2jax.bench.run import format_table

    lines = [format_table(summary, ks), ""]
    groups = ([("overall", summary["overall"])] + list(summary["by_category"].items())
              + [(f"split:{k}", b) for k, b in summary.get("by_split", {}).items()])
    for name, b in groups:
        lines.append(f"{name}: masked {b['masked_samples']}/{b['samples']} samples ({b['masked_rate']:.1%}, "
                     f"counted as failures); stops {b['stop_reasons']}; tool calls/sample {b['mean_tool_calls']:.1f}, "
                     f"malformed {b['malformed_tool_call_rate']:.1%}"
                     + ("; hidden-test timeouts {retried} retried, {policy} the policy's, {masked} masked".format(
                         **b["test_timeouts"]) if any(b.get("test_timeouts", {}).values()) else ""))
    return "\n".join(lines)


# ---- building the policy for the CLI -----------------------------------------------------------------

def load_experiment_config(spec: str) -> Any:
    """``experiments/configs/NAME.py[:preset]`` -> its ``get_config(preset)`` (FileNotFoundError if absent)."""
    from c2jax.config import load_config_file

    return load_config_file(spec)


def load_agent_config(spec: str | None):
    """`HarnessConfig` from ``experiments/configs/NAME.py[:preset]``'s ``config.agent``, or from a
    JSON file holding that section (an RL run's ``rl/agent.json``: its overrides included); default
    HarnessConfig when `spec` is None or the config has no agent section."""
    from c2jax.agent.config import harness_config_from
    from c2jax.agent.harness import HarnessConfig

    if not spec:
        return HarnessConfig()
    if spec.endswith(".json"):
        with open(spec, encoding="utf-8") as f:
            return harness_config_from(json.load(f))
    config = load_experiment_config(spec)
    section = config.get("agent") if hasattr(config, "get") else getattr(config, "agent", None)
    return harness_config_from(section) if section is not None else HarnessConfig()


@dataclasses.dataclass
class AgentSetup:
    harness: Any
    policy: Any
    key: str  # the journal key: what identifies the policy + sampling settings
    close: Callable[[], None] = lambda: None


def build_agent(policy: str, *, checkpoint: str | None = None, tokenizer: str | None = None,
                model_preset: str | None = None, base_url: str | None = None, model: str | None = None,
                api_key: str | None = None, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = 0,
                max_in_flight: int = 32, max_slots: int | None = None, max_len: int = 8192,
                agent_config: str | None = None) -> AgentSetup:
    """The harness + policy of `python -m c2jax.bench run --policy engine|openai`."""
    from c2jax.agent.harness import Harness
    from c2jax.data.chat_format import ChatFormat

    hcfg = load_agent_config(agent_config)
    settings = {"policy": policy, "temperature": temperature, "top_p": top_p, "seed": seed,
                "agent_config": agent_config, "harness": repr(hcfg)}
    if policy == "engine":
        from c2jax.agent.policies import EnginePolicy
        from c2jax.sampling import Engine, EngineConfig
        from c2jax.sampling.checkpoint import load_serving_checkpoint

        if not checkpoint:
            raise ValueError("--policy engine needs --checkpoint DIR")
        params, cfg, tok = load_serving_checkpoint(checkpoint, tokenizer, model_preset)
        engine = Engine(params, cfg, EngineConfig(max_slots=max(max_slots or 0, max_in_flight), max_len=max_len),
                        tokenizer=tok)
        pol = EnginePolicy(engine, ChatFormat(tok), temperature=temperature, top_p=top_p, seed=seed)
        settings.update(checkpoint=os.path.abspath(checkpoint), max_len=max_len)
        key = "agent-engine:" + json.dumps(settings, sort_keys=True)
        return AgentSetup(Harness(ChatFormat(tok), hcfg), pol, key, engine.shutdown)
    if policy == "openai":
        from c2jax.agent.policies import OpenAIPolicy
        from c2jax.data.tokenizer import Tokenizer

        if not base_url:
            raise ValueError("--policy openai needs --base-url URL")
        tok_path = tokenizer or (os.path.join(checkpoint, "tokenizer.json") if checkpoint else None)
        if not tok_path:
            raise ValueError("--policy openai needs the chat tokenizer: --tokenizer PATH or --checkpoint DIR")
        fmt = ChatFormat(Tokenizer.load(tok_path))
        pol = OpenAIPolicy(base_url=base_url, model=model, api_key=api_key, temperature=temperature, top_p=top_p,
                           seed=seed)
        settings.update(base_url=base_url, model=model)
        return AgentSetup(Harness(fmt, hcfg), pol, "agent-openai:" + json.dumps(settings, sort_keys=True))
    raise ValueError(f"unknown agent policy {policy!r} (engine | openai)")


def run_agent_suite(tasks: Sequence[TaskRecord], setup: AgentSetup, out_dir: str, *, k: int,
                    ks: Sequence[int] | None = None, max_in_flight: int = 32, pool: Any = None,
                    grade_fn: Callable | None = None, resume: bool = True, progress: Any = None,
                    title: str = "", seed: int = 0, transcripts: bool = False,
                    hold_place_while_grading: bool = False) -> dict[str, Any]:
    """Evaluate, summarise, and write ``results.json`` ({"summary", "tasks"}), ``results.txt`` and
    ``tasks.jsonl`` (one per-task row a line: what `compare` pairs), and with `transcripts`
    ``transcripts.jsonl`` (every episode's messages). Finished tasks are journalled in
    ``journal.jsonl``; with `resume` a rerun into the same directory with the same settings reuses them."""
    os.makedirs(out_dir, exist_ok=True)
    ks = sorted({x for x in (ks or (1, k)) if 1 <= x <= k})
    journal = os.path.join(out_dir, "journal.jsonl")
    if not resume and os.path.exists(journal):
        os.remove(journal)
    t0 = time.monotonic()
    stats: dict = {}
    rows = evaluate_agent(tasks, setup.harness, setup.policy, k=k, pool=pool, max_in_flight=max_in_flight,
                          grade_fn=grade_fn, progress=progress, journal=journal, journal_key=setup.key, stats=stats,
                          transcripts=os.path.join(out_dir, "transcripts.jsonl") if transcripts else None,
                          hold_place_while_grading=hold_place_while_grading)
    summary = summarize_agent(rows, ks, seed)
    summary.update(policy=setup.key.split(":", 1)[0], settings=json.loads(setup.key.split(":", 1)[1])
                   if ":" in setup.key else {}, k=k, wall_s=round(time.monotonic() - t0, 2), eval_stats=stats,
                   title=title)
    table = format_agent_table(summary, ks)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"summary": summary, "tasks": rows}, f, indent=1)
    with open(os.path.join(out_dir, "tasks.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write(table + "\n")
    summary["table"] = table
    return summary


def merge_sample_rows(runs: Sequence[list[dict[str, Any]]], names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One run's rows with each task's samples from every run in `runs` (the same policy evaluated with
    different sampling seeds): more samples per task make the unbiased pass@k estimate (and a paired
    difference of it) less noisy. The runs must hold the same tasks; samples are renumbered 0..n-1."""
    ids = [[r["instance_id"] for r in rows] for rows in runs]
    for i, got in enumerate(ids[1:], 1):
        if sorted(got) != sorted(ids[0]):
            name = names[i] if i < len(names) else f"run {i}"
            raise ValueError(f"merge: {name} holds other tasks than the first run "
                             f"({len(set(got) ^ set(ids[0]))} ids differ)")
    by_id = [{r["instance_id"]: r for r in rows} for rows in runs]
    out = []
    for tid in ids[0]:
        samples = [dict(s) for rows in by_id for s in rows[tid]["samples"]]
        for n, s in enumerate(samples):
            s["sample"] = n
        out.append(dict(by_id[0][tid], samples=samples))
    return out


def load_rows(out_dir_or_file: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(per-task rows, summary) of a finished run: a `bench run --out` directory or its results.json,
    or an RL stage's evaluation directory (`runs/rl/rl/eval_before`: rows.json beside results.json).
    `RUN1+RUN2[+...]` (where no such path exists) merges the runs' samples per task
    (`merge_sample_rows`; the summary is the first run's)."""
    path = out_dir_or_file
    if "+" in path and not os.path.exists(path):
        parts = path.split("+")
        loaded = [load_rows(p) for p in parts]
        return merge_sample_rows([rows for rows, _ in loaded], parts), loaded[0][1]
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if "tasks" not in data and os.path.exists(os.path.join(os.path.dirname(path), "rows.json")):
        with open(os.path.join(os.path.dirname(path), "rows.json"), encoding="utf-8") as f:
            return json.load(f), data.get("overall", {})
    return data["tasks"], data.get("summary", {})


def compare_runs(out_a: str, out_b: str, ks: Sequence[int] = (1, 8), n_boot: int = 10000, seed: int = 0,
                 alpha: float = 0.05) -> dict[str, Any]:
    """Paired bootstrap pass@k(B) - pass@k(A) per k (tasks matched by instance_id); ks larger than
    either run's smallest sample count are skipped. (`pooled_compare_runs` with one pair.)"""
    out = pooled_compare_runs([(out_a, out_b)], ks, n_boot=n_boot, seed=seed, alpha=alpha)
    del out["pairs"]
    return dict(out, a=out_a, b=out_b)


def pooled_compare_runs(pairs: Sequence[tuple[str, str]], ks: Sequence[int] = (1, 8), n_boot: int = 10000,
                        seed: int = 0, alpha: float = 0.05) -> dict[str, Any]:
    """`compare_runs` pooled over (A, B) run pairs on the same tasks (one pair per training seed):
    the per-task difference is averaged over the pairs and tasks are resampled
    (`c2jax.bench.metrics.pooled_paired_bootstrap_diff`)."""
    from c2jax.bench.metrics import pooled_paired_bootstrap_diff

    loaded = [(load_rows(a)[0], load_rows(b)[0]) for a, b in pairs]
    nmin = min(len(r["samples"]) for ra, rb in loaded for r in ra + rb) if loaded and all(ra and rb for ra, rb in loaded) else 0
    out: dict[str, Any] = {"a": [a for a, _ in pairs], "b": [b for _, b in pairs], "pairs": len(pairs),
                           "tasks": len(loaded[0][0]) if loaded else 0, "alpha": alpha, "diffs": {},
                           "skipped_ks": [k for k in ks if k > nmin]}
    for k in ks:
        if k <= nmin:
            d = pooled_paired_bootstrap_diff(loaded, k, n_boot=n_boot, seed=seed, alpha=alpha)
            pa = sum(pass_at_k(len(r["samples"]), sum(s["resolved"] and not s["masked"] for s in r["samples"]), k)
                     for ra, _ in loaded for r in ra) / sum(len(ra) for ra, _ in loaded)
            d.update(a=pa, b=pa + d["mean"])
            out["diffs"][f"pass@{k}"] = d
    return out


def format_compare(cmp: dict[str, Any]) -> str:
    pooled = f", pooled over {cmp['pairs']} (A, B) pairs" if "pairs" in cmp else ""
    lines = [f"A = {cmp['a']}", f"B = {cmp['b']}", f"{cmp['tasks']} paired tasks{pooled}; masked samples count as failures"]
    for name, d in cmp["diffs"].items():
        lines.append(f"{name}: A {d['a']:.3f}  B {d['b']:.3f}  B-A {d['mean']:+.3f} "
                     f"[{d['lo']:+.3f}, {d['hi']:+.3f}] ({100 * (1 - cmp['alpha']):.0f}% paired bootstrap over tasks)")
    if cmp["skipped_ks"]:
        lines.append(f"skipped k {cmp['skipped_ks']}: more than the samples per task")
    return "\n".join(lines)


__all__ = ["aevaluate_agent", "evaluate_agent", "summarize_agent", "format_agent_table", "sample_row", "task_row",
           "as_eval_rows", "load_agent_config", "build_agent", "AgentSetup", "run_agent_suite", "load_rows", "merge_sample_rows",
           "compare_runs", "format_compare"]
