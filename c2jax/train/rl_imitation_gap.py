"""Which fix a policy writes on toyfix's imitation-gap variant, against the two reference policies.

On the variant (`rl.tasks.ambiguous=q`, c2jax.envs.synth.toyfix) every task's broken line is
`v = a + b` and the hidden tests want `*` (probability q) or `-`; nothing the agent reads says which.
For an evaluation's samples this counts the operator each one wrote on that line and compares the
pass rate with two policies that write a clean fix every time:

- imitation: `*` with the demonstrations' share of `*` (what imitation of a demonstrator who knows the
  answer converges to), solving share_demo * share_eval + (1 - share_demo) * (1 - share_eval);
- always the likelier fix: `*` every time, solving share_eval.

    python -m c2jax.train.rl_imitation_gap --eval runs/ig_s0/rl/eval_before --family DIR [--eval ...]

(`--eval`: an RL stage's evaluation directory or a `python -m c2jax.bench run --out` directory.)

prints one line per evaluation: samples, the share writing `*` / `-` / anything else, pass@1, pass@1
among the samples that wrote either clean fix, and the two references.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Sequence

_ADDED = re.compile(r"^\+\s+\w+ = \w+ ([-*+/%]|//) \w+\s*$", re.M)


def written_op(diff: str) -> str:
    """The operator the sample's diff puts on the function's assignment line: '*', '-', 'none' (no
    change to it) or 'other' (another operator, or another edit)."""
    if not diff.strip():
        return "none"
    ops = _ADDED.findall(diff)
    if len(ops) == 1 and ops[0] in ("*", "-"):
        return ops[0]
    return "other"


def wanted_op(task: Any) -> str:
    new = task.provenance["bugs"][0]["new"]
    return "*" if " * " in new else "-"


def share_of_mul(tasks: Sequence[Any]) -> float:
    return sum(wanted_op(t) == "*" for t in tasks) / max(1, len(tasks))


def analyse(rows: Sequence[dict], eval_tasks: Sequence[Any], demo_tasks: Sequence[Any]) -> dict:
    """Counts over every sample of `rows` (bench rows.json) on the variant's held-out tasks."""
    want = {t.instance_id: wanted_op(t) for t in eval_tasks}
    counts = {"*": 0, "-": 0, "none": 0, "other": 0}
    n = solved = clean = clean_solved = 0
    for row in rows:
        if row["instance_id"] not in want:
            raise ValueError(f"{row['instance_id']} is not a held-out task of this family")
        for s in row["samples"]:
            op = written_op(s.get("diff") or "")
            counts[op] += 1
            n += 1
            solved += bool(s.get("resolved"))
            if op in ("*", "-"):
                clean += 1
                clean_solved += bool(s.get("resolved"))
    q_demo = share_of_mul(demo_tasks)
    p_eval = sum(want[r["instance_id"]] == "*" for r in rows) / max(1, len(rows))
    return {"samples": n, "share": {k: v / max(1, n) for k, v in counts.items()}, "pass_at_1": solved / max(1, n),
            "pass_at_1_clean": clean_solved / max(1, clean), "clean_samples": clean,
            "demo_share_mul": q_demo, "eval_share_mul": p_eval,
            "imitation_reference": q_demo * p_eval + (1 - q_demo) * (1 - p_eval),
            "likelier_fix_reference": max(p_eval, 1 - p_eval)}


def stage_summary(rl: dict, eval_tasks: Sequence[Any], demo_tasks: Sequence[Any], evals: dict[str, dict]
                  ) -> dict | None:
    """{tag: `analyse` of that evaluation's rows} when the stage's family is the imitation-gap variant
    (`rl.tasks.ambiguous` > 0), else None: what the RL and sft_matched stages write to summary.json."""
    if not rl["tasks"].get("ambiguous"):
        return None
    return {tag: analyse(ev["rows"], eval_tasks, demo_tasks) for tag, ev in evals.items()}


def report_lines(by_policy: dict[str, dict]) -> list[str]:
    """report.md's section: one row per evaluated policy ({tag: `analyse` result})."""
    first = next(iter(by_policy.values()))
    lines = ["## Imitation gap: which fix each sample wrote", "",
             f"References on these held-out tasks: imitation (`*` at the demonstrations' share "
             f"{first['demo_share_mul']:.3f}) {first['imitation_reference']:.3f}, always the likelier fix "
             f"{first['likelier_fix_reference']:.3f}.", "",
             "| policy | samples | writes * | writes - | other | none | pass@1 |", "|---|---|---|---|---|---|---|"]
    for tag, r in by_policy.items():
        sh = r["share"]
        lines.append(f"| {tag} | {r['samples']} | {sh['*']:.3f} | {sh['-']:.3f} | {sh['other']:.3f} | {sh['none']:.3f} "
                     f"| {r['pass_at_1']:.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from c2jax.bench.agent_eval import load_rows
    from c2jax.envs.tasks import load_tasks

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", action="append", required=True, help="a `bench run --out` directory or an RL stage's evaluation directory")
    ap.add_argument("--family", required=True, help="the variant's family directory (eval.jsonl, demo.jsonl)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    ev, demo = load_tasks(os.path.join(a.family, "eval.jsonl")), load_tasks(os.path.join(a.family, "demo.jsonl"))
    res = {}
    for d in a.eval:
        r = analyse(load_rows(d)[0], ev, demo)
        res[d] = r
        sh = r["share"]
        print(f"{d}: {r['samples']} samples; writes * {sh['*']:.3f}, - {sh['-']:.3f}, other {sh['other']:.3f}, "
              f"none {sh['none']:.3f}; pass@1 {r['pass_at_1']:.3f}, among clean fixes {r['pass_at_1_clean']:.3f}; "
              f"references: imitation {r['imitation_reference']:.3f}, likelier fix {r['likelier_fix_reference']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
