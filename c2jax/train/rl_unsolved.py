"""Which held-out toyfix tasks a policy never solves, by bug kind, and whether a demonstrator covers them.

Best-of-k can only rise on tasks where the policy sometimes succeeds; a task solved in none of its
samples gives the policy gradient nothing to reinforce. This tool lists a `bench run` evaluation's
never-solved tasks, writes their records (to resample them with a larger k), and tabulates them by bug
kind (the operator change of the task's gold fix), whether the cold start's `shell_locate`
demonstrator can demonstrate them, and, given a resampled run, the successes per task:

    python -m c2jax.train.rl_unsolved --eval runs/rl/rl/eval_before --family runs/cache/tasks/toyfix-d0-... \
        --out never.jsonl
    python -m c2jax.bench run --suite never.jsonl --policy engine --checkpoint runs/rl/rl/policy_init --k 64 ...
    python -m c2jax.train.rl_unsolved --eval runs/rl/rl/eval_before --family ... --resampled runs/never64
"""
from __future__ import annotations

import argparse
import difflib
import os
from collections import defaultdict
from typing import Any, Sequence

from c2jax.bench.agent_eval import load_rows
from c2jax.envs.tasks import TaskRecord, load_tasks, write_tasks


def solved_counts(rows: Sequence[dict]) -> dict[str, tuple[int, int]]:
    """instance id -> (resolved samples, samples); masked samples count as failures."""
    return {r["instance_id"]: (sum(1 for s in r["samples"] if s.get("resolved") and not s.get("masked")),
                               len(r["samples"])) for r in rows}


def bug_kind(task: TaskRecord) -> str:
    """The gold fix's change, token by token: e.g. `-= -> +=`, `+ -> *` (`?` if the task has no
    single-line bug record)."""
    bugs = task.provenance.get("bugs") or []
    if len(bugs) != 1 or "old" not in bugs[0] or "new" not in bugs[0]:
        return "?"
    a, b = bugs[0]["old"].split(), bugs[0]["new"].split()
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            return f"{' '.join(a[i1:i2]) or '(none)'} -> {' '.join(b[j1:j2]) or '(none)'}"
    return "?"


def unsolved_table(tasks: Sequence[TaskRecord], rows: Sequence[dict], resampled: Sequence[dict] = (),
                   style: str = "shell_locate") -> list[dict]:
    """One entry per bug kind among the tasks solved in none of their samples: kind, tasks,
    demonstrable (by `style`), and the per-task successes / samples of `resampled` (if given)."""
    from c2jax.envs.synth.toyfix_shell_demos import applies

    by_id = {t.instance_id: t for t in tasks}
    again = solved_counts(resampled)
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"tasks": [], "demonstrable": 0, "resampled": []})
    for iid, (ok, n) in solved_counts(rows).items():
        if ok or not n or iid not in by_id:
            continue
        t = by_id[iid]
        g = groups[bug_kind(t)]
        g["tasks"].append(iid)
        g["demonstrable"] += int(applies(t, style))
        if iid in again:
            g["resampled"].append(again[iid])
    out = [{"kind": k, "n": len(g["tasks"]), **g} for k, g in groups.items()]
    return sorted(out, key=lambda e: (-e["n"], e["kind"]))


def format_table(table: Sequence[dict]) -> str:
    lines = ["| bug kind | never solved | demonstrable | resampled: solved / samples per task |", "|---|---|---|---|"]
    for e in table:
        res = ", ".join(f"{ok}/{n}" for ok, n in e["resampled"]) or "-"
        lines.append(f"| `{e['kind']}` | {e['n']} | {e['demonstrable']} | {res} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2jax.train.rl_unsolved", description=__doc__.split("\n")[0])
    ap.add_argument("--eval", required=True, help="a bench run output directory or an RL stage's evaluation directory")
    ap.add_argument("--family", required=True, help="the toyfix family directory (eval.jsonl, train.jsonl)")
    ap.add_argument("--split", default="eval", choices=("eval", "train"))
    ap.add_argument("--out", help="write the never-solved task records here (a suite for bench run)")
    ap.add_argument("--resampled", help="a bench run output directory over those tasks (larger k)")
    ap.add_argument("--style", default="shell_locate")
    args = ap.parse_args(argv)
    tasks = load_tasks(os.path.join(args.family, f"{args.split}.jsonl"))
    rows = load_rows(args.eval)[0]
    table = unsolved_table(tasks, rows, load_rows(args.resampled)[0] if args.resampled else (), args.style)
    never = {i for e in table for i in e["tasks"]}
    print(f"{len(never)} of {len(rows)} tasks solved in none of their samples")
    print(format_table(table))
    if args.out:
        write_tasks(args.out, [t for t in tasks if t.instance_id in never])
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
