"""DeepSeek-V3 multi-token prediction (MTP) modules, sharing the embedding and LM head.

Depth k = 1..mtp_depth (params ``mtp`` stacked on ``mtp_layers``):
    h_k[i] = Block_k( eh_proj( concat( enorm_k(Emb(t[i + k])), hnorm_k(h_{k-1}[i]) ) ) )
    g_k    = final_norm_k(h_k)      (HF `MtpLayer.post_norm` / DeepSeek `shared_head.norm`)
    mtp_logits[k-1][i] = LMHead(g_k[i])   predicts token t[i + k + 1]
with h_0 = the main model's final (normed) hidden state and h_{k} fed forward as g_k (as HF does).
Tokens past the end are filled with 0; the last k + 1 positions of depth k have no target and the
loss must mask them (and positions whose target lies in another packed segment).
Block_k is a MoE decoder block attending with the same mask and positions as the main model.
MTP runs only without a cache; its routers route freely (router replay covers the main layers).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.norms import dense, rms_norm


def shift_tokens(tokens: jax.Array, k: int) -> jax.Array:
    """tokens [B, S] -> t[i + k] with zeros past the end."""
    return jnp.pad(tokens[:, k:], ((0, 0), (0, k)))


def mtp_forward(params: dict, hidden: jax.Array, tokens: jax.Array, cfg: ModelConfig,
                block_fn: Callable) -> tuple[jax.Array, jax.Array, jax.Array]:
    """hidden [B, S, D] (main final-normed), tokens [B, S] -> (mtp_logits [depth, B, S, V] f32,
    expert counts [depth, E], balance loss [depth]). `block_fn(layer_params, h) -> (h, stats)`
    runs one MoE decoder block with the caller's mask and positions."""
    emb = params["embed"]["embedding"]
    dt = hidden.dtype
    shifted = jnp.stack([shift_tokens(tokens, k + 1) for k in range(cfg.mtp_depth)])  # [depth, B, S]

    def step(h_prev, xs):
        p, tok = xs
        e = emb[tok].astype(dt)
        z = jnp.concatenate([rms_norm(e, p["enorm"]["scale"], cfg.rms_norm_eps),
                             rms_norm(h_prev, p["hnorm"]["scale"], cfg.rms_norm_eps)], axis=-1)
        h = dense(z, p["eh_proj"]["kernel"])
        h, stats = block_fn(p["layer"], h)
        g = rms_norm(h, p["final_norm"]["scale"], cfg.rms_norm_eps)
        logits = dense(g, params["lm_head"]["kernel"]).astype(jnp.float32)
        return g, (logits, stats["counts"], stats["balance_loss"])

    _, (logits, counts, bal) = jax.lax.scan(step, hidden, (params["mtp"], shifted))
    return logits, counts, bal
