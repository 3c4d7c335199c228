"""c2bench command line.

    python -m c2jax.bench prefetch [--cache DIR]                       # pinned sdists (registry)
    python -m c2jax.bench build --suite c2bench-mini|c2bench|toyfix --out DIR [--workers N] [--seed S]
                                [--from-checkpoints]          # resumes; or assembles what is done
    python -m c2jax.bench run --suite DIR|tasks.jsonl --policy oracle|null [--k K] [--split eval]
                              [--out DIR] [--predictions] [--fresh] [--no-materialize]
    python -m c2jax.bench envs --suite DIR|tasks.jsonl [--pypi-cache DIR]   # re-create missing envs
    python -m c2jax.bench convert swebench FILE.jsonl --repos DIR --out DIR
    python -m c2jax.bench convert harbor TASK_DIR [TASK_DIR ...] --out DIR
    python -m c2jax.bench heldout --out heldout.json                  # for data.held_out.packages_file
Exit status: 0 ok, 1 the suite misses its targets / a policy misses its expected rate, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def _tasks_path(suite: str, split: str | None) -> str:
    if os.path.isdir(suite):
        return os.path.join(suite, f"{split}.jsonl" if split else "tasks.jsonl")
    return suite


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
    p.add_argument("--out", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--predictions", action="store_true")
    p.add_argument("--pypi-cache", default=None)
    p.add_argument("--fresh", action="store_true",
                   help="ignore the journal of an earlier run into the same --out (default: resume it)")
    p.add_argument("--no-materialize", action="store_true",
                   help="do not re-create missing task environments first (their samples are masked)")
    p = sub.add_parser("envs", help="check every task's environment; re-create the missing ones")
    p.add_argument("--suite", required=True)
    p.add_argument("--split", choices=("train", "eval"), default=None)
    p.add_argument("--pypi-cache", default=None)
    p = sub.add_parser("convert")
    p.add_argument("format", choices=("swebench", "harbor"))
    p.add_argument("inputs", nargs="+")
    p.add_argument("--repos", default=None)
    p.add_argument("--out", required=True)
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
        from c2jax.bench.suites import GENERATED_SUITES, SUITES, build_suite, format_stats

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
    if a.cmd == "run":
        from c2jax.bench.policies import POLICIES, make_policy
        from c2jax.bench.run import run_suite
        from c2jax.envs.tasks import TaskFormatError, load_tasks

        if a.policy not in POLICIES:
            print(f"unknown policy {a.policy!r}; known: {POLICIES.names()}", file=sys.stderr)
            return 2
        try:
            tasks = load_tasks(_tasks_path(a.suite, a.split))
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
    if a.cmd == "convert":
        from c2jax.bench.adapters import convert_harbor, convert_swebench
        from c2jax.envs.tasks import TaskFormatError

        try:
            if a.format == "swebench":
                if len(a.inputs) != 1:
                    print("convert swebench takes one JSONL file", file=sys.stderr)
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
