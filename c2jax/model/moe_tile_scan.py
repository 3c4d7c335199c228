"""Routed-expert SwiGLU over expert-sorted tiles, one tile at a time (`lax.scan`).

The tiled dropless layout (`moe_impls._tiled_swiglu`) pads each expert's sorted rows to whole tiles,
so every tile [R, D] belongs to one expert. Its batched form gathers a copy of the expert weights
for every tile ([T, D, F] per matrix: with T = 72 tiles and E = 8 experts, 9x the weights, per layer
and again in the backward) and sums per-tile weight gradients into their experts afterwards. Here a
scan walks the tiles instead: each step slices its expert's three matrices (cache-sized), runs
gate/up/SiLU/down on its R rows, and the custom VJP's backward scan adds each tile's weight
gradients straight into an [E, D, F] accumulator carried through the loop. The same products in the
same order per tile, so the result equals the batched form up to f32 summation order.

Why: on CPU the batched form's gathers and per-tile gradients are memory traffic the matmuls wait on
(`python benchmarks/model_step.py --rows jax-dropless,jax-dropless@tile-batched --modes interleaved`
times both lowerings of the whole step: on the idle 2-core machine of 2026-12-06, 1.856 s with the
scan against 2.058 s batched for the `small` preset's fwd+bwd, batch 8 x 512).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _silu_and_grad(g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """g -> (silu(g), d silu / d g)."""
    s = jax.nn.sigmoid(g)
    return g * s, s * (1 + g * (1 - s))


@jax.custom_vjp
def tile_scan_swiglu(w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, buf: jax.Array,
                     tile_expert: jax.Array) -> jax.Array:
    """buf [T, R, D] (tile t's rows all go to expert tile_expert[t]); w_gate/w_up [E, D, F],
    w_down [E, F, D] -> [T, R, D] = (silu(x W_g[e]) * (x W_u[e])) W_d[e] per tile, in buf.dtype."""
    return _forward(w_gate, w_up, w_down, buf, tile_expert, keep=False)[0]


def _forward(w_gate, w_up, w_down, buf, tile_expert, keep: bool):
    """The tile scan; with `keep` also the per-tile gate/up activations [T, R, F] the backward needs
    (without it, a forward-only call writes no residuals)."""
    dt = buf.dtype

    def body(_, xs):
        x, e = xs  # [R, D], expert id
        g = x @ w_gate[e].astype(dt)  # [R, F]
        u = x @ w_up[e].astype(dt)  # [R, F]
        y = (jax.nn.silu(g) * u) @ w_down[e].astype(dt)  # [R, D]
        return None, (y, g, u) if keep else (y,)

    return jax.lax.scan(body, None, (buf, tile_expert))[1]


def _fwd(w_gate, w_up, w_down, buf, tile_expert):
    y, g, u = _forward(w_gate, w_up, w_down, buf, tile_expert, keep=True)
    return y, (w_gate, w_up, w_down, buf, tile_expert, g, u)


def _bwd(res, dy):
    w_gate, w_up, w_down, buf, tile_expert, g, u = res
    dt = buf.dtype

    def body(acc, xs):
        dwg, dwu, dwd = acc  # [E, D, F], [E, D, F], [E, F, D] (f32)
        x, e, gt, ut, dyt = xs  # [R, D], expert, [R, F], [R, F], [R, D]
        silu, dsilu = _silu_and_grad(gt)
        h = silu * ut  # [R, F]
        dh = dyt @ w_down[e].astype(dt).T  # [R, F]
        dg, du = dh * ut * dsilu, dh * silu  # [R, F]
        dx = dg @ w_gate[e].astype(dt).T + du @ w_up[e].astype(dt).T  # [R, D]
        f32 = jnp.float32
        dwd = dwd.at[e].add((h.T @ dyt).astype(f32))
        dwg = dwg.at[e].add((x.T @ dg).astype(f32))
        dwu = dwu.at[e].add((x.T @ du).astype(f32))
        return (dwg, dwu, dwd), dx

    zeros = tuple(jnp.zeros(w.shape, jnp.float32) for w in (w_gate, w_up, w_down))
    (dwg, dwu, dwd), dx = jax.lax.scan(body, zeros, (buf, tile_expert, g, u, dy))
    return dwg.astype(w_gate.dtype), dwu.astype(w_up.dtype), dwd.astype(w_down.dtype), dx, None


tile_scan_swiglu.defvjp(_fwd, _bwd)
