"""`attention_recompute.attend_heads_recompute` (the flash-style backward behind
`mla.ATTN_BACKWARD = "recompute"`) against autodiff of `mla._attend_heads`: the forward bit for bit,
the gradients of q, k and v to float rounding, with causal blocks, padded (fully masked) query rows
and a padding mask, in f32 and bf16; plus controls that the switch really routes through the
custom VJP and that the gradient check can tell a wrong backward from the right one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import attention_recompute, mla

B, H, S, QK, V = 2, 3, 64, 12, 8


def _inputs(dtype, key=0):
    ks = jax.random.split(jax.random.key(key), 4)
    q = jax.random.normal(ks[0], (B, H, S, QK), dtype)  # [B,H,S,qk]
    k = jax.random.normal(ks[1], (B, H, S, QK), dtype)  # [B,H,T,qk]
    v = jax.random.normal(ks[2], (B, H, S, V), dtype)  # [B,H,T,v]
    causal = jnp.tril(jnp.ones((S, S), bool))
    valid = jnp.arange(S)[None, :] < jnp.array([S, S - 10])[:, None]  # row 1: last 10 keys are padding
    mask = causal[None] & valid[:, None, :]  # [B,S,T]
    mask = mask.at[1, -3:].set(False)  # three fully masked (padded) query rows
    w = jax.random.normal(ks[3], (B, H, S, V), jnp.float32)  # cotangent weights
    return q, k, v, mask, w


def _grads(fn, q, k, v, mask, w):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, mask).astype(jnp.float32) * w)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-2)])
def test_forward_identical_and_gradients_agree(n, dtype, rtol):
    q, k, v, mask, w = _inputs(dtype)
    scale = QK ** -0.5
    ref = lambda q, k, v, mask: mla._attend_heads(q, k, v, mask, None, n, scale, dtype)
    new = lambda q, k, v, mask: attention_recompute.attend_heads_recompute(q, k, v, mask, n, scale, dtype)
    o_ref, o_new = jax.jit(ref)(q, k, v, mask), jax.jit(new)(q, k, v, mask)
    np.testing.assert_array_equal(np.asarray(o_new.astype(jnp.float32)), np.asarray(o_ref.astype(jnp.float32)))
    for name, g_new, g_ref in zip("qkv", _grads(new, q, k, v, mask, w), _grads(ref, q, k, v, mask, w)):
        g_new, g_ref = np.asarray(g_new, np.float32), np.asarray(g_ref, np.float32)
        assert np.isfinite(g_new).all(), name
        assert np.max(np.abs(g_new - g_ref)) <= rtol * np.max(np.abs(g_ref)), (name, np.max(np.abs(g_new - g_ref)))


def test_gradient_check_rejects_a_wrong_backward():
    """Positive control: the same check fails for the backward fed slightly wrong row statistics
    (row sums l off by 1%: recomputed probabilities 1% off), so agreement above is evidence."""
    q, k, v, mask, w = _inputs(jnp.float32)
    scale = QK ** -0.5
    ref = lambda q, k, v, mask: mla._attend_heads(q, k, v, mask, None, 4, scale, jnp.float32)
    fwd = lambda q, k, v, mask: attention_recompute._fwd(q, k, v, mask, 4, scale, jnp.float32)

    def wrong_fwd(q, k, v, mask):
        o, (q, k, v, mask, o, m, l) = fwd(q, k, v, mask)
        return o, (q, k, v, mask, o, m, l * 1.01)

    wrong = jax.custom_vjp(lambda q, k, v, mask: fwd(q, k, v, mask)[0])
    wrong.defvjp(wrong_fwd, lambda res, do: attention_recompute._bwd(4, scale, jnp.float32, res, do))
    for g_wrong, g_ref in zip(_grads(wrong, q, k, v, mask, w), _grads(ref, q, k, v, mask, w)):
        g_wrong, g_ref = np.asarray(g_wrong), np.asarray(g_ref)
        assert np.max(np.abs(g_wrong - g_ref)) > 100 * 2e-6 * np.max(np.abs(g_ref))


def test_switch_routes_training_attention_only(monkeypatch):
    """With `ATTN_BACKWARD = "recompute"` the model's cache-free forward (training, the RL learner)
    goes through the custom VJP (its traced jaxpr holds a custom_vjp call of `attend_heads_recompute`, autodiff's does not;
    the gradient's jaxpr would have it inlined) and its gradients agree with autodiff's, while
    a forward over a KV cache (the engine's prefill) never does: sampling stays bit for bit."""
    from c2jax.model import apply, init, init_cache, preset

    cfg = preset("tiny").replace(**{"moe.impl": "dropless"})
    params = init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, cfg.vocab_size)  # [B, S]

    def trace():  # fresh functions each time: jax caches a traced function's jaxpr by identity
        loss = lambda p: jnp.mean(apply(p, tokens, cfg)["logits"].astype(jnp.float32) ** 2)
        prefill = lambda p: apply(p, tokens, cfg, cache=init_cache(cfg, 2, 64))["logits"]
        return str(jax.make_jaxpr(loss)(params)), str(jax.make_jaxpr(prefill)(params)), jax.grad(loss)(params)

    assert mla.ATTN_BACKWARD == "recompute"  # the default
    monkeypatch.setattr(mla, "ATTN_BACKWARD", "autodiff")
    train_autodiff, prefill_autodiff, g_autodiff = trace()
    monkeypatch.setattr(mla, "ATTN_BACKWARD", "recompute")
    train_recompute, prefill_recompute, g_recompute = trace()
    assert "attend_heads_recompute" not in train_autodiff and "attend_heads_recompute" in train_recompute
    assert "attend_heads_recompute" not in prefill_autodiff + prefill_recompute
    for g, g0 in zip(jax.tree_util.tree_leaves(g_recompute), jax.tree_util.tree_leaves(g_autodiff)):
        assert float(jnp.max(jnp.abs(g - g0))) <= 1e-5 * (float(jnp.max(jnp.abs(g0))) + 1e-12)


def test_unknown_backward_is_refused_by_name():
    """A misspelt backward (e.g. a benchmark variant's value) fails at trace time, naming the allowed
    values, instead of silently running the autodiff path."""
    from c2jax.model import preset

    cfg = preset("tiny")
    a, h = cfg.attention, cfg.num_heads
    z = lambda *s: jnp.zeros(s)
    args = ({"kv_b_proj": {"kernel": z(a.kv_lora_rank, h, a.qk_nope_head_dim + a.v_head_dim)}},
            z(1, 4, h, a.qk_nope_head_dim), z(1, 4, h, a.qk_rope_head_dim), z(1, 4, a.kv_lora_rank),
            z(1, 4, a.qk_rope_head_dim), jnp.tril(jnp.ones((4, 4), bool))[None], cfg)
    with pytest.raises(ValueError, match="recomptue.*autodiff.*recompute"):
        mla.attend_expanded(*args, backward="recomptue")
    assert mla.attend_expanded(*args, backward="recompute").shape == (1, 4, h, a.v_head_dim)
