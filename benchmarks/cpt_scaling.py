"""Held-out code loss against training tokens: the report's log-linear trend, on CPU.

    python benchmarks/cpt_scaling.py                                   # 3 budgets x the quickstart run
    python benchmarks/cpt_scaling.py --budgets 25,75,225 --preset tiny --workdir runs/cpt_scaling

Trains the quickstart config (same data, model and schedule shape) from scratch at >= 3
log-spaced step budgets (each with its own full warmup-stable-decay schedule), reads each run's
``held_out_loss_final`` from its summary.json, and fits ``loss = a + b * ln(tokens)`` by least
squares. Prints the points, the fit (a, b, R^2) and the bigram baseline of the same split, writes
``<workdir>/scaling.json`` and ``<workdir>/scaling.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments", "configs"))


def fit_log_linear(tokens: list[float], losses: list[float]) -> dict:
    import numpy as np

    x, y = np.log(np.asarray(tokens, float)), np.asarray(losses, float)
    A = np.stack([np.ones_like(x), x], 1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = a + b * x
    ss_res, ss_tot = float(((y - pred) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    return {"a": float(a), "b_per_ln_token": float(b), "loss_drop_per_doubling": float(-b * np.log(2)),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="25,75,225", help="steps per run (log-spaced)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "runs", "cpt_scaling"))
    args = ap.parse_args()
    os.environ.setdefault("C2JAX_PROGRESS", "0")
    import quickstart

    from c2jax.config import validate
    from c2jax.train.stages import run_stages

    budgets = [int(b) for b in args.budgets.split(",")]
    if len(budgets) < 3:
        raise SystemExit("need >= 3 budgets")
    points = []
    for steps in budgets:
        c = quickstart.get_config(args.preset)
        c.stages = ["cpt"]
        c.train.steps = steps
        c.train.batch_size = args.batch
        c.train.seq_len = args.seq
        c.train.mtp_start_step = steps // 2
        c.train.schedule.warmup_steps = max(steps // 20, 1)
        c.train.eval_every = steps
        c.train.ckpt_every = steps
        c.train.log_every = max(steps // 10, 1)
        validate(c)
        wd = os.path.join(args.workdir, f"steps{steps}")
        t0 = time.time()
        s = run_stages(c, wd)["cpt"]
        points.append({"steps": steps, "tokens": s["tokens"], "held_out_loss": s["held_out_loss_final"],
                       "held_out_loss_initial": s["held_out_loss_initial"], "probe_nll": s["held_out"].get("probe_nll"),
                       "bigram_held_out_loss": s.get("bigram_held_out_loss"), "wall_s": time.time() - t0})
        print(json.dumps(points[-1]), flush=True)
    fit = fit_log_linear([p["tokens"] for p in points], [p["held_out_loss"] for p in points])
    out = {"points": points, "fit": fit, "preset": args.preset}
    print(json.dumps({"fit": fit}), flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "scaling.json"), "w") as f:
        json.dump(out, f, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    xs = np.asarray([p["tokens"] for p in points], float)
    ax.plot(xs, [p["held_out_loss"] for p in points], "o", label="held-out code loss")
    grid = np.geomspace(xs.min(), xs.max(), 50)
    ax.plot(grid, fit["a"] + fit["b_per_ln_token"] * np.log(grid), "-",
            label=f"fit: {fit['a']:.2f} {fit['b_per_ln_token']:+.3f} ln(tokens), R2={fit['r2']:.3f}")
    if points[0].get("bigram_held_out_loss"):
        ax.axhline(points[0]["bigram_held_out_loss"], ls="--", color="gray", label="bigram baseline")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out loss (nat/token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.workdir, "scaling.png"))


if __name__ == "__main__":
    main()
