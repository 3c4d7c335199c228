"""RL objectives and rewards: the Composer 2 policy-gradient recipe as composable pure functions.

Modules (each a registry of named pieces the config selects):
  advantages.py   group baselines (GRPO mean, RLOO leave-one-out), optional std division, scaling
  objectives.py   per-token policy losses (plain PG, PPO clip, CISPO) + truncated IS ratio
  aggregation.py  how per-token losses become a scalar (constant / token-mean / seq-mean-token-mean)
  kl.py           k1/k2/k3 estimators and their two placements (in the reward, in the loss)
  rewards.py      reward terms (grader terms, length penalty C_{k,q}, behaviour terms)
  loss.py         `make_rl_loss(cfg)`: the composed jit-ready loss the RL trainer calls
  config_checks.py  validator of the `rl` config section
All array code is jnp over the fixed-shape batch produced by `c2jax.batching.pad_batch`.
"""
