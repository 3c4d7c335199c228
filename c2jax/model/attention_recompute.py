"""Causal-block attention whose backward recomputes the probabilities (flash-style) instead of
saving them.

Autodiff of `mla._attend_heads` keeps every block's probabilities P [B,H,blk,hi] as residuals, so
a layer scan stacks (and zero-fills) [layers, B, H, S, T]-sized buffers for the backward, and it
computes dV = P^T dO and dK = dS^T Q as products that contract the query axis ("TN" products,
which XLA:CPU runs off its fast matmul path; `benchmarks/attention_dots.py`). This custom VJP
saves only q, k, v, the output and each query row's softmax statistics (max m and sum l), and
the backward works in the transposed layout: it recomputes S^T = K Q^T [B,H,hi,blk] and
P^T = exp(S^T - m) / l, so dV = P^T dO and dK = dS^T Q are plain ("NN") products and only
dQ = dS K contracts the key-major axis.

The forward is the same computation as `mla._attend_heads` (same matmuls, same masked softmax: bit
for bit on its own; inside a whole compiled model XLA may fuse it differently, ~2e-6); the backward
sums in another order (gradients agree to float rounding; `tests/model/test_model_attention_recompute.py`).
Selected by `mla.ATTN_BACKWARD = "recompute"`, the default since 2026-12-07 (README, "Performance
figures": the RL learner's step 1.33x faster, the `small` train step 8-9% alone).
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

NEG_LOGIT = -1e30  # masked logit (finite so fully masked padded rows stay NaN-free); mla uses it too
BACKWARDS = ("autodiff", "recompute")  # the values of mla.ATTN_BACKWARD / attend_expanded(backward=...)


def causal_blocks(n: int, s_len: int, t_len: int) -> list[tuple[slice, int]]:
    """The n causal query blocks of S queries over T keys: (query rows, keys up to) per block; block i
    scores the keys up to its own end, n = 1 scores all T keys."""
    blk = s_len // n
    return [(slice(i * blk, (i + 1) * blk), t_len if n == 1 else (i + 1) * blk) for i in range(n)]


def _block_forward(q_blk: jax.Array, k_blk: jax.Array, v_blk: jax.Array, mask_blk: jax.Array,
                   scale: float, dt) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One causal block: q [B,H,blk,qk], k [B,H,hi,qk], v [B,H,hi,v], mask [B|1,blk,hi] ->
    (o [B,H,blk,v], row max m [B,H,blk] f32, row sum l [B,H,blk] f32). The same operations as
    `jax.nn.softmax` over the masked scores (so the output is bit-identical to `mla._attend_heads`)."""
    s = jnp.einsum("bhsk,bhtk->bhst", q_blk, k_blk, preferred_element_type=jnp.float32)  # [B,H,blk,hi]
    s = jnp.where(mask_blk[:, None], s * scale, NEG_LOGIT)
    m = jnp.max(s, axis=-1, keepdims=True)  # [B,H,blk,1]
    e = jnp.exp(s - m)
    l = jnp.sum(e, axis=-1, keepdims=True)  # [B,H,blk,1]
    prob = (e / l).astype(dt)
    o = jnp.einsum("bhst,bhtv->bhsv", prob, v_blk)  # [B,H,blk,v]
    return o, m[..., 0], l[..., 0]


def _forward(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, n: int, scale: float, dt):
    """All n causal blocks -> (o [B,H,S,v], m [B,H,S], l [B,H,S])."""
    outs, ms, ls = [], [], []
    for rows, hi in causal_blocks(n, q.shape[2], k.shape[2]):
        o, m, l = _block_forward(q[:, :, rows], k[:, :, :hi], v[:, :, :hi], mask[:, rows, :hi], scale, dt)
        outs.append(o), ms.append(m), ls.append(l)
    cat = (lambda xs: xs[0]) if n == 1 else (lambda xs: jnp.concatenate(xs, axis=2))
    return cat(outs), cat(ms), cat(ls)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def attend_heads_recompute(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                           n: int, scale: float, dt) -> jax.Array:
    """Heads-major q [B,H,S,qk], k [B,H,T,qk], v [B,H,T,v], mask [B|1,S,T] bool -> o [B,H,S,v]:
    `mla._attend_heads` without rotary split, with the queries in n causal blocks (block i scores
    keys up to its own end; n = 1 scores all T keys), and a backward that recomputes P."""
    return _forward(q, k, v, mask, n, scale, dt)[0]


def _fwd(q, k, v, mask, n, scale, dt):
    o, m, l = _forward(q, k, v, mask, n, scale, dt)
    return o, (q, k, v, mask, o, m, l)


def _bwd(n, scale, dt, res, do):
    """Per block, in the key-major (transposed) layout:
        S^T = K Q^T * scale (masked)   P^T = exp(S^T - m) / l     [B,H,hi,blk]
        dV += P^T dO                   dP^T = V dO^T
        dS^T = P^T (dP^T - delta) * scale, delta = rowsum(dO * O) [B,H,blk]
        dK += dS^T Q                   dQ = (dS^T)^T K
    """
    q, k, v, mask, o, m, l = res
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)  # [B,H,S]
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    dqs = []
    for rows, hi in causal_blocks(n, q.shape[2], k.shape[2]):
        q_b, do_b = q[:, :, rows], do[:, :, rows]  # [B,H,blk,qk], [B,H,blk,v]
        k_b, v_b = k[:, :, :hi], v[:, :, :hi]  # [B,H,hi,qk], [B,H,hi,v]
        mask_t = jnp.swapaxes(mask[:, rows, :hi], 1, 2)[:, None]  # [B|1,1,hi,blk]
        st = jnp.einsum("bhtk,bhsk->bhts", k_b, q_b, preferred_element_type=jnp.float32)  # [B,H,hi,blk]
        st = jnp.where(mask_t, st * scale, NEG_LOGIT)
        pt = jnp.exp(st - m[:, :, None, rows]) / l[:, :, None, rows]  # [B,H,hi,blk] f32
        dv_b = jnp.einsum("bhts,bhsv->bhtv", pt.astype(dt), do_b, preferred_element_type=jnp.float32)
        dpt = jnp.einsum("bhtv,bhsv->bhts", v_b, do_b, preferred_element_type=jnp.float32)  # [B,H,hi,blk]
        dst = jnp.where(mask_t, pt * (dpt - delta[:, :, None, rows]), 0.0) * scale
        dst = dst.astype(dt)
        dk_b = jnp.einsum("bhts,bhsk->bhtk", dst, q_b, preferred_element_type=jnp.float32)  # [B,H,hi,qk]
        dqs.append(jnp.einsum("bhts,bhtk->bhsk", dst, k_b, preferred_element_type=jnp.float32))
        if hi == k.shape[2]:
            dk, dv = dk + dk_b, dv + dv_b
        else:
            dk = dk.at[:, :, :hi].add(dk_b)
            dv = dv.at[:, :, :hi].add(dv_b)
    dq = dqs[0] if n == 1 else jnp.concatenate(dqs, axis=2)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


attend_heads_recompute.defvjp(_fwd, _bwd)
