"""A tiny autoregressive policy whose every outcome can be enumerated (shared by the RL tests).

Vocabulary {a=0, b=1, EOS=2}; at most T=3 tokens; a rollout stops at EOS or at T tokens
(truncated, no EOS). That gives 1 + 2 + 4 + 8 = 15 distinct rollouts of lengths 1..3, so
expectations over one rollout (15 terms) or over a group of G rollouts (15^G terms) are exact sums.
The policy is tabular: logits theta[t, prev_token, next_token], prev = BOS (3) at t = 0.

`batch_for(idx)` builds the batch dict `c2jax.rl.loss.make_rl_loss` consumes for one group of
rollouts (one row per rollout), so the tests exercise the library code path, not a re-derivation.
"""
from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

V, T, EOS, BOS = 3, 3, 2, 3


def enumerate_rollouts() -> tuple[np.ndarray, np.ndarray]:
    """All rollouts as (tokens int32 [K, T] padded with 0, mask float32 [K, T])."""
    seqs = [[EOS]]
    for n in (1, 2):
        for body in itertools.product((0, 1), repeat=n):
            seqs.append(list(body) + [EOS])
    seqs += [list(s) for s in itertools.product((0, 1), repeat=T)]  # truncated at T
    tok = np.zeros((len(seqs), T), np.int32)
    mask = np.zeros((len(seqs), T), np.float32)
    for i, s in enumerate(seqs):
        tok[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return tok, mask


TOKENS, MASK = enumerate_rollouts()
K = len(TOKENS)
LENGTHS = MASK.sum(1)
# Binary task reward: correct iff the rollout contains 'b' and ends with EOS.
REWARD = np.array([float((1 in s[: int(n)]) and s[int(n) - 1] == EOS) for s, n in zip(TOKENS, LENGTHS)], np.float32)


def init_theta(seed: int = 0, scale: float = 0.7) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(0, scale, (T, V + 1, V)), jnp.float32)


def token_logp(theta: jax.Array, tok: jax.Array) -> jax.Array:
    """log pi(tok[..., t] | prefix) for rollouts tok [..., T] -> [..., T] (padding slots computed, masked later)."""
    prev = jnp.concatenate([jnp.full(tok.shape[:-1] + (1,), BOS, tok.dtype), tok[..., :-1]], axis=-1)
    logits = theta[jnp.arange(T), prev]  # [..., T, V]
    return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tok[..., None], -1)[..., 0]


def rollout_logp(theta: jax.Array) -> jax.Array:
    """log p(o) of every enumerated rollout [K]."""
    return jnp.sum(token_logp(theta, jnp.asarray(TOKENS)) * MASK, -1)


def expected_reward(theta: jax.Array, reward=REWARD) -> jax.Array:
    return jnp.sum(jnp.exp(rollout_logp(theta)) * reward)


def all_groups(g: int) -> np.ndarray:
    """Every ordered group of g rollout indices [K^g, g]."""
    return np.array(list(itertools.product(range(K), repeat=g)), np.int32)


def batch_for(idx: jax.Array, behaviour_logp: jax.Array, reward=REWARD) -> dict:
    """Batch dict for one group (rows = rollouts idx [G]); behaviour_logp [K, T] per enumerated rollout."""
    g = idx.shape[0]
    mask = jnp.asarray(MASK)[idx]
    return dict(
        loss_mask=mask,
        behaviour_logp=behaviour_logp[idx] * mask,
        traj_index=jnp.where(mask > 0, jnp.arange(g)[:, None], -1).astype(jnp.int32),
        traj_valid=jnp.ones((g,), jnp.float32),
        infra_failed=jnp.zeros((g,), jnp.float32),
        group_index=jnp.zeros((g,), jnp.int32),
        reward_terms={"task": jnp.asarray(reward)[idx]},
        effort={},
        tool_stats={},
    )


def exact_expected_grad(loss_fn, theta, g: int, sample_logp=None, reward=REWARD, ref_logp=None):
    """E over groups of g rollouts drawn from `sample_logp` (default pi_theta) of grad_theta loss, exactly.

    loss_fn(logp [G, T], batch, logp_ref) -> (scalar, metrics). Returns a pytree like theta.
    """
    return _exact_runner(loss_fn, g)(theta, sample_logp, jnp.asarray(reward), ref_logp)


@functools.lru_cache(maxsize=64)
def _exact_runner(loss_fn, g: int):
    """One jitted exact-expectation function per (loss, group size), reused across rewards and samplers."""
    groups = jnp.asarray(all_groups(g))  # [K^g, g]

    @jax.jit
    def run(theta, sample_logp, reward, ref_logp):
        tok = jnp.asarray(TOKENS)
        behaviour = token_logp(theta, tok) if sample_logp is None else sample_logp  # [K, T]
        p_roll = jnp.exp(jnp.sum(behaviour * MASK, -1))  # [K]
        p_group = jnp.prod(p_roll[groups], -1)  # [K^g]

        def one(idx):
            def f(th):
                lp = token_logp(th, tok[idx])
                lr = None if ref_logp is None else ref_logp[idx]
                return loss_fn(lp, batch_for(idx, jax.lax.stop_gradient(behaviour), reward), lr)[0]
            return jax.grad(f)(theta)

        grads = jax.lax.map(one, groups, batch_size=1024)  # [K^g, *theta.shape]
        return jnp.tensordot(p_group, grads, axes=1)

    return run


def sample_grads(loss_fn, theta, g: int, m: int, seed: int, sample_theta=None, reward=REWARD, ref_logp=None):
    """m independent Monte-Carlo gradient estimates [m, *theta.shape], groups of g drawn from the sampler."""
    tok = jnp.asarray(TOKENS)
    behaviour = token_logp(theta if sample_theta is None else sample_theta, tok)
    p_roll = np.exp(np.asarray(jnp.sum(behaviour * MASK, -1)), dtype=np.float64)
    groups = np.random.default_rng(seed).choice(K, size=(m, g), p=p_roll / p_roll.sum()).astype(np.int32)

    @jax.jit
    def run(theta, groups, behaviour, reward, ref_logp):
        def one(idx):
            def f(th):
                lr = None if ref_logp is None else ref_logp[idx]
                return loss_fn(token_logp(th, tok[idx]), batch_for(idx, behaviour, reward), lr)[0]
            return jax.grad(f)(theta)

        return jax.lax.map(one, groups, batch_size=1024)

    return run(theta, jnp.asarray(groups), behaviour, jnp.asarray(reward), ref_logp)
