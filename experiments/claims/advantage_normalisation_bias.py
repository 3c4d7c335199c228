"""Std-normalised advantages and 1/|o| length normalisation bias behaviour (why Dr. GRPO drops both).

What `run` does (a controlled experiment, not the RL stage): `c2jax.workflow.bandits.LengthEnv`, a
tabular token-level policy (answer token, then body tokens that stop with a learnable per-answer
probability), trained by plain SGD on the library's `make_rl_loss` for STEPS on-policy updates of
16 groups x 8 rollouts, SEEDS seeds, each arm on the same seeds:

* length bias (answer right with fixed p = 0.5, task reward only, so the reward does not depend on
  length and an unbiased estimator leaves the length preference where it is, up to noise):
  aggregation ``constant`` (Dr. GRPO, C = N x initial mean length) vs ``seq_mean_token_mean``
  (GRPO's 1/|o|). Effects: log E|o| of wrong responses (1/|o| over constant) and log E|o| of right
  responses (constant over 1/|o|); both predicted > 0.
* std normalisation (p = 0.97: nearly every group is all-correct, so within-group reward
  differences come only from a tiny linear length cost, the real ``length_penalty`` term with
  weight 1e-3 per token): ``std_normalize`` False vs True. Effect: log E|o| of right responses
  (default over std-normalised): the normalisation blows the tiny differences up to unit-size
  advantages, so the tiny cost drives behaviour; predicted > 0. The same with p = 0.03 (nearly
  every group all-wrong) on the wrong responses' length.

Expected lengths are closed forms of the final policy (no sampling noise). The verdict is the
weakest of the four effects (paired by seed, t 95% CI).
"""
import os

import numpy as np

from c2jax.workflow.claims import Claim, Verdict, decide, paired_t, weakest_effect

SEEDS, STEPS, LR = 5, 300, 2.0
CLAIM = Claim(
    name="advantage_normalisation_bias",
    claim="Dividing advantages by the group std over-weights near-all-correct/near-all-wrong groups, and 1/|o| length normalisation favours long wrong and short right responses.",
    source="Composer 2 report, section 4.1, citing Dr. GRPO (claims digest section 6, items 5 and 6)",
    test="c2jax.workflow.bandits.LengthEnv trained with the real make_rl_loss: aggregation constant vs "
         "seq_mean_token_mean (p_right 0.5) and std_normalize False vs True (p_right 0.97 and 0.03, "
         "1e-3/token length cost)",
    metric="weakest of: log E|o|_wrong (1/|o| / constant), log E|o|_right (constant / 1/|o|), "
           "log E|o| (default / std-normalised) at p_right 0.97 and 0.03; paired by seed",
    direction="greater",
    command="python experiments/claims.py run advantage_normalisation_bias",
    scale="cheap",
    scale_note="controlled bandit with the real RL loss, about a minute on CPU",
    run_scale=f"tabular LengthEnv, {STEPS} SGD steps x 128 rollouts (16 groups x 8), {SEEDS} seeds per arm",
    full_command="for p in default std_norm token_mean; do python experiments/sweep.py "
                 "--config experiments/configs/rl_quickstart.py:$p --seeds 3 "
                 "--workdir runs/claims/advantage_normalisation_bias/$p; done",
)


def _arm(p_right: float, seed: int, aggregation: str = "constant", std: bool = False,
         length_cost: float = 0.0) -> dict:
    from c2jax.workflow.bandits import LengthEnv, train

    env = LengthEnv(p_right=p_right)
    rewards = {"task": {"weight": 1.0}}
    if length_cost:
        rewards["length"] = {"fn": "length_penalty", "weight": length_cost, "k": 0.0, "q": 0.0,
                             "weights": {"final_message_tokens": 1.0}}
    cfg = {"advantage": {"name": "grpo", "std_normalize": std},
           "aggregation": {"name": aggregation, "constant": env.n * env.mean_len0}, "rewards": rewards}
    params, hist = train(env, cfg, steps=STEPS, lr=LR, seed=seed)
    return dict(env.expected(params), grad_norm=float(np.mean(hist["grad_norm"])))


def run(out_dir: str) -> Verdict:
    arms = {"constant": [], "1/|o|": [], "default (p=.97)": [], "std_norm (p=.97)": [], "default (p=.03)": [],
            "std_norm (p=.03)": []}
    for s in range(SEEDS):
        arms["constant"].append(_arm(0.5, s, "constant"))
        arms["1/|o|"].append(_arm(0.5, s, "seq_mean_token_mean"))
        for p in (0.97, 0.03):
            arms[f"default (p={str(p)[1:]})"].append(_arm(p, s, length_cost=1e-3))
            arms[f"std_norm (p={str(p)[1:]})"].append(_arm(p, s, std=True, length_cost=1e-3))

    def col(arm, key):
        return np.array([r[key] for r in arms[arm]])

    effects = {
        "long_wrong (1/|o|)": paired_t(np.log(col("1/|o|", "len_wrong") / col("constant", "len_wrong"))),
        "short_right (1/|o|)": paired_t(np.log(col("constant", "len_right") / col("1/|o|", "len_right"))),
        "std_norm amplifies a tiny length cost (near-all-correct)": paired_t(
            np.log(col("default (p=.97)", "len_right") / col("std_norm (p=.97)", "len_right"))),
        "std_norm amplifies a tiny length cost (near-all-wrong)": paired_t(
            np.log(col("default (p=.03)", "len_wrong") / col("std_norm (p=.03)", "len_wrong"))),
    }
    name, (effect, lo, hi, n) = weakest_effect(effects, CLAIM.direction)
    from c2jax.workflow.figures import arms_figure

    fig = arms_figure({"E|o| wrong, p=0.5": {a: col(a, "len_wrong") for a in ("constant", "1/|o|")},
                       "E|o| right, p=0.5": {a: col(a, "len_right") for a in ("constant", "1/|o|")},
                       "E|o| right, p=0.97 + 1e-3/token":
                           {a: col(a, "len_right") for a in ("default (p=.97)", "std_norm (p=.97)")},
                       "E|o| wrong, p=0.03 + 1e-3/token":
                           {a: col(a, "len_wrong") for a in ("default (p=.03)", "std_norm (p=.03)")}},
                      os.path.join(out_dir, "lengths.png"), f"after {STEPS} steps (initial E|o| = 12)")
    detail = {"decisive": name, "effects": {k: {"effect": v[0], "ci95": [v[1], v[2]]} for k, v in effects.items()},
              "arms": {a: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for a, rs in arms.items()},
              "per_seed": arms}
    return Verdict(decide(effect, lo, hi, CLAIM.direction), effect, (lo, hi), n, detail, fig)
