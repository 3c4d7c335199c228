"""In-flight weight updates: `update_weights` between decode steps keeps running sequences.

Reference for the default (keep the KV cache): the model's own cached forward, prefilling the
positions processed before the update with the OLD weights and teacher-forcing the rest with the
NEW weights over that cache. With ``recompute_cache_on_update=True``: a full forward with the new
weights."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import apply, init_cache
from c2jax.sampling import Engine, Request, SamplingParams
from _sampling_common import CFG, ENGINE_CFG, forward, random_prompts, tiny_params

OLD, NEW = 3, 4


def _run_with_update(old, new, recompute: bool, n_before: int = 4):
    eng = Engine(old, CFG, dataclasses.replace(ENGINE_CFG, recompute_cache_on_update=recompute), version=OLD)
    rng = np.random.default_rng(10)
    seqs = [eng.add_request(Request(p, SamplingParams(temperature=0.0, max_new_tokens=m), id=str(i)))
            for i, (p, m) in enumerate(zip(random_prompts(rng, [9, 21]), [14, 10]))]
    for _ in range(n_before):
        eng.step()
    eng.update_weights(new, NEW)
    while eng.has_work():
        eng.step()
    return eng, [s.result for s in seqs]


def _cached_reference(old, new, tokens, u):
    """Logits [n-1, V] for positions 0..n-2: positions < u computed with `old` into a cache, the
    rest with `new` reading that cache."""
    n = len(tokens)
    cache = init_cache(CFG, 1, 256)
    l1, cache = _chunk(old, tokens[:u], cache)
    l2, _ = _chunk(new, tokens[u:], cache)
    return np.concatenate([l1[:u], l2[: n - u]])[: n - 1]


@jax.jit
def _chunk_jit(params, t, seg, cache):
    out = apply(params, t, CFG, segment_ids=seg, cache=cache)
    return out["logits"][0], out["cache"]


def _chunk(params, toks, cache, width=128):
    """Cached forward of `toks` right-padded to `width` (one compile for every length)."""
    t = np.zeros((1, width), np.int32)
    t[0, : len(toks)] = toks
    seg = (np.arange(width) < len(toks)).astype(np.int32)[None]
    lg, cache = _chunk_jit(params, jnp.asarray(t), jnp.asarray(seg), cache)
    return np.asarray(lg), cache


def test_update_keeps_cache_and_records_versions():
    old, new = tiny_params(0, 4.0), tiny_params(1, 4.0)
    eng, res = _run_with_update(old, new, recompute=False)
    assert eng.stats["weight_updates"] == 1 and eng.stats.get("recomputed_tokens", 0) == 0
    for r in res:
        P, toks = r.prompt_len, r.tokens
        # positions processed (KV + routes) before the update: a prefix of the sequence
        u = int((r.route_versions == OLD).sum())
        assert (r.route_versions[:u] == OLD).all() and (r.route_versions[u:] == NEW).all()
        assert P <= u < len(toks) - 1
        gen_v = r.versions[P:]
        assert (gen_v[: u - P + 1] == OLD).all() and (gen_v[u - P + 1:] == NEW).all()
        ref = _cached_reference(old, new, toks, u)
        np.testing.assert_array_equal(ref[P - 1:].argmax(-1), toks[P:])
        lse = jax.nn.log_softmax(jnp.asarray(ref[P - 1:]), -1)
        np.testing.assert_allclose(r.raw_logprobs, np.asarray(lse)[np.arange(len(toks) - P), toks[P:]], atol=1e-4)
        # the tokens after the update differ from a pure old-weights run's (the update took effect)
        full_old = forward(old, toks)["logits"][P - 1:-1].argmax(-1)
        assert not np.array_equal(full_old, toks[P:])


def test_update_with_recompute_matches_new_weights_forward():
    old, new = tiny_params(0, 4.0), tiny_params(1, 4.0)
    eng, res = _run_with_update(old, new, recompute=True)
    assert eng.stats["recomputed_tokens"] > 0
    for r in res:
        P, toks = r.prompt_len, r.tokens
        assert (r.route_versions == NEW).all() and (r.versions[:P] == NEW).all()
        n_old = int((r.versions[P:] == OLD).sum())  # sampled before the update
        assert n_old >= 1 and (r.versions[P + n_old:] == NEW).all()
        lg_new = forward(new, toks)["logits"]
        lg_old_argmax = forward(old, toks)["logits"][P - 1:P - 1 + n_old].argmax(-1)
        np.testing.assert_array_equal(lg_old_argmax, toks[P:P + n_old])
        np.testing.assert_array_equal(lg_new[P - 1 + n_old:-1].argmax(-1), toks[P + n_old:])
        np.testing.assert_array_equal(forward(new, toks)["routes"], r.routes)


def test_update_with_mismatching_tree_is_rejected_and_keeps_weights():
    import pytest
    old = tiny_params(0, 4.0)
    eng = Engine(old, CFG, ENGINE_CFG, version=OLD)
    bad = jax.tree.map(lambda x: x, old)
    bad["lm_head"] = {"kernel": jnp.zeros((CFG.hidden_size, CFG.vocab_size + 1))}
    with pytest.raises(ValueError, match="lm_head"):
        eng.update_weights(bad, NEW)
    assert eng.version == OLD and eng._pending is None
