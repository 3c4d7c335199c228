"""The engine's forward pass: the model's own decoder blocks over UNSTACKED per-layer weights.

The model stacks each layer kind on a leading axis and runs it with `lax.scan` (compile time
independent of depth: right for training). At decode a step touches every weight once for a few
tokens, and slicing a layer out of a stacked array inside the compiled loop materialises a copy
of that layer's weights on every step (measured on CPU: 4x the cost of the matmuls that read them
for a batch-1 step). The engine therefore keeps a serving copy of the weights with one entry per
layer (`serving_params`, rebuilt at each weight update; the stacked originals are not kept) and
unrolls the layer loop, calling the model's block (`c2jax.model.transformer.transformer_block`: MLA with the
latent cache, dense MLP or MoE) for each layer. Everything else follows `apply`'s cached path
(see c2jax/model/cache.py for the semantics of `lengths`, segment ids and the slot mask); the
tests compare the engine against `apply` token by token.

Serving cache: ``{"lengths": [S], "layers": [{"c_kv": [S, T, kv_lora], "k_rope": [S, T, rope]}] }``
(one entry per layer, dense layers first), i.e. the model's latent cache without the stacking.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.norms import rms_norm
from c2jax.model.rope import rope_cos_sin
from c2jax.model.transformer import transformer_block
from c2jax.model import moe_dense


def _unstack(tree, n: int) -> list:
    return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def serving_params(params: dict, cfg: ModelConfig, expert_layout: Optional[str]) -> dict:
    """Per-layer weights: {embed, final_norm, lm_head, dense: [..], moe: [..], mtp: [..]}.
    `expert_layout`: None (model layout), 'fused' or 'split' (moe_dense's serving layouts)."""
    def moe_layer(lp):
        if expert_layout is not None:
            fn = {"fused": moe_dense.fuse_experts, "split": moe_dense.split_experts}[expert_layout]
            lp = dict(lp, moe=dict(lp["moe"], experts=fn(lp["moe"]["experts"])))
        return lp

    sp = {"embed": params["embed"], "final_norm": params["final_norm"], "lm_head": params["lm_head"],
          "dense": _unstack(params["dense_layers"], cfg.n_dense_layers) if cfg.n_dense_layers else [],
          "moe": [moe_layer(lp) for lp in _unstack(params["moe_layers"], cfg.n_moe_layers)] if cfg.n_moe_layers else []}
    if cfg.mtp_depth and "mtp" in params:
        sp["mtp"] = [dict(m, layer=moe_layer(m["layer"])) for m in _unstack(params["mtp"], cfg.mtp_depth)]
    return sp


_serving_jit = jax.jit(serving_params, static_argnums=(1, 2))


def prepare(params: dict, cfg: ModelConfig, expert_layout: Optional[str]) -> dict:
    """`serving_params`, compiled (one pass over the weights; fresh buffers)."""
    return _serving_jit(params, cfg, expert_layout)


def init_serving_cache(cfg: ModelConfig, slots: int, max_len: int, dtype: Optional[str] = None) -> dict:
    a, dt = cfg.attention, jnp.dtype(dtype or cfg.dtype)
    return {"lengths": jnp.zeros((slots,), jnp.int32),
            "layers": [{"c_kv": jnp.zeros((slots, max_len, a.kv_lora_rank), dt),
                        "k_rope": jnp.zeros((slots, max_len, a.qk_rope_head_dim), dt)}
                       for _ in range(cfg.num_layers)]}


def serving_apply(sp: dict, tokens: jax.Array, cfg: ModelConfig, *, segment_ids: jax.Array, cache: dict,
                  window: Optional[int] = None) -> dict:
    """Cached forward (as `apply(..., cache=...)`): tokens [B, S], segment_ids [B, S] (valid first)
    -> {logits [B,S,V] f32, hidden [B,S,D], routes [B,S,n_moe,k] int32, cache}.

    `window` (static, <= T): attention runs over the first `window` cache positions only (every
    written position must lie below it); the new latents are then written into the full cache
    at their positions (a few rows, in place under donation), so a step costs O(window)."""
    b, s = tokens.shape
    dt = jnp.dtype(cfg.dtype)
    valid = segment_ids != 0
    lengths = cache["lengths"]
    slots = lengths[:, None] + jnp.arange(s, dtype=jnp.int32)[None]  # [B, S]
    t = cache["layers"][0]["c_kv"].shape[1]
    w = t if window is None else min(window, t)
    mask = jnp.arange(w, dtype=jnp.int32)[None, None, :] <= slots[:, :, None]  # [B, S, W]
    cos, sin = rope_cos_sin(cfg.attention, slots)
    bidx = jnp.arange(b)[:, None]
    in_w = jnp.where(slots < w, slots, t)  # writes outside the window are dropped, as the model does

    def run(lp, h, i, moe):
        full = cache["layers"][i]
        if w == t:
            return transformer_block(lp, h, cos, sin, mask, cfg, full, slots, valid, None, moe=moe)
        win = {k: v[:, :w] for k, v in full.items()}
        h, nc, st = transformer_block(lp, h, cos, sin, mask, cfg, win, slots, valid, None, moe=moe)
        new = {k: full[k].at[bidx, in_w].set(nc[k][bidx, jnp.minimum(slots, w - 1)], mode="drop") for k in full}
        return h, new, st

    h = sp["embed"]["embedding"][tokens].astype(dt)
    new_layers, routes = [], []
    for i, lp in enumerate(sp["dense"]):
        h, nc, _ = run(lp, h, i, False)
        new_layers.append(nc)
    nd = len(sp["dense"])
    for j, lp in enumerate(sp["moe"]):
        h, nc, st = run(lp, h, nd + j, True)
        new_layers.append(nc)
        routes.append(st["routes"])
    hidden = rms_norm(h, sp["final_norm"]["scale"], cfg.rms_norm_eps)
    logits = jnp.einsum("bsd,dv->bsv", hidden, sp["lm_head"]["kernel"].astype(dt), preferred_element_type=jnp.float32)
    k = cfg.moe.top_k
    return {"logits": logits, "hidden": hidden,
            "routes": jnp.stack(routes, 2) if routes else jnp.zeros((b, s, 0, k), jnp.int32),
            "cache": {"lengths": lengths + valid.sum(-1).astype(jnp.int32), "layers": new_layers}}
