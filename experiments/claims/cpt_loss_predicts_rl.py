"""Lower continued-pretraining loss gives higher downstream RL reward.

What `run` does (micro scale): `c2jax.workflow.cpt_rl.cpt_then_rl`: the rl_quickstart:smoke model
shape with a 256-token vocabulary, continued pretraining with the real train step on a rule
language (t[i+1] = 7 t[i] + 3 mod 256, 10% noise) at BUDGETS steps (snapshots of one constant-lr
run per seed), then, from every snapshot, the same RL run (the real engine and RL learner, 6 steps
x 4 prompts x 4 rollouts, reward = share of generated tokens that follow the rule, rl_quickstart's
RL learning rate 3e-4) and the final policy's mean reward on 32 held-out prompts. SEEDS seeds
(each its own CPT run and init), so 15 (CPT loss, RL reward) pairs.

Caveat: this RL stage is short; the detail reports the reward before RL and the rank correlation
of CPT loss with the RL gain, which says whether RL from a weaker base catches up at this scale.
"""
import os

import numpy as np

from c2jax.workflow.claims import Claim, Verdict, decide, spearman_ci

CONFIG = "experiments/configs/rl_quickstart.py"
BUDGETS, SEEDS = (10, 20, 40, 80, 160), 3
FULL_BUDGETS = "[25,50,100,200,300]"
CLAIM = Claim(
    name="cpt_loss_predicts_rl",
    claim="Lower continued-pretraining loss gives higher reward after RL.",
    source="Composer 2 report, section 3.1 (claims digest section 6, item 1)",
    test=f"c2jax.workflow.cpt_rl.cpt_then_rl: CPT budgets {list(BUDGETS)} x {SEEDS} seeds on a rule language, "
         "the same real-engine + RL-learner run from each, held-out reward after RL",
    metric="Spearman rank correlation of held-out CPT loss with the reward after RL (percentile-bootstrap 95% CI)",
    direction="less",
    command="python experiments/claims.py run cpt_loss_predicts_rl",
    scale="cheap",
    scale_note="micro CPT + RL with the real train step, engine and learner: a few minutes of CPU",
    run_scale=f"smoke shape, vocab 256, CPT {list(BUDGETS)} steps x 8 x 64 tokens, RL 6 steps x 16 rollouts, "
              f"{SEEDS} seeds",
    full_command=f"python experiments/sweep.py --config {CONFIG} --grid 'train.steps={FULL_BUDGETS}' --seeds 3 "
                 "--workdir runs/claims/cpt_loss_predicts_rl/sweep --metric rl.pass_at_1_after  "
                 "# 15 CPT+SFT+RL runs, a day on 2 CPU cores",
)


def run(out_dir: str) -> Verdict:
    from c2jax.workflow.cpt_rl import cpt_then_rl

    rows = [r for s in range(SEEDS) for r in cpt_then_rl(s, BUDGETS)]
    loss = [r["cpt_loss"] for r in rows]
    rho, lo, hi = spearman_ci(loss, [r["reward_after"] for r in rows])
    gain = spearman_ci(loss, [r["reward_after"] - r["reward_before"] for r in rows])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    for s in range(SEEDS):
        mine = [r for r in rows if r["seed"] == s]
        ax.plot([r["cpt_loss"] for r in mine], [r["reward_after"] for r in mine], "o-", label=f"seed {s} after RL")
        ax.plot([r["cpt_loss"] for r in mine], [r["reward_before"] for r in mine], "x:", color=f"C{s}", alpha=0.6)
    ax.set_xlabel("held-out CPT loss (nats)"), ax.set_ylabel("held-out reward (x: before RL)")
    ax.set_title(f"Spearman {rho:.2f} [{lo:.2f}, {hi:.2f}]", fontsize=9), ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "cpt_vs_rl.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    detail = {"rows": rows, "spearman_loss_vs_rl_gain": {"rho": gain[0], "ci95": [gain[1], gain[2]]},
              "mean_rl_gain": float(np.mean([r["reward_after"] - r["reward_before"] for r in rows]))}
    return Verdict(decide(rho, lo, hi, CLAIM.direction), rho, (lo, hi), len(rows), detail, path)
