"""Consecutive RL checkpoints differ in only a few per cent of their bf16 weights.

What `run` does: `c2jax.workflow.rl_probes.learner_bf16_deltas`: the real RL learner (router
replay, full-parameter Adam, constant learning rate) on the rl_quickstart:smoke model shape (random
init, ~0.3M parameters), fed by the real sampling engine (4 prompts x 4 rollouts of 24 tokens per
step, a synthetic reward with within-group variance), STEPS steps per seed; every version is
published through `c2jax.sync.WeightPublisher` in bf16 and its statistics give the share of bf16
elements that changed. The verdict is at the library's default RL learning rate
(`full_rl_defaults()['learning_rate']`, chosen before running); the quickstart's 3e-4 and a
large-model-like 1e-6 are measured on one seed each and reported in the detail and the figure.

Caveat on scale: the report's figure (Fireworks: > 98% bit-identical) is for a large trained model;
a small random-init model has a different weight-magnitude distribution, and Adam moves every
parameter with a nonzero gradient by about the learning rate, so the share depends on lr / |w|.
"""
import os

import numpy as np

from c2jax.workflow.claims import Claim, Verdict, decide, paired_t

SEEDS, STEPS, THRESHOLD = 3, 6, 0.05
SIDE_LRS = (1e-6, 3e-4)
CLAIM = Claim(
    name="checkpoint_sparse_diffs",
    claim="Consecutive RL checkpoints differ in only a few per cent of their bf16 weights (so weight sync can send sparse diffs).",
    source="Composer 2 report, section 6.2, weight sync (claims digest section 6, item 20)",
    test="c2jax.workflow.rl_probes.learner_bf16_deltas: real engine + RL learner + WeightPublisher (bf16 wire), "
         "rl_quickstart:smoke shape, library-default RL learning rate",
    metric=f"mean over {STEPS} steps of the share of bf16 weights changed per step, minus {THRESHOLD} "
           f"('a few per cent'), one value per seed",
    direction="less",
    command="python experiments/claims.py run checkpoint_sparse_diffs",
    scale="cheap",
    scale_note="the real learner on the smoke model shape, 2-4 minutes on CPU (compiles dominate)",
    run_scale=f"rl_quickstart:smoke shape (random init), {STEPS} RL steps x 16 rollouts, {SEEDS} seeds at the "
              f"default lr; lrs {SIDE_LRS} on one seed",
    full_command="python experiments/run.py --config experiments/configs/rl_quickstart.py --workdir runs/rl_deltas "
                 "--config.rl.weight_sync.mode=delta --config.rl.weight_sync.wire_dtype=bfloat16  "
                 "# weight_sync/* identical share per step in the RL stage's metrics",
)


def run(out_dir: str) -> Verdict:
    from c2jax.rl.stage_config import full_rl_defaults
    from c2jax.workflow.rl_probes import learner_bf16_deltas

    lr = float(full_rl_defaults()["learning_rate"])
    main = [learner_bf16_deltas(lr, s, steps=STEPS) for s in range(SEEDS)]
    side = [learner_bf16_deltas(x, 0, steps=STEPS) for x in SIDE_LRS]
    per_seed = [float(np.mean([r["changed_bf16"] for r in m["rows"]])) for m in main]
    effect, lo, hi, n = paired_t([v - THRESHOLD for v in per_seed])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in main + side:
        ax.plot([r["step"] for r in m["rows"]], [r["changed_bf16"] for r in m["rows"]], marker="o",
                label=f"lr {m['lr']:.0e} seed {m['seed']}")
    ax.axhline(THRESHOLD, color="k", ls="--", lw=1, label="5% ('a few per cent')")
    ax.set_yscale("log"), ax.set_xlabel("RL step"), ax.set_ylabel("share of bf16 weights changed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "bf16_changed.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)

    def summary(m):
        return {"lr": m["lr"], "seed": m["seed"], "raw_bf16_bytes": m["raw_bytes"],
                "changed_bf16_mean": float(np.mean([r["changed_bf16"] for r in m["rows"]])),
                "delta_over_raw_mean": float(np.mean([r["delta_over_raw"] for r in m["rows"]])), "rows": m["rows"]}

    detail = {"lr": lr, "changed_bf16_per_seed": per_seed, "runs": [summary(m) for m in main],
              "other_lrs": [summary(m) for m in side]}
    return Verdict(decide(effect, lo, hi, CLAIM.direction), effect, (lo, hi), n, detail, path)
