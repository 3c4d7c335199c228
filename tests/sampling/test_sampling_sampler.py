"""The per-row sampler (temperature / top-k / top-p / greedy / seeds) and byte-level stop strings,
checked against brute-force numpy references (no model needed)."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from c2jax.sampling.sample import sample_tokens, truncation_mask
from c2jax.sampling.stops import StopMatcher, token_byte_table

_sample = jax.jit(sample_tokens)


def _np_keep(logits, temp, k, p):
    """Reference truncation: sort, keep top-k, then the smallest prefix with mass >= p."""
    x = logits / (temp if temp > 0 else 1.0)
    order = np.argsort(-x, kind="stable")
    kk = len(x) if k == 0 else min(k, len(x))
    top = order[:kk]
    pr = np.exp(x[top] - x[top].max())
    pr /= pr.sum()
    n = 0
    mass = 0.0
    while n < kk and (n == 0 or mass < p):
        mass += pr[n]
        n += 1
    keep = np.zeros(len(x), bool)
    keep[top[:n]] = True
    return keep, x


@pytest.mark.parametrize("temp,k,p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.9, 7, 0.8), (1.0, 1, 1.0)])
def test_truncation_and_logprobs_match_numpy(temp, k, p):
    rng = np.random.default_rng(0)
    B, V = 6, 40
    logits = rng.normal(size=(B, V)).astype(np.float32) * 2
    mask = np.asarray(truncation_mask(jnp.asarray(logits / temp), jnp.full((B,), k, jnp.int32),
                                      jnp.full((B,), p, jnp.float32)))
    tok, lp_s, lp_raw = _sample(jnp.asarray(logits), jnp.full((B,), temp), jnp.full((B,), k, jnp.int32),
                                jnp.full((B,), p, jnp.float32), jnp.arange(B, dtype=jnp.uint32),
                                jnp.zeros((B,), jnp.int32))
    tok, lp_s, lp_raw = map(np.asarray, (tok, lp_s, lp_raw))
    for b in range(B):
        keep, x = _np_keep(logits[b].astype(np.float64), temp, k, p)
        np.testing.assert_array_equal(mask[b], keep)
        assert keep[tok[b]], "sampled a truncated token"
        raw = logits[b] - np.log(np.exp(logits[b].astype(np.float64)).sum())
        assert abs(lp_raw[b] - raw[tok[b]]) < 1e-5
        xs = np.where(keep, x, -np.inf)
        samp = xs - np.log(np.exp(xs - xs.max()).sum()) - xs.max()
        assert abs(lp_s[b] - samp[tok[b]]) < 1e-5


def test_greedy_rows_take_argmax_and_report_zero_sampling_logprob():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    tok, lp_s, lp_raw = _sample(jnp.asarray(logits), jnp.zeros((4,)), jnp.zeros((4,), jnp.int32),
                                jnp.ones((4,)), jnp.arange(4, dtype=jnp.uint32), jnp.arange(4, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))
    np.testing.assert_array_equal(np.asarray(lp_s), 0.0)


def test_seeded_draw_depends_only_on_seed_and_index_not_row():
    rng = np.random.default_rng(2)
    row = rng.normal(size=(64,)).astype(np.float32)
    other = rng.normal(size=(5, 64)).astype(np.float32)
    # same (seed, index) placed in row 0 of one batch and row 3 of another, different neighbours
    b1 = np.stack([row, *other[:3]])
    b2 = np.stack([*other[:3], row, other[4]])
    def run(b, seeds, idx):
        n = len(b)
        return np.asarray(_sample(jnp.asarray(b), jnp.ones((n,)), jnp.zeros((n,), jnp.int32), jnp.ones((n,)),
                                  jnp.asarray(seeds, jnp.uint32), jnp.asarray(idx, jnp.int32))[0])
    for i in range(20):
        t1 = run(b1, [7, 1, 2, 3], [i, 0, 0, 0])[0]
        t2 = run(b2, [4, 5, 6, 7, 9], [1, 1, 1, i, 1])[3]
        assert t1 == t2


def test_sampling_frequencies_follow_truncated_distribution():
    V, n = 6, 4000
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], np.float32))
    tok, _, _ = _sample(jnp.tile(jnp.asarray(logits), (n, 1)), jnp.ones((n,)), jnp.zeros((n,), jnp.int32),
                        jnp.full((n,), 0.75), jnp.full((n,), 3, jnp.uint32), jnp.arange(n, dtype=jnp.int32))
    counts = np.bincount(np.asarray(tok), minlength=V) / n
    # top_p 0.75 keeps {0.4, 0.25, 0.15} (mass before the 3rd is 0.65 < 0.75), renormalised by 0.8
    expect = np.array([0.5, 0.3125, 0.1875, 0, 0, 0])
    assert np.abs(counts - expect).max() < 0.03, counts


# ---- stop strings on bytes ------------------------------------------------------------------

def test_stop_string_split_across_tokens_inside_a_multibyte_char():
    # "é" is C3 A9; a stop "é!" whose first byte ends one token and the rest starts the next
    m = StopMatcher(["é!"])
    assert not m.feed(b"ab\xc3")  # partial char: decoded per token this would be 'ab\ufffd'
    assert m.feed(b"\xa9!cd")
    assert m.text() == "ab" and m.matched == "é!"


def test_partial_utf8_does_not_fake_a_replacement_char_stop():
    m = StopMatcher(["\ufffd"])
    assert not m.feed(b"x\xe2\x82")  # an incomplete euro sign
    assert not m.feed(b"\xac")  # completes it: no stop
    assert m.text() == "x€"


def test_stop_text_ends_exactly_at_earliest_stop_and_include_option():
    m = StopMatcher(["END", "ND"], include_stop_str=False)
    assert m.feed(b"helloEN") is False
    assert m.feed(b"D tail")
    assert m.text() == "hello"
    m2 = StopMatcher(["END"], include_stop_str=True)
    m2.feed(b"ok END more")
    assert m2.text() == "ok END"


def test_token_byte_table_from_byte_level_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from c2jax.sampling.stops import _unicode_to_byte
    b2u = {b: u for u, b in _unicode_to_byte().items()}
    vocab = {b2u[i]: i for i in range(256)}
    vocab["".join(b2u[b] for b in "é".encode())] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(b2u[0xC3], b2u[0xA9])]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_end|>"])
    table = token_byte_table(tok, 258)
    assert table[0xC3] == b"\xc3" and table[ord("a")] == b"a" and table[256] == "é".encode()
    assert table[257] == b"<|im_end|>"
    ids = tok.encode("aé b").ids
    assert b"".join(table[i] for i in ids) == "aé b".encode()
