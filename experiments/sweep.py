"""Ablation sweeps over any ``--config.*`` key: each cell is a normal ``run.py`` run in its own workdir.

    python experiments/sweep.py --config experiments/configs/rl_quickstart.py:smoke \\
        --grid 'rl.rewards.length.q=[0,0.5,1,2]' --seeds 3 --workdir runs/sweep_q --metric rl.pass_at_1_after
    python experiments/sweep.py --config experiments/configs/tiny.py --config.smoke.steps=2 \\
        --grid 'smoke.learning_rate=[1e-3,3e-3]' --grid 'model.moe.impl=[dropless,capacity]' \\
        --seeds 2 --workdir runs/sweep_tiny --metric smoke.final_loss --max-parallel 2
    python experiments/sweep.py --config experiments/configs/tiny.py \\
        --random 'smoke.learning_rate=loguniform(1e-4,1e-2)' --samples 6 --workdir runs/rand_lr

Several ``--grid`` flags make a Cartesian product; ``--random`` dimensions are drawn jointly
``--samples`` times (``--search-seed``) and crossed with the grid. ``--config.KEY=V`` flags are
passed to every cell unchanged. Every cell's config is loaded and validated here first: an unknown
key or an out-of-range value stops the sweep before anything runs, naming the key (exit 2).
Rerunning the same command resumes: finished cells (``summary.json`` + ``DONE.json``) are not rerun.
Outputs: ``WORKDIR/results.csv`` (one row per cell and seed, every scalar of its summary.json with
dotted keys; swept keys as ``config.KEY``) and ``WORKDIR/<metric>.png`` (mean and 95% CI over seeds
against the first swept key, or ``--x``). A crashed cell is named with its log; the others' results
are kept; the exit status is 1. ``--backend ray`` runs the cells as Ray tasks (``pip install -e
'.[ray]'``; a private local cluster unless ``--ray-address``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Any --config.KEY=VALUE is applied to every cell.")
    p.add_argument("--config", required=True, help="experiments/configs/NAME.py[:preset] (as for run.py)")
    p.add_argument("--workdir", required=True, help="sweep directory (cells/, results.csv, plot)")
    p.add_argument("--grid", action="append", default=[], help="KEY=[v1,v2,...] (repeatable: product)")
    p.add_argument("--random", action="append", default=[],
                   help="KEY=uniform(a,b) | loguniform(a,b) | randint(a,b) | choice([...]) (repeatable)")
    p.add_argument("--samples", type=int, default=0, help="random-search draws (with --random)")
    p.add_argument("--search-seed", type=int, default=0, help="seed of the random-search draws")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point (config.seed = seed-start ...)")
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--metric", default=None, help="flattened summary key to plot, e.g. rl.pass_at_1_after")
    p.add_argument("--x", default=None, help="swept key on the plot's x axis (default: the first)")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--max-parallel", type=int, default=1, help="cells running at once")
    p.add_argument("--ray-address", default=None, help="existing Ray cluster (default: start a local one)")
    p.add_argument("--dry-run", action="store_true", help="check and list the cells, run nothing")
    args, rest = p.parse_known_args(argv)
    fixed: dict = {}
    for a in rest:
        if not a.startswith("--config.") or "=" not in a:
            p.error(f"unrecognised argument {a!r} (overrides are --config.KEY=VALUE)")
        k, v = a[len("--config."):].split("=", 1)
        fixed[k] = v
    if args.max_parallel < 1:
        p.error(f"--max-parallel must be >= 1, got {args.max_parallel}")
    return args, fixed


def main(argv: list[str]) -> int:
    args, fixed = parse_args(argv)
    from c2jax.workflow.sweep import SweepError, plan_sweep, run_sweep

    try:
        plan = plan_sweep(args.config, args.workdir, args.grid, args.random, args.samples, args.search_seed,
                          args.seeds, args.seed_start, fixed)
        if args.x is not None and args.x not in plan.swept_keys:
            raise SweepError(f"--x {args.x!r} is not a swept key ({', '.join(plan.swept_keys) or 'none'})")
        if args.dry_run:
            for c in plan.cells:
                print(f"{'done' if plan.is_done(c) else 'todo'} {c.name}: {' '.join(plan.argv(c))}")
            return 0
        result = run_sweep(plan, args.backend, args.max_parallel, args.metric, args.x, args.ray_address)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
