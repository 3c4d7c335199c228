"""Unit tests of the JAX model: parameter tree, output shapes, abstract Kimi-K2 shapes, MoE
implementations, router replay, KV-cached decode, packed-sequence isolation, MTP, routing rules."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model.cache import init_cache
from c2jax.model.config import count_active_params, count_params, preset
from c2jax.model import moe_impls
from c2jax.model.moe_impls import MOE_IMPLS, capacity
from c2jax.model.moe_router import (route, sequence_balance_loss, update_router_bias)
from c2jax.model.params_spec import ParamSpec, param_specs
from c2jax.model.transformer import apply, init, segment_positions

_apply = jax.jit(apply, static_argnums=2)


@pytest.fixture(scope="module")
def tiny():
    cfg = preset("tiny").replace(**{"initializer_range": 0.1})
    params = init(cfg, jax.random.key(0))
    # a random router bias, so selection-only behaviour is exercised
    b = params["moe_layers"]["moe"]["router"]["bias"]
    params["moe_layers"]["moe"]["router"]["bias"] = jax.random.uniform(jax.random.key(9), b.shape, b.dtype, -0.1, 0.1)
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    return cfg, params, tokens


@pytest.fixture(scope="module")
def tiny_out(tiny):
    cfg, params, tokens = tiny
    return _apply(params, tokens, cfg)


def test_init_matches_spec(tiny):
    cfg, params, _ = tiny
    specs = param_specs(cfg)
    flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_s = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, ParamSpec))[0]
    assert [p for p, _ in flat_p] == [p for p, _ in flat_s]
    for (path, x), (_, s) in zip(flat_p, flat_s):
        assert x.shape == s.shape, path
        if s.init == "ones":
            assert np.all(np.asarray(x) == 1), path
        elif s.init == "normal" and x.size > 1000:
            assert abs(float(jnp.std(x)) - 0.1) < 0.01, path
    fresh = init(cfg, jax.random.key(0))
    assert np.all(np.asarray(fresh["moe_layers"]["moe"]["router"]["bias"]) == 0)
    assert sum(x.size for x in jax.tree_util.tree_leaves(fresh)) == count_params(
        cfg, include_mtp=True, include_router_bias=True)


def test_output_shapes(tiny, tiny_out):
    cfg, _, tokens = tiny
    b, s = tokens.shape
    out, e, k, L = tiny_out, cfg.moe.n_routed_experts, cfg.moe.top_k, cfg.n_moe_layers
    assert out["logits"].shape == (b, s, cfg.vocab_size) and out["logits"].dtype == jnp.float32
    assert out["mtp_logits"].shape == (cfg.mtp_depth, b, s, cfg.vocab_size)
    assert out["router_scores"].shape == (L, b, s, e)
    assert out["routes"].shape == (b, s, L, k) and out["routes"].dtype == jnp.int32
    assert out["expert_counts"].shape == (L, e)
    np.testing.assert_array_equal(np.asarray(out["expert_counts"]).sum(-1), b * s * k)
    assert out["mtp_expert_counts"].shape == (cfg.mtp_depth, e)
    assert out["cache"] is None
    r = np.asarray(out["routes"])
    assert all(len(set(row)) == k for row in r.reshape(-1, k))  # distinct experts per token
    # routes are consistent with the reported scores: tiny routes top-2 within 1 of 2 groups by
    # biased score (sigmoid + the random correction bias)
    sc = np.asarray(out["router_scores"])
    assert ((sc > 0) & (sc < 1)).all()
    biased = sc + np.asarray(tiny[1]["moe_layers"]["moe"]["router"]["bias"])[:, None, None, :]  # [L,B,S,E]
    gsize = e // cfg.moe.n_group
    for l_, b_, s_ in itertools.product(range(L), range(b), range(s)):
        chosen = r[b_, s_, l_]
        grp = chosen // gsize
        assert len(set(grp)) == 1
        in_grp = biased[l_, b_, s_, grp[0] * gsize:(grp[0] + 1) * gsize]
        assert set(chosen - grp[0] * gsize) == set(np.argsort(-in_grp)[:k])
        top2 = np.sort(biased[l_, b_, s_].reshape(cfg.moe.n_group, gsize), -1)[:, -2:].sum(-1)
        assert top2[grp[0]] == top2.max()  # the group with the best top-2 sum
    assert np.isfinite(np.asarray(out["logits"])).all()


def test_kimi_k2_abstract_shapes_and_param_count():
    cfg = preset("kimi_k2")
    shapes = jax.eval_shape(lambda r: init(cfg, r), jax.random.key(0))
    n_all = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    n_bias = cfg.n_moe_layers * cfg.moe.n_routed_experts  # buffers in transformers, not counted there
    assert n_all - n_bias == count_params(cfg) == 1_026_408_209_408
    assert shapes["moe_layers"]["moe"]["experts"]["gate_proj"].shape == (60, 384, 7168, 2048)
    assert shapes["embed"]["embedding"].dtype == jnp.bfloat16
    assert shapes["moe_layers"]["moe"]["router"]["bias"].dtype == jnp.float32  # as the HF loader
    active = count_active_params(cfg)
    # Active per token: all attention/dense/shared/router weights + 8 of 384 routed experts + LM
    # head; the input embedding (a gather) excluded: 31.69B (32.86B counting the embedding;
    # Kimi-K2 reports "32B activated").
    inactive = (384 - 8) * 3 * 7168 * 2048 * 60
    assert active == n_all - n_bias - inactive - 163840 * 7168 == 31_687_072_768
    assert count_active_params(cfg, include_embedding=True) == active + 163840 * 7168
    print(f"kimi_k2 total {n_all - n_bias:,} active {active:,}")
    ds = preset("deepseek_v3")
    assert abs(count_params(ds) / 1e9 - 671.0) < 0.5


def test_dropless_and_capacity_agree_when_capacity_is_ample(tiny, tiny_out):
    cfg, params, tokens = tiny
    m = cfg.moe
    ample = cfg.replace(**{"moe.impl": "capacity", "moe.capacity_factor": m.n_routed_experts / m.top_k})
    out = _apply(params, tokens, ample)
    assert capacity(tokens.size, ample.moe) == tokens.size
    np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(tiny_out["logits"]), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out["routes"]), np.asarray(tiny_out["routes"]))
    assert float(np.max(out["dropped_fraction"])) == 0.0
    tight = cfg.replace(**{"moe.impl": "capacity", "moe.capacity_factor": 0.5})
    out_t = _apply(params, tokens, tight)
    assert float(np.min(out_t["dropped_fraction"])) >= 0.4  # at least half the slots cannot fit
    assert np.abs(np.asarray(out_t["logits"]) - np.asarray(tiny_out["logits"])).max() > 1e-3


def test_moe_impls_match_dense_reference(monkeypatch):
    """Both implementations (and both lowerings of dropless) against a dense per-token loop,
    with skewed routing so expert groups have very different sizes."""
    rng = np.random.default_rng(0)
    n, d, f, e, k = 24, 8, 6, 4, 2
    p = {"gate_proj": rng.normal(size=(e, d, f)), "up_proj": rng.normal(size=(e, d, f)),
         "down_proj": rng.normal(size=(e, f, d))}
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p)
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    skew = np.array([0.6, 0.25, 0.1, 0.05])
    idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False, p=skew) for _ in range(n)]), jnp.int32)
    w = jnp.asarray(rng.uniform(size=(n, k)), jnp.float32)
    ref = np.zeros((n, d))
    pn = {key: np.asarray(v, np.float64) for key, v in p.items()}
    xn, idn, wn = np.asarray(x, np.float64), np.asarray(idx), np.asarray(w, np.float64)
    for t, j in itertools.product(range(n), range(k)):
        ei = idn[t, j]
        g = xn[t] @ pn["gate_proj"][ei]
        h = g / (1 + np.exp(-g)) * (xn[t] @ pn["up_proj"][ei])
        ref[t] += wn[t, j] * (h @ pn["down_proj"][ei])
    m = preset("tiny").moe.__class__(n_routed_experts=e, top_k=k, capacity_factor=e / k)
    for name, lowering in (("dropless", "ragged"), ("dropless", "tiled"), ("capacity", None)):
        monkeypatch.setattr(moe_impls, "DROPLESS_LOWERING", lowering or "auto")
        y, dropped = MOE_IMPLS.get(name)(p, x, idx, w, m)
        np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} {lowering}")
        assert float(dropped) == 0.0
    with pytest.raises(KeyError, match="unknown moe_impl"):
        MOE_IMPLS.get("nope")


def _brute_route(scores, bias, m):
    out = []
    for s in scores:
        c = s + bias
        g = c.reshape(m.n_group, -1)
        gs = np.sort(g, axis=1)[:, -2:].sum(1)
        keep = set(np.argsort(-gs)[: m.topk_group])
        cand = [(c[i], i) for i in range(len(c)) if i // g.shape[1] in keep]
        out.append(sorted(i for _, i in sorted(cand, reverse=True)[: m.top_k]))
    return np.array(out)


def test_group_limited_routing_brute_force():
    rng = np.random.default_rng(3)
    for ng, tg, k in ((1, 1, 2), (4, 2, 3), (8, 3, 4), (2, 1, 4)):
        m = preset("tiny").moe.__class__(n_routed_experts=16, top_k=k, n_group=ng, topk_group=tg,
                                          routed_scaling_factor=2.0)
        scores = 1 / (1 + np.exp(-rng.normal(size=(50, 16)))).astype(np.float32)
        bias = rng.uniform(-0.2, 0.2, 16).astype(np.float32)
        idx, w = route(jnp.asarray(scores), jnp.asarray(bias), m)
        np.testing.assert_array_equal(np.sort(np.asarray(idx), -1), _brute_route(scores, bias, m))
        sel = np.take_along_axis(scores, np.asarray(idx), 1)  # weights use unbiased scores
        np.testing.assert_allclose(np.asarray(w), 2.0 * sel / sel.sum(1, keepdims=True), rtol=1e-5)


def test_router_replay_reproduces_and_keeps_router_gradient(tiny, tiny_out):
    cfg, params, tokens = tiny
    routes = tiny_out["routes"]
    out = _apply(params, tokens, cfg, routes=routes)
    np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(tiny_out["logits"]), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out["routes"]), np.asarray(routes))
    # gradients on a 2-layer version (cheaper to compile): replaying the model's own routes gives
    # the router exactly the gradient of free routing, and it is non-zero
    small = cfg.replace(num_layers=2, mtp_depth=0)
    p_s = init(small, jax.random.key(3))

    def loss(p, r):
        o = apply(p, tokens, small, routes=r)
        return jnp.mean(jax.nn.logsumexp(o["logits"], -1) - o["logits"][..., 0]), o["routes"]

    @jax.jit
    def grads(p):
        (_, r), g_free = jax.value_and_grad(loss, has_aux=True)(p, None)
        g_rep = jax.grad(lambda q: loss(q, r)[0])(p)
        return g_free["moe_layers"]["moe"]["router"]["kernel"], g_rep["moe_layers"]["moe"]["router"]["kernel"]

    g_free, g_replay = grads(p_s)
    assert float(jnp.abs(g_replay).max()) > 1e-6
    np.testing.assert_allclose(np.asarray(g_replay), np.asarray(g_free), rtol=1e-4, atol=1e-7)
    # replaying different experts uses exactly those experts
    e, k = cfg.moe.n_routed_experts, cfg.moe.top_k
    other = (routes + 1) % e
    out_o = _apply(params, tokens, cfg, routes=other)
    np.testing.assert_array_equal(np.asarray(out_o["routes"]), np.asarray(other))
    assert np.abs(np.asarray(out_o["logits"]) - np.asarray(tiny_out["logits"])).max() > 1e-3


def test_router_replay_plausibility_margin(tiny):
    cfg, params, tokens = tiny
    cfg = cfg.replace(**{"moe.n_group": 1, "moe.topk_group": 1})  # plain top-k: own set = top-k biased
    free = _apply(params, tokens, cfg)
    own = np.sort(np.asarray(free["routes"]), -1)
    rand = jnp.asarray(np.stack([np.random.default_rng(i).permutation(cfg.moe.n_routed_experts)[: cfg.moe.top_k]
                                 for i in range(int(np.prod(own.shape[:3])))]).reshape(own.shape), jnp.int32)
    strict = cfg.replace(**{"moe.replay_margin": 0.0})
    out = _apply(params, tokens, strict, routes=rand)  # every implausible expert -> own choice
    np.testing.assert_array_equal(np.sort(np.asarray(out["routes"]), -1), own)
    np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(free["logits"]), atol=1e-5)
    assert float(np.max(out["replaced_fraction"])) > 0
    loose = cfg.replace(**{"moe.replay_margin": 1e9})
    out = _apply(params, tokens, loose, routes=rand)
    np.testing.assert_array_equal(np.asarray(out["routes"]), np.asarray(rand))
    assert float(np.max(out["replaced_fraction"])) == 0


def test_decode_with_cache_equals_full_forward(tiny, tiny_out):
    cfg, params, tokens = tiny
    b, s = tokens.shape
    cache = init_cache(cfg, b, 24)
    logits = []
    for lo, hi in ((0, 5), (5, 10)):  # two prefill chunks (expanded form over the cache)
        o = _apply(params, tokens[:, lo:hi], cfg, cache=cache)
        cache = o["cache"]
        logits.append(o["logits"])
    for i in range(10, s):  # decode steps (absorbed form)
        o = _apply(params, tokens[:, i:i + 1], cfg, cache=cache)
        cache = o["cache"]
        logits.append(o["logits"])
        np.testing.assert_array_equal(np.asarray(o["routes"]), np.asarray(tiny_out["routes"][:, i:i + 1]))
    np.testing.assert_allclose(np.asarray(jnp.concatenate(logits, 1)), np.asarray(tiny_out["logits"]), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(cache["lengths"]), [s, s])
    assert o["mtp_logits"] is None


def test_segment_ids_isolate_packed_sequences(tiny):
    cfg, params, _ = tiny
    rng = np.random.default_rng(5)
    a, b2 = rng.integers(0, cfg.vocab_size, 6), rng.integers(0, cfg.vocab_size, 10)
    packed = jnp.asarray(np.concatenate([a, b2])[None])
    seg = jnp.asarray(np.array([1] * 6 + [2] * 10)[None])
    np.testing.assert_array_equal(np.asarray(segment_positions(seg)), [list(range(6)) + list(range(10))])
    out = _apply(params, packed, cfg, segment_ids=seg)
    # the second sequence alone at the start of a row (same shapes: no extra compile)
    alone = _apply(params, jnp.asarray(np.concatenate([b2, a])[None]), cfg,
                   segment_ids=jnp.asarray(np.array([1] * 10 + [2] * 6)[None]))
    np.testing.assert_allclose(np.asarray(out["logits"][:, 6:]), np.asarray(alone["logits"][:, :10]), atol=1e-5)
    # changing the first sequence leaves the second untouched
    packed2 = packed.at[0, :6].set((packed[0, :6] + 7) % cfg.vocab_size)
    out2 = _apply(params, packed2, cfg, segment_ids=seg)
    np.testing.assert_allclose(np.asarray(out2["logits"][:, 6:]), np.asarray(out["logits"][:, 6:]), atol=1e-6)
    assert np.abs(np.asarray(out2["logits"][:, :6]) - np.asarray(out["logits"][:, :6])).max() > 1e-3


def test_mtp_causality_and_shared_head(tiny, tiny_out):
    """Depth-1 MTP logits at position i see tokens <= i + 1 (its input embedding is t[i+1])."""
    cfg, params, tokens = tiny
    p = 9
    t2 = tokens.at[:, p].set((tokens[:, p] + 1) % cfg.vocab_size)
    out2 = _apply(params, t2, cfg)
    d = np.abs(np.asarray(out2["mtp_logits"][0]) - np.asarray(tiny_out["mtp_logits"][0])).max(axis=(0, 2))
    assert d[: p - 1].max() < 1e-6 and d[p - 1] > 1e-4
    # the MTP head is the shared LM head: its gradient reaches lm_head and the embedding
    small = cfg.replace(num_layers=2)
    params = init(small, jax.random.key(4))

    def loss(prm):
        return jnp.sum(apply(prm, tokens, small)["mtp_logits"][0, :, :4, :3])
    g = jax.jit(jax.grad(loss))(params)
    assert float(jnp.abs(g["lm_head"]["kernel"]).max()) > 0
    assert float(jnp.abs(g["mtp"]["eh_proj"]["kernel"]).max()) > 0
    assert float(jnp.abs(g["embed"]["embedding"][tokens[:, 1:5]]).max()) > 0


def test_aux_free_bias_update_and_balance_loss(tiny):
    cfg, params, _ = tiny
    counts = jnp.asarray([[10, 0, 5, 5, 5, 5, 5, 5]] * cfg.n_moe_layers, jnp.int32)
    new = update_router_bias(params, {"moe_layers": counts, "mtp": counts[:1]}, 0.01)
    delta = np.asarray(new["moe_layers"]["moe"]["router"]["bias"] - params["moe_layers"]["moe"]["router"]["bias"])
    np.testing.assert_allclose(delta[:, :2], [[-0.01, 0.01]] * cfg.n_moe_layers, atol=1e-7)
    np.testing.assert_allclose(delta[:, 2:], 0, atol=1e-7)
    assert new["mtp"]["layer"]["moe"]["router"]["bias"][0, 1] > params["mtp"]["layer"]["moe"]["router"]["bias"][0, 1]
    assert new["lm_head"] is params["lm_head"]
    # sequence-wise balance loss against its definition, brute force
    rng = np.random.default_rng(0)
    m = cfg.moe
    sc = rng.uniform(size=(2, 5, 8)).astype(np.float32)
    idx = np.stack([[rng.choice(8, 2, replace=False) for _ in range(5)] for _ in range(2)])
    valid = np.ones((2, 5), bool)
    ref = []
    for bb in range(2):
        f = np.array([(idx[bb] == e).any(-1).sum() for e in range(8)]) * 8 / (2 * 5)
        pp = (sc[bb] / sc[bb].sum(-1, keepdims=True)).mean(0)
        ref.append((f * pp).sum())
    got = sequence_balance_loss(jnp.asarray(sc), jnp.asarray(idx), jnp.asarray(valid), m)
    np.testing.assert_allclose(float(got), np.mean(ref), rtol=1e-5)
    cfg_b = cfg.replace(**{"moe.seq_aux_loss_coef": 0.01, "num_layers": 2, "mtp_depth": 0})
    g = jax.jit(jax.grad(lambda p: apply(p, _toks(cfg), cfg_b)["balance_loss"]))(init(cfg_b, jax.random.key(5)))
    assert float(jnp.abs(g["moe_layers"]["moe"]["router"]["kernel"]).max()) > 0


def _toks(cfg):
    return jax.random.randint(jax.random.key(2), (2, 8), 0, cfg.vocab_size)


def test_causal_block_skipping_matches_full_square():
    """Self-attention with query blocks that skip keys past their end == the full masked square,
    with packed segments too."""
    from c2jax.model.mla import attend_expanded

    cfg = preset("tiny")
    a = cfg.attention
    rng = np.random.default_rng(0)
    b, s, h = 2, 64, cfg.num_heads
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    p = {"kv_b_proj": {"kernel": f32(a.kv_lora_rank, h, a.qk_nope_head_dim + a.v_head_dim) * 0.2}}
    q_nope, q_rope = f32(b, s, h, a.qk_nope_head_dim), f32(b, s, h, a.qk_rope_head_dim)
    c_kv, k_rope = f32(b, s, a.kv_lora_rank), f32(b, s, a.qk_rope_head_dim)
    seg = jnp.asarray(np.repeat([[1, 2, 3, 0]], 16, axis=1).reshape(1, s).repeat(b, 0))
    mask = jnp.tril(jnp.ones((s, s), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    att = jax.jit(attend_expanded, static_argnums=(6, 7))
    full = att(p, q_nope, q_rope, c_kv, k_rope, mask, cfg, 1)
    for n in (2, 8):
        blocked = att(p, q_nope, q_rope, c_kv, k_rope, mask, cfg, n)
        np.testing.assert_allclose(np.asarray(blocked), np.asarray(full), atol=1e-5, err_msg=str(n))


@pytest.mark.parametrize("impl,precision,tol", [
    ("pallas", "f32", 1e-6), ("dropless", "bf16", 2e-2), ("capacity", "bf16", 2e-2),
    pytest.param("dropless", "fp8_blockwise", 0.2, marks=pytest.mark.slow),
    ("capacity", "mxfp8", 0.2)])
def test_moe_precision_hook_uses_kernels(impl, precision, tol):
    """`pallas` impl and low-precision `moe.precision` go through kernels_pallas.api.grouped_matmul."""
    pytest.importorskip("kernels_pallas.api")
    from c2jax.model.config import MoEConfig

    rng = np.random.default_rng(0)
    n, d, f, e, k = 64, 32, 16, 4, 2
    p = {nm: jnp.asarray(rng.normal(size=sh) * 0.2, jnp.float32)
         for nm, sh in (("gate_proj", (e, d, f)), ("up_proj", (e, d, f)), ("down_proj", (e, f, d)))}
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(n)]), jnp.int32)
    w = jnp.asarray(rng.uniform(size=(n, k)), jnp.float32)
    ref, _ = MOE_IMPLS.get("dropless")(p, x, idx, w, MoEConfig(n_routed_experts=e, top_k=k))
    m = MoEConfig(n_routed_experts=e, top_k=k, impl=impl, precision=precision, capacity_factor=e / k)
    y, _ = jax.jit(lambda p, x: MOE_IMPLS.get(impl)(p, x, idx, w, m))(p, x)
    rel = float(jnp.abs(y - ref).max() / jnp.abs(ref).max())
    assert rel <= tol
    if precision != "f32":
        assert rel > 0  # the low-precision arithmetic really ran
