"""A tiny pure-JAX language model with a router, for training-loop tests that must not depend on
the real model: embedding -> one sigmoid-routed mixing layer with a selection-only bias -> LM head.

It has the real model's output contract (logits, mtp_logits, router_scores, routes, expert_counts)
and parameter names for the router bias, so the train step, the aux-loss-free update and the
checkpoints are exercised on it exactly as on the real model.
"""
import jax
import jax.numpy as jnp

V, D, E, K = 32, 16, 4, 2


def init(rng, vocab=V, dim=D, experts=E):
    k = jax.random.split(rng, 5)
    return {
        "embed": {"embedding": jax.random.normal(k[0], (vocab, dim)) * 0.1},
        "moe_layers": {"moe": {"router": {"kernel": jax.random.normal(k[1], (1, dim, experts)) * 0.1,
                                          "bias": jnp.zeros((1, experts))},
                               "experts": {"w": jax.random.normal(k[2], (1, experts, dim, dim)) * 0.1}}},
        "final_norm": {"scale": jnp.ones((dim,))},
        "lm_head": {"kernel": jax.random.normal(k[3], (dim, vocab)) * 0.1},
        "mtp": {"proj": {"kernel": jax.random.normal(k[4], (1, dim, dim)) * 0.1}},
    }


def trainable(params):
    mask = jax.tree_util.tree_map(lambda _: True, params)
    mask["moe_layers"]["moe"]["router"]["bias"] = False
    return mask


def apply(params, batch):
    tokens = batch["tokens"]  # [B, S]
    h = params["embed"]["embedding"][tokens]  # [B, S, D]
    # causal prefix mean so the model can use context (masked by segment)
    seg = batch["segment_ids"]
    S = tokens.shape[1]
    causal = jnp.tril(jnp.ones((S, S), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    att = causal / jnp.maximum(causal.sum(-1, keepdims=True), 1)
    h = h + jnp.einsum("bst,btd->bsd", att, h)
    router = params["moe_layers"]["moe"]["router"]
    scores = jax.nn.sigmoid(h @ router["kernel"][0])  # [B, S, E]
    _, routes = jax.lax.top_k(scores + jax.lax.stop_gradient(router["bias"][0]), K)  # [B, S, K]
    gate = jnp.take_along_axis(scores, routes, -1)  # [B, S, K]
    w = params["moe_layers"]["moe"]["experts"]["w"][0]  # [E, D, D]
    ex = jnp.einsum("bsd,edf->bsef", h, w)  # [B, S, E, D]
    sel = jnp.take_along_axis(ex, routes[..., None], 2)  # [B, S, K, D]
    h = h + jnp.sum(gate[..., None] * jnp.tanh(sel), 2)
    h = h * params["final_norm"]["scale"]
    logits = h @ params["lm_head"]["kernel"]
    mtp_h = jnp.tanh(h @ params["mtp"]["proj"]["kernel"][0])
    mtp_logits = (mtp_h @ params["lm_head"]["kernel"])[None]
    counts = jnp.sum(jax.nn.one_hot(routes, scores.shape[-1]), axis=(0, 1, 2))[None]  # [1, E]
    return {"logits": logits, "mtp_logits": mtp_logits, "router_scores": scores[None],
            "routes": routes[:, :, None], "expert_counts": counts}


def random_batch(rng, B=4, S=16, vocab=V):
    import numpy as np

    r = np.random.default_rng(rng)
    toks = r.integers(0, vocab, (B, S + 1))
    toks[:, 1::2] = (toks[:, 0:-1:2] + 1) % vocab  # learnable structure: odd = prev + 1
    seg = np.ones((B, S), np.int32)
    return {"tokens": jnp.asarray(toks[:, :-1], jnp.int32), "targets": jnp.asarray(toks[:, 1:], jnp.int32),
            "loss_mask": jnp.ones((B, S), jnp.float32), "segment_ids": jnp.asarray(seg),
            "positions": jnp.asarray(np.tile(np.arange(S), (B, 1)), jnp.int32)}
