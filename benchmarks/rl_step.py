"""Throughput and time breakdown of the synchronous RL step (`c2jax.train.rl_step.rl_step`).

    python benchmarks/rl_step.py [--quick] [--groups 2,4,8] [--tasks-per-step 1,2,4] [--steps 2]
                                 [--slots 32] [--checkpoint DIR] [--out runs/bench/rl_step.json]

Builds ONE context the way the ``rl`` stage does (`c2jax.train.rl.run_rl`): Engine (``--slots``
cache rows), EnginePolicy, the harness of ``--config``'s ``agent`` section (default: the
rl_quickstart agent), a SandboxPool, the learner (`make_learner`) and the frozen reference policy.
The model is the rl_quickstart ``default`` preset's ``config.model`` shape with random init, or
``--checkpoint DIR`` (a serving checkpoint, `load_serving_checkpoint`). The tokenizer is the
checkpoint's, ``--tokenizer PATH``, or a byte-level BPE trained in-process on a few stdlib modules
(deterministic; only prompt lengths depend on it). Tasks: toyfix at difficulty 1 (``--difficulty``),
built once and cached under ``--tasks-dir``.

Baseline: there is no external system computing the same thing (no other RL step runs this harness,
engine and grader), so no speed ratio against another implementation is claimed. Every figure is
an absolute rate of this code on this machine, and the scaling ratios compare cells of the SAME
step function with the same model, engine slots and harness settings; only group size and tasks
per step differ between them.

Then, for every (group_size, tasks_per_step) cell of the grid: 1 warm-up step, then ``--steps``
timed steps. A timed step during which JAX compiled anything (a new engine attention window or
prefill bucket, a new learner row bucket) is reported separately and replaced by another step, up
to ``--retries`` extra steps per cell; cells whose medians still include a compile are flagged '*'.
Compile time (JAX trace + lower + backend compile, summed from `jax.monitoring` events) and the
warm-up step are reported separately. The engine's slot count and ``rl.max_in_flight`` stay fixed
(``--slots``) across the grid, so cells compare steps, not compiles.

Tasks: one single-epoch `TaskStream` over the whole run (seeded permutation of the train split),
so every step of every cell gets fresh tasks and no task is ever rolled out twice in the run
(the split is built with enough tasks for the whole grid including retries).

Per cell (median over the timed steps of each per-step quantity):
  rollouts/s        rollouts in the step / step wall time (end to end)
  sampled tok/s     policy (sampled) tokens of graded rollouts / rollout time  (``tokens/policy``)
  learner tok/s     loss tokens / learner update time (``tokens/learner`` / ``time/learner_s``)
  time breakdown    rollout, grading (sum over rollouts; they overlap, so it can exceed rollout),
                    diagnostics (learner + reference logprobs, mismatch), learner update, weight
                    publish, other (pad_batch, masking), step total  -- the ``time/*`` metrics
then a scaling summary: each rate as a ratio to the smallest cell, along group size at fixed
tasks_per_step and along tasks_per_step at fixed group size.

The learner state carries over from cell to cell (versions keep increasing; ``max_staleness`` 0:
the engine gets the new weights every step, as in the stage). ``--quick`` is a small grid (group
2,4 x tasks 1,2, 2 timed steps, 8 slots, at most 2 turns of 48 tokens) that keeps a JAX persistent
compilation cache under runs/cache/jax_bench_rl_step (``--compile-cache ''`` disables it): on 2 CPU
cores the first run spends ~4 minutes compiling (the learner recompiles for every rollouts-per-step
count: `pad_batch` is called with max_trajectories = G x T), a rerun ~2-3 minutes in all.
``--dry-run`` is the tiny smoke shape the tests use (one cell, one timed step, numbers meaningless).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_CONFIG = "experiments/configs/rl_quickstart.py"
TIME_KEYS = (("rollout", "time/rollout_s"), ("grading", "time/grading_s_sum"), ("diag", "time/diagnostics_s"),
             ("learner", "time/learner_s"), ("publish", "time/publish_s"), ("step", "time/step_s"))


# ---- compile accounting ----------------------------------------------------------------------
class CompileClock:
    """Seconds JAX spent tracing, lowering and compiling (all threads), from jax.monitoring events."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self) -> None:
        from jax import monitoring

        self.total = 0.0
        self.count = 0
        self._lock = threading.Lock()
        monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, **_: Any) -> None:
        if event in self.EVENTS:
            with self._lock:
                self.total += float(duration)
                self.count += event.endswith("backend_compile_duration")

    def read(self) -> tuple[float, int]:
        with self._lock:
            return self.total, self.count


# ---- setup -----------------------------------------------------------------------------------
def load_config(spec: str) -> Any:
    """`get_config(arg)` of an experiment file given as ``PATH[:arg]``."""
    path, _, arg = spec.partition(":")
    s = importlib.util.spec_from_file_location("_c2jax_bench_rl_step_config", path)
    mod = importlib.util.module_from_spec(s)
    assert s.loader is not None
    s.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def bench_tokenizer(vocab_size: int):
    """Deterministic byte-level BPE over a few stdlib packages and the tool names (a few seconds)."""
    import sysconfig

    from c2jax.agent.tools import SCHEMAS
    from c2jax.data.tokenizer import train_tokenizer

    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for pkg in ("json", "email", "http", "logging", "unittest", "asyncio"):
        for f in sorted(glob.glob(os.path.join(stdlib, pkg, "*.py"))):
            with open(f, encoding="utf-8") as fh:
                texts.append(fh.read())
    texts += [f"functions.{n}:{i}" for n in SCHEMAS for i in range(3)] * 5
    return train_tokenizer(texts, vocab_size=vocab_size)


def grid(args) -> list[tuple[int, int]]:
    return [(g, t) for t in args.tasks_per_step for g in args.groups]


def tasks_needed(args) -> int:
    return sum((1 + args.steps + args.retries) * t for _, t in grid(args))


def build_tasks(args) -> tuple[list, str]:
    from c2jax.envs.synth.toyfix import build_toyfix
    from c2jax.envs.tasks import load_tasks

    n = args.n_train or max(16, -(-tasks_needed(args) // 16) * 16)
    d = args.tasks_dir or os.path.join("runs", "cache", "tasks", f"bench_rl_step-toyfix-d{args.difficulty}-n{n}"
                                                                  f"-s{args.seed}")
    info = build_toyfix(d, n_train=n, n_eval=0, n_demo=0, difficulty=args.difficulty, seed=args.seed, workers=2)
    return load_tasks(info["train"]), d


def build_context(args, config: Any, rl: dict):
    import jax
    import numpy as np

    from c2jax.agent.policies import EnginePolicy
    from c2jax.envs import SandboxPool
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.train.rl_family import make_harness
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.rl_step import RLContext
    from c2jax.train.state import TrainState

    if args.checkpoint:
        from c2jax.sampling.checkpoint import load_serving_checkpoint

        params, cfg, tok = load_serving_checkpoint(args.checkpoint, tokenizer=args.tokenizer)
        model_src = f"checkpoint {args.checkpoint}"
    else:
        from c2jax.data.tokenizer import Tokenizer
        from c2jax.model import init
        from c2jax.train.pretrain import base_model_config

        cfg = base_model_config(config)
        params = init(cfg, jax.random.PRNGKey(args.seed))
        tok = Tokenizer.load(args.tokenizer) if args.tokenizer else bench_tokenizer(cfg.vocab_size)
        model_src = f"random init ({args.config} config.model)"
    if tok.vocab_size > cfg.vocab_size:
        raise SystemExit(f"tokenizer has {tok.vocab_size} ids > model vocab_size {cfg.vocab_size}")
    if int(rl["max_len"]) > cfg.max_position_embeddings:
        raise SystemExit(f"rl.max_len {rl['max_len']} > model.max_position_embeddings {cfg.max_position_embeddings}")
    params = jax.tree_util.tree_map(jax.numpy.asarray, params)
    learner = make_learner(cfg, rl, params)
    state = TrainState.create(params, learner.tx)
    engine = Engine(params, cfg, EngineConfig(max_slots=int(rl["max_in_flight"]), max_len=int(rl["max_len"]),
                                              recompute_cache_on_update=True), tokenizer=tok, version=0)
    harness, fmt = make_harness(config, tok)
    policy = EnginePolicy(engine, fmt, temperature=float(rl["temperature"]), top_p=float(rl["top_p"]), seed=args.seed)
    pool = SandboxPool(max_concurrency=int(rl["max_in_flight"]))
    ref = params if rl["reference"] == "init" else None
    ctx = RLContext(rl=rl, learner=learner, engine=engine, policy=policy, harness=harness, pool=pool,
                    ref_params=ref, seed=args.seed)
    n_params = int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
    model = {"source": model_src, "params": n_params, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
             "vocab_size": cfg.vocab_size, "tokenizer_vocab": tok.vocab_size}
    return ctx, state, model


# ---- one step --------------------------------------------------------------------------------
def run_one(ctx, state, tasks, step: int, version: int, engine_version: int, clock: CompileClock) -> tuple:
    from c2jax.train.rl_step import rl_step

    st0 = dict(ctx.engine.stats)
    c0, n0 = clock.read()
    t0 = time.monotonic()
    out = rl_step(ctx, state, tasks, step=step, version=version, engine_version=engine_version)
    wall = time.monotonic() - t0
    c1, n1 = clock.read()
    m = out.metrics
    est = {k: float(ctx.engine.stats.get(k, 0) - st0.get(k, 0))
           for k in ("decode_steps", "generated_tokens", "prefill_tokens", "recomputed_tokens")}
    t = {name: float(m.get(key, 0.0)) for name, key in TIME_KEYS}
    t["other"] = t["step"] - t["rollout"] - t["diag"] - t["learner"] - t["publish"]
    rec = {
        "step": step, "tasks": [x.instance_id for x in tasks], "wall_s": wall,
        "compile_s": c1 - c0, "compiles": n1 - n0, "time": t,
        "rollouts": float(m.get("rollouts/total", 0.0)), "graded": float(m.get("rollouts/graded", 0.0)),
        "masked": float(m.get("rollouts/masked", 0.0)),
        "policy_tokens": float(m.get("tokens/policy", 0.0)), "learner_tokens": float(m.get("tokens/learner", 0.0)),
        "learner_rows": float(m.get("learner/rows", 0.0)), "pass_rate": m.get("pass_rate"),
        "turns_mean": m.get("effort/turns"), "tool_calls_mean": m.get("tools/calls_mean"), "engine": est,
        # rollouts that edited nothing: graded without a test run (rl_rollouts.grade_validated), so they cost
        # no grading time; a random-init policy makes no edits, use --checkpoint for realistic grading cost
        "empty_diff": sum("empty_diff" in ((x.trajectory.metadata.get("grade") or {}).get("flags") or [])
                          for x in out.samples),
        "masked_reasons": {k: v for k, v in m.items() if k.startswith("masked/")},
    }
    rec["rates"] = {
        "rollouts_per_s": rec["rollouts"] / t["step"] if t["step"] > 0 else 0.0,
        "sampled_tok_per_s": rec["policy_tokens"] / t["rollout"] if t["rollout"] > 0 else 0.0,
        "learner_tok_per_s": rec["learner_tokens"] / t["learner"] if t["learner"] > 0 else 0.0,
        "engine_batch": est["generated_tokens"] / est["decode_steps"] if est["decode_steps"] else 0.0,
    }
    return out, rec


def median_of(recs: list[dict], path: tuple[str, ...]) -> float:
    vals = []
    for r in recs:
        v = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return float(statistics.median(vals)) if vals else float("nan")


def run_grid(args, ctx, state, tasks: list, clock: CompileClock) -> list[dict]:
    from c2jax.train.rl_tasks import TaskStream

    stream = TaskStream(tasks, seed=args.seed, upsample_after_step=None)
    step = version = engine_version = 0
    cells = []
    for g, tps in grid(args):
        ctx.rl["group_size"] = g
        ctx.rl["tasks_per_step"] = tps
        cell: dict[str, Any] = {"group_size": g, "tasks_per_step": tps, "rollouts_per_step": g * tps}
        timed: list[dict] = []
        compiled: list[dict] = []
        attempt = 0
        while len(timed) < args.steps and attempt < 1 + args.steps + args.retries:
            out, rec = run_one(ctx, state, stream.take(tps, step), step, version, engine_version, clock)
            state, version, engine_version = out.state, out.version, out.engine_version
            step += 1
            if attempt == 0:
                cell["warmup"] = rec
            elif rec["compiles"] and len(timed) + (1 + args.steps + args.retries - attempt - 1) >= args.steps:
                compiled.append(rec)  # a retry is still possible: set it aside
            else:
                timed.append(rec)
            attempt += 1
            print(f"  G={g} T={tps} step {'warm-up' if attempt == 1 else attempt - 1}: {rec['time']['step']:.1f}s "
                  f"(compile {rec['compile_s']:.1f}s), {int(rec['rollouts'])} rollouts, "
                  f"{int(rec['policy_tokens'])} sampled tok, {int(rec['learner_tokens'])} learner tok, "
                  f"{rec['empty_diff']} with an empty diff (no test run)",
                  flush=True)
        cell["timed_steps"] = timed
        cell["compiled_steps_set_aside"] = compiled
        cell["compile_in_timed"] = any(r["compiles"] for r in timed)
        cell["median"] = {
            "rates": {k: median_of(timed, ("rates", k)) for k in timed[0]["rates"]},
            "time": {k: median_of(timed, ("time", k)) for k in timed[0]["time"]},
            "compile_s": median_of(timed, ("compile_s",)),
            "policy_tokens": median_of(timed, ("policy_tokens",)),
            "learner_tokens": median_of(timed, ("learner_tokens",)),
            "learner_rows": median_of(timed, ("learner_rows",)),
        }
        cells.append(cell)
    return cells, state


# ---- report ----------------------------------------------------------------------------------
RATES = (("rollouts_per_s", "rollouts/s"), ("sampled_tok_per_s", "sampled tok/s"),
         ("learner_tok_per_s", "learner tok/s"))


def table(cells: list[dict]) -> str:
    head = (f"{'G':>3} {'T':>3} {'roll':>5} | {'roll/s':>7} {'samp tok/s':>10} {'lrn tok/s':>10} {'eng bat':>7} | "
            f"{'rollout':>7} {'grading':>7} {'diag':>6} {'learner':>7} {'publish':>7} {'other':>6} {'step':>7} | "
            f"{'warm-up':>7} {'compile':>7}")
    lines = [head, "-" * len(head)]
    for c in cells:
        m, w = c["median"], c["warmup"]
        r, t = m["rates"], m["time"]
        flag = "*" if c["compile_in_timed"] else " "
        lines.append(
            f"{c['group_size']:>3} {c['tasks_per_step']:>3} {c['rollouts_per_step']:>5} | {r['rollouts_per_s']:>7.2f} "
            f"{r['sampled_tok_per_s']:>10.1f} {r['learner_tok_per_s']:>10.1f} {r['engine_batch']:>7.1f} | "
            f"{t['rollout']:>7.2f} {t['grading']:>7.2f} {t['diag']:>6.2f} {t['learner']:>7.2f} {t['publish']:>7.2f} "
            f"{t['other']:>6.2f} {t['step']:>7.2f}{flag}| {w['time']['step']:>7.1f} {w['compile_s']:>7.1f}")
    return "\n".join(lines)


def scaling(cells: list[dict]) -> dict:
    """Each rate as a ratio to the smallest cell along each axis."""
    by = {(c["group_size"], c["tasks_per_step"]): c["median"]["rates"] for c in cells}
    gs = sorted({g for g, _ in by})
    ts = sorted({t for _, t in by})
    out: dict[str, Any] = {"group_size": {}, "tasks_per_step": {}}
    for t in ts:
        base = by.get((gs[0], t))
        out["group_size"][f"T={t}"] = {f"G={g}": {k: (by[(g, t)][k] / base[k] if base and base[k] else None)
                                                  for k, _ in RATES} for g in gs if (g, t) in by}
    for g in gs:
        base = by.get((g, ts[0]))
        out["tasks_per_step"][f"G={g}"] = {f"T={t}": {k: (by[(g, t)][k] / base[k] if base and base[k] else None)
                                                      for k, _ in RATES} for t in ts if (g, t) in by}
    return out


def scaling_text(sc: dict) -> str:
    def fmt(d):
        return "/".join("-" if d[k] is None else f"{d[k]:.2f}" for k, _ in RATES)

    lines = ["ratios rollouts/s / sampled tok/s / learner tok/s, each to the smallest cell on the axis:"]
    for axis, label in (("group_size", "group size at fixed tasks_per_step"),
                        ("tasks_per_step", "tasks_per_step at fixed group size")):
        lines.append(f"  along {label}:")
        for fixed, row in sc[axis].items():
            lines.append(f"    {fixed}: " + "   ".join(f"{k} {fmt(v)}" for k, v in row.items()))
    return "\n".join(lines)


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=ints, default=None, help="group sizes (default 2,4,8)")
    ap.add_argument("--tasks-per-step", type=ints, default=None, help="tasks per step (default 1,2,4)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per cell, median reported (default 2)")
    ap.add_argument("--retries", type=int, default=None, help="extra steps per cell replacing steps that compiled")
    ap.add_argument("--slots", type=int, default=None, help="engine slots = rl.max_in_flight, fixed over the grid")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="PATH[:preset] giving model shape, agent and rl keys")
    ap.add_argument("--checkpoint", default=None, help="serving checkpoint dir (default: random init)")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--n-train", type=int, default=0, help="train tasks to build (default: enough for the grid)")
    ap.add_argument("--tasks-dir", default=None, help="toyfix suite dir (default runs/cache/tasks/bench_rl_step-...)")
    ap.add_argument("--max-turns", type=int, default=None, help="override agent.max_turns")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override agent.max_new_tokens (per turn)")
    ap.add_argument("--compile-cache", default=None,
                    help="JAX persistent compilation cache dir: a rerun loads instead of compiling (the compile "
                         "column then shows load time)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="~2-3 minute grid")
    ap.add_argument("--dry-run", action="store_true", help="tiny smoke run (tests): one cell, one step")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.dry_run:
        preset = dict(groups=[2], tasks_per_step=[1], steps=1, retries=0, slots=4, max_turns=1, max_new_tokens=8)
        if args.config == DEFAULT_CONFIG:
            args.config = DEFAULT_CONFIG + ":smoke"
    elif args.quick:
        preset = dict(groups=[2, 4], tasks_per_step=[1, 2], steps=2, retries=1, slots=8, max_turns=2,
                      max_new_tokens=48, compile_cache=os.path.join("runs", "cache", "jax_bench_rl_step"))
    else:
        preset = dict(groups=[2, 4, 8], tasks_per_step=[1, 2, 4], steps=2, retries=2, slots=32)
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.compile_cache = args.compile_cache or None  # --compile-cache '' turns --quick's default off
    if args.steps < 1 or (args.steps < 2 and not args.dry_run):
        ap.error("--steps must be >= 2 (a median of at least two timed steps)")
    if args.slots < 1 or min(args.groups) < 1 or min(args.tasks_per_step) < 1:
        ap.error("--slots, --groups and --tasks-per-step must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    import jax

    from c2jax.train.rl import resolved_rl

    from c2jax.compile_cache import enable_compile_cache

    enable_compile_cache(args.compile_cache, min_compile_time_s=0.0)
    clock = CompileClock()
    config = load_config(args.config)
    if args.max_turns is not None:
        config.agent.max_turns = args.max_turns
    if args.max_new_tokens is not None:
        config.agent.max_new_tokens = args.max_new_tokens
    config.rl.max_in_flight = args.slots
    config.rl.max_staleness = 0
    rl = resolved_rl(config)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cores); config {args.config}; "
          f"grid G={args.groups} x T={args.tasks_per_step}, 1 warm-up + {args.steps} timed steps per cell "
          f"(+{args.retries} retries), {args.slots} engine slots", flush=True)
    t0 = time.monotonic()
    tasks, tasks_dir = build_tasks(args)
    tasks_s = time.monotonic() - t0
    if len(tasks) < tasks_needed(args):
        raise SystemExit(f"{len(tasks)} train tasks < {tasks_needed(args)} needed (raise --n-train)")
    print(f"tasks: {len(tasks)} toyfix d{args.difficulty} train tasks in {tasks_dir} ({tasks_s:.1f}s); "
          f"single-epoch stream: no task repeats in the run", flush=True)
    t0 = time.monotonic()
    c0, _ = clock.read()
    ctx, state, model = build_context(args, config, rl)
    setup_s, setup_compile_s = time.monotonic() - t0, clock.read()[0] - c0
    print(f"model: {model}; context built in {setup_s:.1f}s (compile {setup_compile_s:.1f}s)", flush=True)
    try:
        cells, state = run_grid(args, ctx, state, tasks, clock)
    finally:
        ctx.engine.shutdown()
        ctx.pool.close()
    sc = scaling(cells)
    print("\n== RL step: median over timed steps (times in s per step) ==")
    print(table(cells))
    print("roll = rollouts per step (G x T); roll/s = rollouts / step time; samp tok/s = sampled policy tokens / "
          "rollout time;\nlrn tok/s = loss tokens / learner time; eng bat = mean sequences per engine decode step; "
          "grading = sum over rollouts\n(concurrent); other = pad_batch + masking; warm-up = first step of the cell "
          "(compile = JAX compile s in it);\n* = a timed step still included a compile")
    print("\n== scaling ==")
    print(scaling_text(sc))
    total_s = time.monotonic() - t_start
    print(f"\ntotal {total_s:.0f}s (tasks {tasks_s:.0f}s, context {setup_s:.0f}s, total JAX compile "
          f"{clock.read()[0]:.0f}s)")
    if args.out:
        res = {
            "command": " ".join([os.path.basename(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv))),
            "args": vars(args), "platform": jax.devices()[0].platform, "cpu_count": os.cpu_count(),
            "model": model, "rl": {k: rl[k] for k in ("max_len", "max_in_flight", "max_staleness", "temperature",
                                                      "router_replay", "replay_metrics", "reference")},
            "agent": {"max_turns": config.agent.max_turns, "max_new_tokens": config.agent.max_new_tokens,
                      "max_policy_tokens": config.agent.max_policy_tokens},
            "tasks": {"dir": tasks_dir, "n_train": len(tasks), "difficulty": args.difficulty, "fresh": True,
                      "repeats_in_run": False},
            "setup": {"tasks_s": tasks_s, "context_s": setup_s, "context_compile_s": setup_compile_s},
            "compile_total_s": clock.read()[0], "total_s": total_s,
            "cells": cells, "scaling": sc,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
