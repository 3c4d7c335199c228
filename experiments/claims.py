"""The claims ledger: one entry per testable claim of the Composer 2 report in experiments/claims/.

    python experiments/claims.py list                 # every claim, its scale and command
    python experiments/claims.py run kl_k3_variance   # run it: runs/claims/NAME/{verdict.json, figure}
    python experiments/claims.py run --cheap          # every claim cheap enough for a CPU (seconds-minutes)
    python experiments/claims.py table                # latest verdict of every claim (or "not run")

A verdict (holds / does not hold / inconclusive) is computed from the effect size and its 95% CI;
an entry cannot write its own. Claims marked ``expensive`` or ``needs_gpu`` print their command;
``--force`` runs an expensive one that has a runnable test.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CLAIMS_DIR = os.path.join(ROOT, "experiments", "claims")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join("runs", "claims"), help="verdict directory (default runs/claims)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    sub.add_parser("table")
    r = sub.add_parser("run")
    r.add_argument("names", nargs="*")
    r.add_argument("--cheap", action="store_true", help="run every cheap claim")
    r.add_argument("--force", action="store_true", help="run expensive claims too")
    args = p.parse_args(argv)

    from c2jax.workflow.claims import load_entries, run_claim, table

    entries = load_entries(CLAIMS_DIR)
    if args.cmd == "list":
        for name, mod in entries.items():
            c = mod.CLAIM
            print(f"{name} [{c.scale}{': ' + c.scale_note if c.scale_note else ''}]\n  {c.claim}\n  source: {c.source}"
                  f"\n  metric: {c.metric} (predicted: {c.direction})\n  command: {c.command}"
                  + (f"\n  runs at: {c.run_scale}" if c.run_scale else "")
                  + (f"\n  full scale (not run by the command): {c.full_command}" if c.full_command else "") + "\n")
        return 0
    if args.cmd == "table":
        rows = table(entries, args.out)
        print(f"{'claim':32s} {'scale':10s} {'verdict':14s} {'effect':>10s}  {'95% CI':24s} run at")
        for row in rows:
            print(f"{row['name']:32s} {row['scale']:10s} {row['verdict']:14s} {row['effect']:>10s}  {row['ci95']:24s} "
                  f"{row['run_scale']}")
        return 0
    names = list(args.names)
    if args.cheap:
        names += [n for n, m in entries.items() if m.CLAIM.scale == "cheap" and n not in names]
    unknown = [n for n in names if n not in entries]
    if unknown or not names:
        print(f"error: unknown claim(s) {unknown}; known: {', '.join(entries)}" if unknown else
              "error: name a claim or pass --cheap", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        try:
            v = run_claim(entries[name], args.out, force=args.force)
        except RuntimeError as e:
            print(f"{name}: not run: {e}", file=sys.stderr)
            status = max(status, 3)
            continue
        print(f"{name}: {v.verdict} (effect {v.effect:.4g}, 95% CI [{v.ci95[0]:.4g}, {v.ci95[1]:.4g}], n={v.n}); "
              f"{os.path.join(args.out, name, 'verdict.json')}, figure {v.figure}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
