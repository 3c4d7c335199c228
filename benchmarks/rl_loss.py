"""Cost of the composed RL loss next to the plainest possible baseline, in the same process.

Both are jitted value-and-grad over logp [B, L]: the baseline is a masked token mean of -logp
(what an SFT step adds on top of the model), the candidate is `make_rl_loss` with each objective
(rewards -> advantages -> objective -> aggregation, plus KL and metrics). The model forward and
backward dominate a real step by orders of magnitude; this checks the RL bookkeeping stays a
small constant factor of an elementwise pass, i.e. no per-token Python and no O(N^2) blow-up.

    python benchmarks/rl_loss.py [--rows 64] [--len 2048] [--trajs 256] [--repeats 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from c2jax.rl.loss import make_rl_loss  # noqa: E402


def synthetic_batch(rows: int, length: int, n: int, group: int, seed: int = 0) -> dict:
    """A packed-looking batch: every row split into a few trajectories' tokens, random masks and rewards."""
    rng = np.random.default_rng(seed)
    traj_index = np.sort(rng.integers(0, n, (rows, length)), axis=1).astype(np.int32)
    loss_mask = (rng.random((rows, length)) < 0.7).astype(np.float32)
    return dict(
        loss_mask=loss_mask,
        behaviour_logp=np.where(loss_mask > 0, -rng.exponential(1.0, (rows, length)), 0).astype(np.float32),
        traj_index=traj_index,
        traj_valid=np.ones(n, np.float32),
        infra_failed=(rng.random(n) < 0.02).astype(np.float32),
        truncated=np.zeros(n, np.float32),
        group_index=(np.arange(n) // group).astype(np.int32),
        reward_terms={"task": (rng.random(n) < 0.4).astype(np.float32)},
        effort={"thinking_tokens": rng.integers(0, 4000, n).astype(np.float32),
                "tool_calls": rng.integers(0, 30, n).astype(np.float32)},
        tool_stats={"malformed": np.zeros(n, np.float32)},
        versions=np.zeros((rows, length), np.int32),
    )


def timed(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--len", type=int, default=2048)
    ap.add_argument("--trajs", type=int, default=256)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    batch = synthetic_batch(args.rows, args.len, args.trajs, args.group)
    logp = jnp.asarray(batch["behaviour_logp"]) - 0.01
    ref = logp - 0.05

    def baseline(lp, b):
        m = b["loss_mask"]
        return jnp.sum(-lp * m) / jnp.maximum(m.sum(), 1.0)

    base_t = timed(jax.jit(jax.value_and_grad(baseline)), logp, batch, repeats=args.repeats)
    rewards = dict(task=dict(weight=1.0),
                   length_penalty=dict(weight=0.1, k=0.01, q=1.5, weights=dict(thinking_tokens=1.0, tool_calls=50.0)))
    print(f"B={args.rows} L={args.len} N={args.trajs} G={args.group}; baseline masked mean: {base_t * 1e3:.2f} ms")
    for name, cfg in [
        ("pg + constant (Composer 2)", dict()),
        ("pg + k1-in-reward + TIS", dict(objective=dict(name="pg", tis_cap=2.0), kl=dict(coef=0.01))),
        ("ppo + token_mean", dict(objective=dict(name="ppo", clip_low=0.2, clip_high=0.28), aggregation=dict(name="token_mean"))),
        ("cispo + seq_mean_token_mean", dict(objective=dict(name="cispo"), aggregation=dict(name="seq_mean_token_mean"))),
    ]:
        fn = make_rl_loss(dict(cfg, rewards=rewards))
        f = jax.jit(jax.value_and_grad(lambda lp, b, r: fn(lp, b, r, current_version=1), has_aux=True))
        t = timed(f, logp, batch, ref, repeats=args.repeats)
        print(f"  {name:32s} {t * 1e3:8.2f} ms   {t / base_t:6.2f}x baseline")


if __name__ == "__main__":
    main()
