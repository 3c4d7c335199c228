"""Per-row token sampling with fixed shapes: greedy, temperature, top-k, top-p, per-request seeds.

Everything here runs inside the engine's jitted prefill/decode steps; each row (slot) carries its
own sampling parameters, so one compiled step serves any mix of requests.

Reproducibility: the random draw of a row depends only on ``(seed, draw_index)`` of that row
(``draw_index`` = index of the generated token within its request), never on the slot, the batch
composition or the arrival order. Sampling is Gumbel-max over the masked, tempered logits, which
samples exactly from the renormalised top-k/top-p distribution.

Returned log-probabilities of the chosen token:
- ``logprob_raw``: under the raw model distribution, ``log_softmax(logits)`` (temperature 1, no
  truncation) -- what the trainer recomputes;
- ``logprob_sampling``: under the distribution actually sampled from (temperature, top-k, top-p
  applied and renormalised); 0 for greedy rows (the choice had probability 1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _row_keys(seeds: jax.Array, draw_index: jax.Array) -> jax.Array:
    """One PRNG key per row from its (seed, draw_index): [B] uint32, [B] int32 -> [B] keys."""

    def one(seed, idx):
        return jax.random.fold_in(jax.random.key(seed), idx)

    return jax.vmap(one)(seeds.astype(jnp.uint32), draw_index.astype(jnp.int32))


# The Gumbel-max draw's reduction: "first" (`first_argmax`, the default since 2026-12-07) or
# "argmax" (`jnp.argmax`, before; kept as the A/B baseline of benchmarks/engine_steps.py).
DRAW_REDUCE = "first"


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` (first index of the maximum; the first NaN if a row has one), as
    a max, a compare and a min over indices: [B, V] -> [B] int32.

    Why: XLA:CPU fuses the Gumbel noise's elementwise work into argmax's (value, index) reduction
    and runs it as a scalar loop; with the quickstart's 32 x 4096 logits that took ~2 ms of a
    ~12 ms decode step. The three plain reductions vectorise (`benchmarks/engine_steps.py`). The
    result is the same integer as `jnp.argmax` for every input (ties, +-inf, NaN:
    tests/sampling/test_sampling_first_argmax.py)."""
    V = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)  # NaN if the row has one
    hit = (x == m) | jnp.isnan(x)  # a NaN row: x == m is False everywhere, the first NaN wins
    idx = jnp.arange(V, dtype=jnp.int32)
    return jnp.min(jnp.where(hit, idx, V), axis=-1).astype(jnp.int32)


def truncation_mask(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Bool mask [B, V] of the tokens kept by top-k then top-p (nucleus) on tempered logits.

    scaled: [B, V] logits already divided by the temperature; top_k: [B] int (0 = off);
    top_p: [B] float in (0, 1] (1 = off). Thresholds are taken on values, so tied logits at
    the boundary are all kept (the usual convention); at least the top token always survives.
    """
    V = scaled.shape[-1]
    srt = jnp.sort(scaled, axis=-1)[:, ::-1]  # [B, V] descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)  # [B]
    kth = jnp.take_along_axis(srt, (k - 1)[:, None], axis=-1)  # [B, 1]
    # nucleus on the top-k-truncated distribution
    ranks = jnp.arange(V)[None, :]
    srt_k = jnp.where(ranks < k[:, None], srt, -jnp.inf)
    probs = jax.nn.softmax(srt_k, axis=-1)  # [B, V] sorted
    cum_before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted entry
    keep_sorted = (cum_before < top_p[:, None]) & (ranks < k[:, None])
    keep_sorted = keep_sorted.at[:, 0].set(True)
    n_keep = jnp.sum(keep_sorted, axis=-1)  # [B]
    pth = jnp.take_along_axis(srt, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
    thresh = jnp.maximum(kth, pth)
    return scaled >= thresh


def sample_tokens(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                  seeds: jax.Array, draw_index: jax.Array):
    """Sample one token per row.

    logits: [B, V] (any float dtype; computed in f32); temperature: [B] (0 = greedy);
    top_k: [B] int32; top_p: [B] f32; seeds: [B] uint32; draw_index: [B] int32.
    Returns (tokens [B] int32, logprob_sampling [B] f32, logprob_raw [B] f32).
    """
    logits = logits.astype(jnp.float32)
    B, V = logits.shape
    greedy = temperature <= 0.0
    t = jnp.where(greedy, 1.0, temperature)[:, None]
    scaled = logits / t
    # The sort of top-k/top-p and the noise draw are skipped (lax.cond) when no row needs them
    # (e.g. an all-greedy batch): on CPU a [B, V] sort costs as much as a small model's step.
    need_trunc = jnp.any(~greedy & ((top_k > 0) | (top_p < 1.0)))
    keep = jax.lax.cond(need_trunc, lambda: truncation_mask(scaled, top_k, top_p),
                        lambda: jnp.ones((B, V), bool))
    masked = jnp.where(keep, scaled, -jnp.inf)

    def draw():
        keys = _row_keys(seeds, draw_index)
        gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (V,), jnp.float32))(keys)
        z = masked + gumbel  # [B, V]
        if DRAW_REDUCE == "argmax":
            return jnp.argmax(z, axis=-1).astype(jnp.int32)
        return first_argmax(z)  # [B] (= jnp.argmax, see first_argmax)

    drawn = jax.lax.cond(jnp.any(~greedy), draw, lambda: jnp.zeros((B,), jnp.int32))
    best = jnp.argmax(logits, axis=-1)
    tok = jnp.where(greedy, best, drawn).astype(jnp.int32)
    pick = lambda x: jnp.take_along_axis(x, tok[:, None], axis=-1)[:, 0]  # noqa: E731
    lp_raw = pick(logits) - jax.nn.logsumexp(logits, axis=-1)
    lp_s = jnp.where(greedy, 0.0, pick(masked) - jax.nn.logsumexp(masked, axis=-1))
    return tok, lp_s, lp_raw
