"""c2bench command line.

    python -m c2jax.bench prefetch [--cache DIR]                       # pinned sdists (registry)
    python -m c2jax.bench build --suite c2bench-mini|c2bench|toyfix --out DIR [--workers N] [--seed S]
                                [--from-checkpoints]          # resumes; or assembles what is done
    python -m c2jax.bench run --suite DIR|tasks.jsonl --policy oracle|null [--k K] [--split eval]
                              [--out DIR] [--predictions] [--fresh] [--no-materialize]
    python -m c2jax.bench run --suite S --policy engine --checkpoint DIR --k 8 [--temperature 1.0]
                              [--seed 0] [--max-in-flight 32] [--agent-config experiments/configs/NAME.py[:preset]]
                              --out OUT                  # an agent checkpoint through the harness
    python -m c2jax.bench run --suite S --policy openai --base-url URL [--model NAME] --tokenizer T ...
    python -m c2jax.bench compare OUT_A OUT_B [--k 1,8]   # paired bootstrap pass@k(B) - pass@k(A)
    python -m c2jax.bench pool A1 B1 A2 B2 [--k 1,8]      # the same, pooled over pairs (one per seed)
    python -m c2jax.bench envs --suite DIR|tasks.jsonl [--pypi-cache DIR]   # re-create missing envs
    python -m c2jax.bench convert swebench FILE.jsonl|FILE.json --repos DIR --out DIR
    python -m c2jax.bench convert harbor TASK_DIR [TASK_DIR ...] --out DIR
    python -m c2jax.bench export harbor --suite DIR|tasks.jsonl [--split eval] --out DIR [--org c2jax]
    python -m c2jax.bench heldout --out heldout.json                  # for data.held_out.packages_file
Exit status: 0 ok, 1 the suite misses its targets / a policy misses its expected rate, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def _tasks_path(suite: str, split: str | None) -> str:
    if os.path.isdir(suite):
        return os.path.join(suite, f"{split}.jsonl" if split else "tasks.jsonl")
    return suite


def _run_agent(a) -> int:
    """`run --policy engine|openai`: the agent harness on every task (c2jax.bench.agent_eval)."""
    from c2jax.bench.agent_eval import build_agent, run_agent_suite
    from c2jax.config import ConfigError
    from c2jax.envs.tasks import TaskFormatError, load_tasks

    try:
        tasks = load_tasks(_tasks_path(a.suite, a.split))[: a.limit]
    except (TaskFormatError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 2
    ks = [int(x) for x in a.ks.split(",")] if a.ks else None
    out = a.out or os.path.join(a.suite if os.path.isdir(a.suite) else os.path.dirname(a.suite), f"run-{a.policy}")
    if not a.no_materialize:
        from c2jax.bench.materialize import format_report, materialize_envs, missing_envs
        from c2jax.envs.synth.toyfix import materialize_envs as toyfix_envs

        toyfix_envs(tasks)  # generated tasks: re-created from their records
        if missing_envs(tasks):
            print(format_report(materialize_envs(tasks, pypi_cache=a.pypi_cache)), file=sys.stderr)
    from c2jax.compile_cache import enable_compile_cache

    enable_compile_cache(a.compile_cache)
    try:
        setup = build_agent(a.policy, checkpoint=a.checkpoint, tokenizer=a.tokenizer, model_preset=a.model_preset,
                            base_url=a.base_url, model=a.model, api_key=a.api_key, temperature=a.temperature,
                            top_p=a.top_p, seed=a.seed, max_in_flight=a.max_in_flight, max_slots=a.max_slots,
                            max_len=a.max_len, agent_config=a.agent_config)
    except (ValueError, OSError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pool = None
    t_start = time.monotonic()
    try:
        if a.max_sandboxes:
            from c2jax.envs.pool import SandboxPool

            pool = SandboxPool(max_concurrency=a.max_sandboxes, max_queue=max(256, a.max_in_flight))
        grade_fn = None
        if not a.no_grade_cache:
            from c2jax.envs.grade_cache import GradeCache
            from c2jax.envs.grading import grade

            grade_fn = GradeCache(grade)  # a repeated (task, diff) is graded once (clean verdicts only)
        summary = run_agent_suite(tasks, setup, out, k=a.k, ks=ks, max_in_flight=a.max_in_flight, pool=pool,
                                  grade_fn=grade_fn, resume=not a.fresh, progress=True if sys.stderr.isatty() else None,
                                  title=f"{a.policy} on {os.path.basename(a.suite.rstrip('/'))}",
                                  transcripts=a.transcripts, hold_place_while_grading=a.hold_place_while_grading)
    finally:
        if pool is not None:
            pool.close()
        setup.close()
    print(summary["table"])
    if grade_fn is not None:
        print(f"grading: {grade_fn.stats()} (--no-grade-cache grades every sample)")
    engine = getattr(setup.policy, "engine", None)
    if engine is not None:
        print(engine_line(engine.stats, engine.config.max_slots))
    print(f"wall: {time.monotonic() - t_start:.1f} s (episodes and grading, after loading the policy)")
    print(f"results: {out}/results.json, per-task rows: {out}/tasks.jsonl")
    return 0


def engine_line(stats: dict, slots: int) -> str:
    """How full the engine's batch was: decode steps, mean rows carrying a sequence, prefill calls."""
    steps = int(stats.get("decode_steps", 0))
    rows = stats.get("decode_rows", 0) / steps if steps else 0.0
    return (f"engine: {steps} decode steps, mean {rows:.1f} of {slots} rows active; "
            f"{int(stats.get('prefill_calls', 0))} prefill calls ({int(stats.get('prefill_tokens', 0))} tokens), "
            f"{int(stats.get('generated_tokens', 0))} tokens generated")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2jax.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prefetch")
    p.add_argument("--cache", default=None)
    p = sub.add_parser("build")
    p.add_argument("--suite", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pypi-cache", default=None)
    p.add_argument("--codebases", nargs="*", default=None)
    p.add_argument("--from-checkpoints", action="store_true",
                   help="assemble from the codebases a killed build finished; build nothing new")
    p = sub.add_parser("run")
    p.add_argument("--suite", required=True, help="a built suite directory or a tasks .jsonl")
    p.add_argument("--policy", required=True)
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--split", choices=("train", "eval"), default=None)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks (after --split)")
    p.add_argument("--out", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--predictions", action="store_true")
    p.add_argument("--pypi-cache", default=None)
    p.add_argument("--fresh", action="store_true",
                   help="ignore the journal of an earlier run into the same --out (default: resume it)")
    p.add_argument("--no-materialize", action="store_true",
                   help="do not re-create missing task environments first (their samples are masked)")
    g = p.add_argument_group("agent policies (engine | openai): c2jax.bench.agent_eval")
    g.add_argument("--checkpoint", help="engine: serving/training checkpoint dir (c2jax.sampling.checkpoint)")
    g.add_argument("--tokenizer", help="tokenizer.json (default: CHECKPOINT/tokenizer.json)")
    g.add_argument("--model-preset", help="engine: model preset for an Orbax checkpoint without model.json")
    g.add_argument("--base-url", help="openai: the endpoint, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", help="openai: model id (default: the endpoint's first)")
    g.add_argument("--api-key", default=None)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0, help="base sampling seed (per sample/turn seeds derive from it)")
    g.add_argument("--max-in-flight", type=int, default=32, help="episodes in flight together")
    g.add_argument("--max-slots", type=int, default=None, help="engine slots (default and minimum: --max-in-flight)")
    g.add_argument("--max-len", type=int, default=8192, help="engine: tokens per context")
    g.add_argument("--max-sandboxes", type=int, default=None,
                   help="bound running sandboxes with a SandboxPool (default: one per episode in flight)")
    g.add_argument("--no-grade-cache", action="store_true",
                   help="grade every sample (default: each distinct (task, diff) once; c2jax.envs.grade_cache)")
    g.add_argument("--agent-config", default=None, help="experiments/configs/NAME.py[:preset]: its config.agent")
    g.add_argument("--hold-place-while-grading", action="store_true",
                   help="the old schedule, as a baseline: an episode keeps its place (engine row) while graded")
    g.add_argument("--compile-cache", default=None,
                   help="engine: JAX persistent compilation cache directory, e.g. runs/cache/xla (the RL stage's "
                        "default), so a repeated evaluation does not compile the engine again (c2jax/compile_cache.py)")
    g.add_argument("--ks", default=None, help="pass@k reported, e.g. 1,8 (default: 1 and --k)")
    g.add_argument("--transcripts", action="store_true",
                   help="also write OUT/transcripts.jsonl: every episode's messages (what the agent did)")
    p = sub.add_parser("compare", help="paired bootstrap of pass@k between two runs (tasks matched by id)")
    p.add_argument("a", help="run A: an --out directory or its results.json; A1+A2 merges the samples of runs of "
                             "the same policy with different --seed (more samples per task)")
    p.add_argument("b", help="run B")
    p.add_argument("--k", default="1,8", help="comma-separated ks (ks above the samples per task are skipped)")
    p.add_argument("--n-boot", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the comparison to this JSON file (default: print "
                                               "only; a run directory is a record and is never written into)")
    p = sub.add_parser("pool", help="paired bootstrap pooled over (A, B) pairs on the same tasks (one per seed)")
    p.add_argument("runs", nargs="+", help="A1 B1 [A2 B2 ...]: --out directories or results.json files "
                                           "(RUN+RUN2 merges the samples of two seeds of one policy)")
    p.add_argument("--k", default="1,8")
    p.add_argument("--n-boot", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p = sub.add_parser("envs", help="check every task's environment; re-create the missing ones")
    p.add_argument("--suite", required=True)
    p.add_argument("--split", choices=("train", "eval"), default=None)
    p.add_argument("--pypi-cache", default=None)
    p = sub.add_parser("convert")
    p.add_argument("format", choices=("swebench", "harbor"))
    p.add_argument("inputs", nargs="+")
    p.add_argument("--repos", default=None)
    p.add_argument("--out", required=True)
    p = sub.add_parser("export", help="write tasks as Harbor task directories")
    p.add_argument("format", choices=("harbor",))
    p.add_argument("--suite", required=True)
    p.add_argument("--split", choices=("train", "eval"), default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--org", default="c2jax", help="package org of tasks that have no Harbor name")
    p = sub.add_parser("heldout")
    p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if a.cmd == "prefetch":
        from c2jax.envs.synth import pypi

        for name, path in pypi.prefetch(a.cache).items():
            print(f"{name}: {path}")
        return 0
    if a.cmd == "heldout":
        from c2jax.envs.synth import heldout

        print(heldout.write(a.out))
        return 0
    if a.cmd == "build":
        from c2jax.bench.build import build_suite
        from c2jax.bench.suites import GENERATED_SUITES, SUITES, format_stats

        if a.suite not in SUITES and a.suite not in GENERATED_SUITES:
            print(f"unknown suite {a.suite!r}; known: {sorted(SUITES) + sorted(GENERATED_SUITES)}", file=sys.stderr)
            return 2
        tasks, stats, report = build_suite(a.suite, a.out, workers=a.workers, seed=a.seed,
                                           pypi_cache=a.pypi_cache, codebases=a.codebases,
                                           checkpoints_only=a.from_checkpoints)
        print(format_stats(stats))
        print(f"wrote {len(tasks)} tasks to {a.out} in {report['wall_s']} s; report: {a.out}/build_report.json")
        for prob in report["problems"]:
            print(f"PROBLEM: {prob}", file=sys.stderr)
        return 1 if report["problems"] else 0
    if a.cmd == "compare":
        from c2jax.bench.agent_eval import compare_runs, format_compare

        try:
            ks = [int(x) for x in a.k.split(",") if x.strip()]
            cmp = compare_runs(a.a, a.b, ks, n_boot=a.n_boot, seed=a.seed)
        except (ValueError, OSError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        text = format_compare(cmp)
        print(text)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(cmp, f, indent=1)
            print(f"written: {a.out}")
        return 0
    if a.cmd == "pool":
        from c2jax.bench.agent_eval import format_compare, pooled_compare_runs

        if len(a.runs) % 2:
            print(f"error: pool takes pairs A1 B1 [A2 B2 ...]; got {len(a.runs)} runs", file=sys.stderr)
            return 2
        try:
            ks = [int(x) for x in a.k.split(",") if x.strip()]
            cmp = pooled_compare_runs(list(zip(a.runs[::2], a.runs[1::2])), ks, n_boot=a.n_boot, seed=a.seed)
        except (ValueError, OSError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(format_compare(cmp))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(cmp, f, indent=1)
            print(f"written: {a.out}")
        return 0
    if a.cmd == "run" and a.policy in ("engine", "openai"):
        return _run_agent(a)
    if a.cmd == "run":
        from c2jax.bench.policies import POLICIES, make_policy
        from c2jax.bench.run import run_suite
        from c2jax.envs.tasks import TaskFormatError, load_tasks

        if a.policy not in POLICIES:
            print(f"unknown policy {a.policy!r}; known: {POLICIES.names()}", file=sys.stderr)
            return 2
        try:
            tasks = load_tasks(_tasks_path(a.suite, a.split))[: a.limit]
        except (TaskFormatError, OSError) as e:
            print(str(e), file=sys.stderr)
            return 2
        out = a.out or os.path.join(a.suite if os.path.isdir(a.suite) else os.path.dirname(a.suite),
                                    f"run-{a.policy}")
        if not a.no_materialize:
            from c2jax.bench.materialize import format_report, materialize_envs, missing_envs
            from c2jax.envs.synth.toyfix import materialize_envs as toyfix_envs

            toyfix_envs(tasks)  # generated tasks: re-created from their records
            if missing_envs(tasks):
                rep = materialize_envs(tasks, pypi_cache=a.pypi_cache)
                print(format_report(rep), file=sys.stderr)
        summary = run_suite(tasks, make_policy(a.policy), out, k=a.k, workers=a.workers,
                            predictions=a.predictions, title=f"{a.policy} on {os.path.basename(a.suite.rstrip('/'))}",
                            progress=sys.stderr.isatty(), resume=not a.fresh)
        print(summary["table"])
        print(f"results: {out}/results.json, {out}/results.png")
        expected = {"oracle": 1.0, "null": 0.0}.get(a.policy)
        got = summary["overall"].get("pass@1")
        if expected is not None and got is not None and abs(got - expected) > 1e-9:
            print(f"PROBLEM: {a.policy} pass@1 {got:.3f} != {expected}", file=sys.stderr)
            return 1
        return 0
    if a.cmd == "envs":
        from c2jax.bench.materialize import format_report, materialize_envs
        from c2jax.envs.tasks import TaskFormatError, load_tasks

        try:
            tasks = load_tasks(_tasks_path(a.suite, a.split))
        except (TaskFormatError, OSError) as e:
            print(str(e), file=sys.stderr)
            return 2
        from c2jax.envs.synth.toyfix import materialize_envs as toyfix_envs

        toy = toyfix_envs(tasks)
        rep = materialize_envs(tasks, pypi_cache=a.pypi_cache)
        rep["recreated"] += toy["recreated"]
        rep["failed"].update(toy["failed"])
        print(format_report(rep))
        return 1 if rep["failed"] else 0
    if a.cmd == "export":
        from c2jax.bench.adapters.harbor_export import export_many
        from c2jax.envs.tasks import TaskFormatError, load_tasks

        try:
            tasks = load_tasks(_tasks_path(a.suite, a.split))
        except (TaskFormatError, OSError) as e:
            print(str(e), file=sys.stderr)
            return 2
        os.makedirs(a.out, exist_ok=True)
        dirs, failed = export_many(tasks, a.out, org=a.org)
        print(json.dumps({"exported": dirs, "not_exported": failed}, indent=1))
        return 1 if failed else 0
    if a.cmd == "convert":
        from c2jax.bench.adapters import convert_harbor, convert_swebench
        from c2jax.envs.tasks import TaskFormatError

        try:
            if a.format == "swebench":
                if len(a.inputs) != 1:
                    print("convert swebench takes one JSONL or JSON-array file", file=sys.stderr)
                    return 2
                tasks, unsupported = convert_swebench(a.inputs[0], a.repos, a.out)
            else:
                tasks, unsupported = convert_harbor(a.inputs, a.out)
        except TaskFormatError as e:
            print(str(e), file=sys.stderr)
            return 2
        print(json.dumps({"converted": [t.instance_id for t in tasks], "unsupported": unsupported}, indent=1))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
