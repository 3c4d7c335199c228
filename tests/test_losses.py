"""Loss terms against brute-force numpy references and their defining properties."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import losses


def _batch(rng, B=2, S=9, V=11):
    tokens = rng.integers(0, V, (B, S + 1))
    seg = np.ones((B, S), np.int32)
    seg[0, 5:] = 2  # two documents in row 0
    seg[1, 7:] = 0  # padding at the end of row 1
    mask = (seg > 0).astype(np.float32)
    mask[0, 4] = 0  # last token of doc 1 has no in-document target
    return {"tokens": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
            "loss_mask": jnp.asarray(mask), "segment_ids": jnp.asarray(seg),
            "positions": jnp.asarray(np.tile(np.arange(S), (B, 1)))}


def test_xent_matches_numpy():
    rng = np.random.default_rng(0)
    b = _batch(rng)
    logits = rng.normal(size=b["tokens"].shape + (11,)).astype(np.float32)
    val, m = losses.next_token_xent({"logits": jnp.asarray(logits)}, b)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(lp, np.asarray(b["targets"])[..., None], -1)[..., 0]
    mask = np.asarray(b["loss_mask"])
    np.testing.assert_allclose(float(val), (nll * mask).sum() / mask.sum(), rtol=1e-5)
    assert float(m["tokens"]) == mask.sum()


def test_z_loss_matches_numpy():
    rng = np.random.default_rng(1)
    b = _batch(rng)
    logits = rng.normal(size=b["tokens"].shape + (11,)).astype(np.float32) * 3
    val, _ = losses.z_loss({"logits": jnp.asarray(logits)}, b)
    lse = np.log(np.exp(logits).sum(-1))
    mask = np.asarray(b["loss_mask"])
    np.testing.assert_allclose(float(val), (lse ** 2 * mask).sum() / mask.sum(), rtol=1e-5)


def _shifted(main, d):
    return jnp.concatenate([main[:, d:], jnp.zeros_like(main[:, :d])], axis=1)


def test_mtp_distill_zero_when_mtp_equals_shifted_main_and_positive_otherwise():
    rng = np.random.default_rng(2)
    b = _batch(rng)
    main = jnp.asarray(rng.normal(size=b["tokens"].shape + (11,)), jnp.float32)
    mtp = jnp.stack([_shifted(main, 1), _shifted(main, 2)])  # [D=2, B, S, V]
    val, m = losses.mtp_self_distillation({"logits": main, "mtp_logits": mtp}, b)
    assert abs(float(val)) < 1e-6 and abs(float(m["depth2"])) < 1e-6
    # Off by one shift (the classic bug) is not zero.
    wrong = jnp.stack([main, main])
    val2, _ = losses.mtp_self_distillation({"logits": main, "mtp_logits": wrong}, b)
    assert float(val2) > 1e-2


def test_mtp_distill_matches_bruteforce_kl_and_stops_gradient_to_main():
    rng = np.random.default_rng(3)
    b = _batch(rng)
    main = jnp.asarray(rng.normal(size=b["tokens"].shape + (11,)), jnp.float32)
    mtp = jnp.asarray(rng.normal(size=(1,) + main.shape), jnp.float32)
    val, _ = losses.mtp_self_distillation({"logits": main, "mtp_logits": mtp}, b)
    # Brute force over positions.
    seg, mask = np.asarray(b["segment_ids"]), np.asarray(b["loss_mask"])
    lm = np.asarray(jax.nn.log_softmax(main, -1))
    lq = np.asarray(jax.nn.log_softmax(mtp[0], -1))
    tot, n = 0.0, 0
    B, S = seg.shape
    for bi in range(B):
        for i in range(S - 1):
            if seg[bi, i] > 0 and seg[bi, i + 1] == seg[bi, i] and mask[bi, i] and mask[bi, i + 1]:
                p = np.exp(lm[bi, i + 1])
                tot += float((p * (lm[bi, i + 1] - lq[bi, i])).sum())
                n += 1
    np.testing.assert_allclose(float(val), tot / n, rtol=1e-5)
    g_main = jax.grad(lambda x: losses.mtp_self_distillation({"logits": x, "mtp_logits": mtp}, b)[0])(main)
    assert float(jnp.abs(g_main).max()) == 0.0


def test_moe_seq_balance_is_one_when_balanced_and_e_over_k_when_collapsed():
    L, B, S, E, K = 2, 2, 8, 4, 2
    batch = {"tokens": jnp.zeros((B, S), jnp.int32), "segment_ids": jnp.ones((B, S), jnp.int32)}
    scores = jnp.full((L, B, S, E), 0.5)
    # Balanced: token t picks experts (t % 2)*2 + {0,1}, so every expert gets S*K/E picks.
    routes = np.zeros((L, B, S, K), np.int32)
    for t in range(S):
        routes[..., t, :] = [(t % 2) * 2, (t % 2) * 2 + 1]
    routes = np.moveaxis(routes, 0, 2)  # the model's layout [B, S, L, K]
    val, _ = losses.moe_sequence_balance({"router_scores": scores, "routes": jnp.asarray(routes)}, batch)
    np.testing.assert_allclose(float(val), 1.0, rtol=1e-6)
    # Collapsed: all tokens pick experts 0,1 and put all affinity there.
    sc = jnp.zeros((L, B, S, E)).at[..., :K].set(1.0)
    rt = jnp.broadcast_to(jnp.arange(K), (B, S, L, K))
    val2, _ = losses.moe_sequence_balance({"router_scores": sc, "routes": rt}, batch)
    np.testing.assert_allclose(float(val2), E / K, rtol=1e-6)


def test_combined_loss_weights_terms_and_rejects_unknown_names():
    rng = np.random.default_rng(4)
    b = _batch(rng)
    out = {"logits": jnp.asarray(rng.normal(size=b["tokens"].shape + (11,)), jnp.float32)}
    x, _ = losses.next_token_xent(out, b)
    z, _ = losses.z_loss(out, b)
    tot, m = losses.combined_loss(out, b, {"xent": 1.0, "z_loss": {"weight": 0.5}})
    np.testing.assert_allclose(float(tot), float(x) + 0.5 * float(z), rtol=1e-6)
    assert set(m) >= {"loss/xent", "loss/z_loss", "loss/total", "xent/tokens"}
    with pytest.raises(KeyError, match="known"):
        losses.combined_loss(out, b, {"xnet": 1.0})


def test_moe_seq_balance_matches_the_models_own_balance_loss():
    from c2jax.model.config import MoEConfig
    from c2jax.model.moe_router import sequence_balance_loss

    rng = np.random.default_rng(5)
    L, B, S, E, K = 2, 3, 10, 8, 2
    scores = jnp.asarray(rng.uniform(size=(L, B, S, E)), jnp.float32)
    routes = jnp.asarray(np.argsort(-rng.uniform(size=(B, S, L, E)), -1)[..., :K], jnp.int32)
    seg = np.ones((B, S), np.int32)
    seg[2, 6:] = 0
    batch = {"tokens": jnp.zeros((B, S), jnp.int32), "segment_ids": jnp.asarray(seg)}
    val, _ = losses.moe_sequence_balance({"router_scores": scores, "routes": routes}, batch)
    ref = np.mean([float(sequence_balance_loss(scores[layer], routes[:, :, layer], jnp.asarray(seg > 0),
                                               MoEConfig(n_routed_experts=E, top_k=K))) for layer in range(L)])
    np.testing.assert_allclose(float(val), ref, rtol=1e-5)
