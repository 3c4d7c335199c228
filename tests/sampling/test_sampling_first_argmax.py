"""`first_argmax` (the sampler's Gumbel-max reduction) returns exactly `jnp.argmax`'s index.

The sampler replaced `jnp.argmax` by a max / compare / min formulation for speed; a sample must not
change because of it, so every case is compared integer for integer: random rows, ties, +-inf,
all -inf, NaN (argmax picks the first NaN), and whole `sample_tokens` draws against the same draw
reduced with `jnp.argmax`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.sampling.sample import _row_keys, first_argmax, sample_tokens


def _same(x: np.ndarray) -> None:
    got = np.asarray(jax.jit(first_argmax)(jnp.asarray(x)))
    want = np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
    np.testing.assert_array_equal(got, want)


def test_random_rows_and_ties():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    _same(x)
    # ties: the maximum repeated at several positions (first wins)
    t = np.round(rng.standard_normal((64, 257)), 1).astype(np.float32)
    t[:, [3, 100, 200]] = 9.0
    _same(t)
    _same(np.zeros((8, 33), np.float32))  # all equal -> 0


@pytest.mark.parametrize("case", ["inf", "neg_inf_row", "nan_first", "nan_after_max", "nan_and_inf"])
def test_special_values(case):
    x = np.random.default_rng(1).standard_normal((4, 50)).astype(np.float32)
    if case == "inf":
        x[:, [7, 20]] = np.inf
    elif case == "neg_inf_row":
        x[1] = -np.inf
        x[2, :40] = -np.inf
    elif case == "nan_first":
        x[:, 5] = np.nan
    elif case == "nan_after_max":
        x[:, 10] = 99.0
        x[:, 30] = np.nan
        x[:, 40] = np.nan
    else:
        x[0, 3] = np.inf
        x[0, 8] = np.nan
        x[3, 0] = np.nan
    _same(x)


def test_sample_tokens_equal_the_argmax_draw():
    """Tokens of `sample_tokens` (temperature 1, top-k/top-p mixes) equal the Gumbel-max draw
    reduced with jnp.argmax, over 100 batches of 16 rows."""
    rng = np.random.default_rng(2)
    B, V = 16, 512
    temp = jnp.asarray(rng.uniform(0.3, 1.5, B), jnp.float32)
    top_k = jnp.asarray(rng.choice([0, 5, 50], B), jnp.int32)
    top_p = jnp.asarray(rng.choice([1.0, 0.9], B), jnp.float32)
    seeds = jnp.arange(B, dtype=jnp.uint32) * 7 + 1
    fn = jax.jit(sample_tokens)

    @jax.jit
    def reference(logits, draw):
        from c2jax.sampling.sample import truncation_mask
        scaled = logits / temp[:, None]
        masked = jnp.where(truncation_mask(scaled, top_k, top_p), scaled, -jnp.inf)
        g = jax.vmap(lambda k: jax.random.gumbel(k, (V,), jnp.float32))(_row_keys(seeds, draw))
        return jnp.argmax(masked + g, axis=-1).astype(jnp.int32)

    for i in range(100):
        logits = jnp.asarray(rng.standard_normal((B, V)) * rng.uniform(0.5, 6.0), jnp.float32)
        draw = jnp.full((B,), i, jnp.int32)
        tok, _, _ = fn(logits, temp, top_k, top_p, seeds, draw)
        np.testing.assert_array_equal(np.asarray(tok), np.asarray(reference(logits, draw)))
