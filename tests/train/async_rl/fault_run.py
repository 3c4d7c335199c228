"""Command line of one process of the fault-injection run (`_async_rl_common.fault_run`):
tests/train/async_rl/test_async_rl_faults.py starts it, SIGKILLs it at a random moment (the trainer
process), and resumes the run.

    python tests/train/async_rl/fault_run.py OUT ENV_ID --steps 6 --seed 0 --faults 0 2 [--no-learn]

Logs go to OUT/driver_<pid>.log.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("env_id")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--faults", type=int, nargs=2, default=(0, 0), metavar=("A", "B"),
                    help="rollout-worker and engine kills after random updates in [A, B), a sandbox kill after a "
                         "later one (<= B); 0 0: none")
    ap.add_argument("--kinds", default="worker,engine,sandbox", help="the fault kinds to inject (comma-separated)")
    ap.add_argument("--no-learn", action="store_true",
                    help="the trainer logs and counts updates without a gradient step (the fast variant)")
    ap.add_argument("--no-recovery", action="store_true",
                    help="positive control: resume parameters and task stream only (no ledger / group store)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    logging.basicConfig(filename=os.path.join(a.out, f"driver_{os.getpid()}.log"), level=logging.INFO, force=True,
                        format="%(asctime)s %(threadName)s %(name)s %(message)s")
    from _async_rl_faults import fault_run

    fault_run(a.out, a.env_id, steps=a.steps, seed=a.seed, staleness=a.staleness, faults=tuple(a.faults),
              learn=not a.no_learn, recovery=not a.no_recovery, kinds=tuple(a.kinds.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
