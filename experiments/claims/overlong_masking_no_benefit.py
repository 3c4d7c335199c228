"""Masking overlong (truncated) samples out of the loss brings no benefit.

What `run` does (a controlled experiment, not the RL stage): `c2jax.workflow.bandits.LengthEnv`
with a tight budget (16 tokens; initial mean length 12, so about 27% of rollouts are truncated) and
a learnable answer (initially right with p = 0.3), trained by plain SGD on the library's
`make_rl_loss` with ``overlong_mask`` False vs True (the loss's own masking of truncated
trajectories), STEPS updates of 16 groups x 8, SEEDS seeds each. A truncated rollout is unfinished:
task reward 0. Measured: the final policy's pass rate (right and not truncated, closed form).

Effect: pass rate (masked) - pass rate (unmasked), paired by seed. The claim is "no benefit", so the
direction is ``not_greater`` with a 0.05 margin: holds when the CI's upper end is below +0.05.

What this bandit leaves out: DAPO's argument for masking is that a truncated rollout may hold sound
reasoning that the zero reward punishes (reward noise); here truncation is always a real failure,
so the experiment tests the learning dynamics of masking, not that noise.
"""
import numpy as np

from c2jax.workflow.claims import Claim, Verdict, decide, paired_t

SEEDS, STEPS, LR, MARGIN = 5, 200, 2.0, 0.05
CLAIM = Claim(
    name="overlong_masking_no_benefit",
    claim="Overlong masking (dropping truncated samples from the loss) brings no benefit.",
    source="Composer 2 report (claims digest section 6, item 8)",
    test="c2jax.workflow.bandits.LengthEnv (16-token budget, learnable answer) trained with the real make_rl_loss, "
         "rl.overlong_mask False vs True",
    metric="final pass rate (masked) - pass rate (unmasked), paired by seed; no-benefit margin 0.05",
    direction="not_greater", equivalence_margin=MARGIN,
    command="python experiments/claims.py run overlong_masking_no_benefit",
    scale="cheap", scale_note="controlled bandit with the real RL loss, under a minute on CPU",
    run_scale=f"tabular LengthEnv, 16-token budget, {STEPS} SGD steps x 128 rollouts, {SEEDS} seeds per arm",
    full_command="python experiments/sweep.py --config experiments/configs/rl_quickstart.py "
                 "--grid 'rl.overlong_mask=[False,True]' --seeds 3 --workdir runs/claims/overlong_masking_no_benefit/sweep "
                 "--metric rl.pass_at_1_after",
)


def _arm(mask: bool, seed: int) -> dict:
    from c2jax.workflow.bandits import LengthEnv, train

    env = LengthEnv(max_len=16, mean_len0=12.0, learn_answer=True, p_right=0.3)
    cfg = {"overlong_mask": mask, "aggregation": {"name": "constant", "constant": env.n * env.mean_len0},
           "rewards": {"task": {"weight": 1.0}}}
    params, _ = train(env, cfg, steps=STEPS, lr=LR, seed=seed)
    return env.expected(params)


def run(out_dir: str) -> Verdict:
    import os

    from c2jax.workflow.figures import arms_figure

    arms = {"unmasked": [_arm(False, s) for s in range(SEEDS)], "overlong_mask": [_arm(True, s) for s in range(SEEDS)]}
    diffs = [m["pass_rate"] - u["pass_rate"] for m, u in zip(arms["overlong_mask"], arms["unmasked"])]
    effect, lo, hi, n = paired_t(diffs)
    fig = arms_figure({k: {a: [r[key] for r in rs] for a, rs in arms.items()}
                       for k, key in (("pass rate", "pass_rate"), ("P(right)", "p_right"),
                                      ("truncated | right", "truncated_right"), ("truncated | wrong", "truncated_wrong"))},
                      os.path.join(out_dir, "overlong.png"), f"after {STEPS} steps (initial pass rate 0.22)")
    detail = {"arms": {a: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for a, rs in arms.items()},
              "per_seed": arms}
    return Verdict(decide(effect, lo, hi, CLAIM.direction, MARGIN), effect, (lo, hi), n, detail, fig)
