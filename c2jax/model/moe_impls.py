"""Routed-expert implementations, picked by ``config.model.moe.impl`` from the `MOE_IMPLS` registry.

Every implementation has the signature
    impl(p_experts, x [N, D], idx [N, k] int32, w [N, k] f32, m: MoEConfig) -> (y [N, D], dropped)
where ``p_experts`` is the ``moe/experts`` params ({gate_proj, up_proj} [E, D, F], down_proj
[E, F, D]), ``y = sum_j w[:, j] * expert_{idx[:, j]}(x)`` and ``dropped`` is the fraction of
(token, slot) assignments that were not computed (always 0 for dropless implementations).

* ``dropless`` (reference; parity tests and decode): sort the N*k assignments by expert and run
  the grouped SwiGLU over the contiguous groups. Exact. Two lowerings (`DROPLESS_LOWERING`):
  `jax.lax.ragged_dot` (on CPU it costs about as much as running every expert on every token),
  or "tiled": each group padded to a multiple of a tile, so that every tile belongs to one expert
  (at most N*k + E*(tile-1) rows; ~4x faster on CPU for the
  small preset: ``python benchmarks/model_step.py --rows jax-dropless,jax-dropless@ragged
  --modes interleaved`` prints both). In f32 the tiles run as a scan, one tile at a time with its
  expert's weight slices and the weight gradients added into their experts inside the backward loop
  (`TILE_LOOP = "scan"`, `moe_tile_scan.py`); `TILE_LOOP = "batched"` runs them as one batched
  matmul over per-tile gathered weights, whose custom VJP re-gathers the tile weights in the
  backward instead of keeping the gathered copies (`TILED_CUSTOM_VJP`).
  'auto' takes tiled on CPU (with the batched loop only while its gathered weights stay under
  512 MiB; the scan gathers nothing).
* ``capacity`` (training on CPU): each expert gets a fixed buffer of
  ``C = min(N, ceil(capacity_factor * N * k / E))`` rows; assignments are placed by a stable sort
  (all first choices before second choices, earlier tokens first); overflow is dropped (its
  contribution is zero; the residual and shared experts still carry the token) and reported.
  The experts then run as one batched einsum over [E, C, D]. Not for decode (tiny N drops).
* ``pallas``: the dropless layout with the grouped matmuls done by
  `kernels_pallas.api.grouped_matmul` (built separately; imported lazily).

``m.precision`` selects the expert-matmul arithmetic: 'f32' (default) and 'bf16' (bf16 operands,
f32 accumulation) run in plain XLA; the low-precision recipes ('fp8_blockwise', 'mxfp8',
'nvfp4_fwd_mxfp8_bwd') go through `kernels_pallas.api.grouped_matmul(lhs, rhs, group_sizes,
precision=...)` for every implementation (the capacity layout is passed as E equal groups of C).
`expert_matmul` below is that single hook.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from typing import TYPE_CHECKING

from c2jax.model.expert_matmul import XLA_PRECISIONS, batched_expert_matmul, expert_matmul
from c2jax.model.moe_tile_scan import tile_scan_swiglu
from c2jax.model.moe_dense import NAME as SAMPLER_DENSE, dense_all_experts_moe
from c2jax.registry import Registry

if TYPE_CHECKING:
    from c2jax.model.config import MoEConfig

MoEImpl = Callable[[dict, jax.Array, jax.Array, jax.Array, "MoEConfig"], "tuple[jax.Array, jax.Array]"]
MOE_IMPLS: Registry[MoEImpl] = Registry("moe_impl")

def _sort_assignments(idx: jax.Array, n_experts: int):
    """Stable sort of the N*k assignments by expert, k-major (first choices first).

    idx [N, k] -> (order [k*N] flat (slot-major) assignment ids in sorted order,
    token [k*N] token of each sorted assignment, group_sizes [E], inverse [k*N])."""
    n, k = idx.shape
    flat_e = idx.T.reshape(-1)  # [k*N], assignment a = j*N + t
    order = jnp.argsort(flat_e, stable=True)
    token = order % n
    sizes = jnp.zeros((n_experts,), jnp.int32).at[flat_e].add(1)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return flat_e, order, token, sizes, inverse


def _swiglu_grouped(p: dict, xs: jax.Array, sizes: jax.Array, precision: str, use_kernels: bool) -> jax.Array:
    g = expert_matmul(xs, p["gate_proj"], sizes, precision, use_kernels)
    u = expert_matmul(xs, p["up_proj"], sizes, precision, use_kernels)
    return expert_matmul(jax.nn.silu(g) * u, p["down_proj"], sizes, precision, use_kernels)


# How `dropless` runs its grouped matmuls: 'ragged' (jax.lax.ragged_dot), 'tiled' (see
# `_tiled_swiglu`) or 'auto' (tiled on CPU when its gathered weights stay small, else ragged).
DROPLESS_LOWERING = "auto"
_TILED_MAX_BYTES = 1 << 29  # gathered per-tile weights of one layer (all three matrices)


# Rows per tile of the tiled dropless path (read at trace time; A/B row jax-dropless@tile-256 of
# benchmarks/model_step.py): bigger tiles mean fewer, larger matmuls but more padding rows.
TILE_ROWS = 128


def _tile_rows(n_assign: int, n_experts: int) -> int:
    """Rows per tile: TILE_ROWS, or less when experts get few assignments (multiple of 8)."""
    per = -(-n_assign // n_experts)
    return int(min(TILE_ROWS, max(8, -(-per // 8) * 8)))


# A/B switch (read at trace time; benchmarks/model_step.py row jax-dropless@gather-autodiff):
# True = `_tile_matmul` below; False = autodiff through the per-tile weight gather (which keeps
# the gathered [tiles, K, F] weights of every layer as residuals for the backward).
TILED_CUSTOM_VJP = True

# How the tiled path runs its tiles (read at trace time; A/B row jax-dropless@tile-batched of
# benchmarks/model_step.py): 'scan' = `moe_tile_scan.tile_scan_swiglu` (one tile at a time, each
# slicing its expert's weights; f32 only), 'batched' = one batched matmul over per-tile gathered
# weights (`_tiles_times_experts`).
TILE_LOOP = "scan"


@jax.custom_vjp
def _tile_matmul(buf: jax.Array, w: jax.Array, tile_expert: jax.Array) -> jax.Array:
    """buf [T, R, K] times w[tile_expert] ([E, K, F] gathered per tile) -> [T, R, F].

    Custom VJP: the backward re-gathers the tile weights from w instead of keeping the gathered
    copy as a residual (with E experts and T tiles the copy is T/E times the weights, per layer),
    and sums the per-tile weight gradients into their experts with a sorted segment sum."""
    return jnp.einsum("trk,tkf->trf", buf, w[tile_expert].astype(buf.dtype))


def _tile_matmul_fwd(buf, w, tile_expert):
    return _tile_matmul(buf, w, tile_expert), (buf, w, tile_expert)


def _tile_matmul_bwd(res, dy):
    buf, w, tile_expert = res
    d_buf = jnp.einsum("trf,tkf->trk", dy, w[tile_expert].astype(dy.dtype))  # [T, R, K]
    d_wt = jnp.einsum("trk,trf->tkf", buf, dy)  # [T, K, F] per-tile weight gradient
    d_w = jax.ops.segment_sum(d_wt, tile_expert, num_segments=w.shape[0], indices_are_sorted=True)
    return d_buf, d_w.astype(w.dtype), None


_tile_matmul.defvjp(_tile_matmul_fwd, _tile_matmul_bwd)


def _tiles_times_experts(buf: jax.Array, w: jax.Array, tile_expert: jax.Array, precision: str) -> jax.Array:
    """buf [T, R, K] times each tile's expert weights w[tile_expert] -> [T, R, F] in buf.dtype."""
    if TILED_CUSTOM_VJP and precision == "f32":
        return _tile_matmul(buf, w, tile_expert)
    return batched_expert_matmul(buf, w[tile_expert], precision)


def _tiled_swiglu(p: dict, x: jax.Array, order, token, sizes, inverse, n_experts: int, precision: str):
    """Exact grouped SwiGLU without ragged_dot: each expert's sorted rows are padded to a multiple
    of a tile, every tile belongs to one expert, and the tiles run as one batched matmul against
    per-tile gathered weights. Rows computed <= N*k + E*(tile-1) (vs ~E*N*k for ragged_dot on CPU).
    Returns expert outputs in sorted-assignment order [N*k, D]."""
    a = order.shape[0]
    n, d = x.shape
    tile = _tile_rows(a, n_experts)
    n_tiles = -(-a // tile) + n_experts  # static bound on padded tiles
    padded = (sizes + tile - 1) // tile * tile  # [E]
    pend = jnp.cumsum(padded)
    pstart = pend - padded
    gstart = jnp.cumsum(sizes) - sizes
    sorted_e = jnp.repeat(jnp.arange(n_experts, dtype=jnp.int32), sizes, total_repeat_length=a)
    row = pstart[sorted_e] + jnp.arange(a, dtype=jnp.int32) - gstart[sorted_e]  # padded row per sorted assignment
    row_token = jnp.full((n_tiles * tile,), n, jnp.int32).at[row].set(token.astype(jnp.int32))
    tile_expert = jnp.minimum(jnp.searchsorted(pend, jnp.arange(n_tiles, dtype=pend.dtype) * tile, side="right"),
                              n_experts - 1)
    x_pad = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)], axis=0)
    buf = x_pad[row_token].reshape(n_tiles, tile, d)
    if TILE_LOOP == "scan" and precision == "f32":
        out = tile_scan_swiglu(p["gate_proj"], p["up_proj"], p["down_proj"], buf, tile_expert)
        return out.reshape(n_tiles * tile, d)[row]
    g = _tiles_times_experts(buf, p["gate_proj"], tile_expert, precision)
    u = _tiles_times_experts(buf, p["up_proj"], tile_expert, precision)
    out = _tiles_times_experts(jax.nn.silu(g) * u, p["down_proj"], tile_expert, precision)
    return out.reshape(n_tiles * tile, d)[row]


def _use_tiled(p: dict, n_assign: int, n_experts: int, precision: str) -> bool:
    if DROPLESS_LOWERING != "auto":
        return DROPLESS_LOWERING == "tiled"
    if precision not in XLA_PRECISIONS or jax.default_backend() != "cpu":
        return False
    if TILE_LOOP == "scan" and precision == "f32":
        return True  # one tile's weight slices at a time: no gathered copy to bound
    n_tiles = -(-n_assign // _tile_rows(n_assign, n_experts)) + n_experts
    per_tile = sum(int(math.prod(p[k].shape[1:])) * p[k].dtype.itemsize for k in ("gate_proj", "up_proj", "down_proj"))
    return n_tiles * per_tile <= _TILED_MAX_BYTES


def _dropless(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig, use_kernels: bool):
    n, k = idx.shape
    _, order, token, sizes, inverse = _sort_assignments(idx, m.n_routed_experts)
    if not use_kernels and _use_tiled(p, n * k, m.n_routed_experts, m.precision):
        ys = _tiled_swiglu(p, x, order, token, sizes, inverse, m.n_routed_experts, m.precision)
    else:
        ys = _swiglu_grouped(p, x[token], sizes, m.precision, use_kernels)  # [k*N, D] sorted
    y = ys[inverse].reshape(k, n, -1)  # back to assignment order, [k, N, D]
    y = jnp.sum(y * w.T.astype(y.dtype)[:, :, None], axis=0)  # weighted sum over the k slots
    return y, jnp.zeros((), jnp.float32)


@MOE_IMPLS.register("dropless")
def dropless_moe(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """Sort + `jax.lax.ragged_dot` (exact; the reference)."""
    return _dropless(p, x, idx, w, m, use_kernels=False)


@MOE_IMPLS.register("pallas")
def pallas_moe(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """Sort + `kernels_pallas.api.grouped_matmul` (exact, kernel-backed)."""
    return _dropless(p, x, idx, w, m, use_kernels=True)


def capacity(n_tokens: int, m: MoEConfig) -> int:
    """Per-expert buffer rows of the capacity implementation (static)."""
    return max(1, min(n_tokens, math.ceil(m.capacity_factor * n_tokens * m.top_k / m.n_routed_experts)))


@MOE_IMPLS.register("capacity")
def capacity_moe(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """Fixed capacity per expert + one batched einsum over [E, C, D]; drops overflow."""
    n, k = idx.shape
    e, d = m.n_routed_experts, x.shape[-1]
    c = capacity(n, m)
    flat_e, order, token, sizes, inverse = _sort_assignments(idx, e)
    starts = jnp.cumsum(sizes) - sizes  # [E]
    sorted_e = flat_e[order]
    pos_sorted = jnp.arange(n * k, dtype=jnp.int32) - starts[sorted_e]  # position within expert
    keep_sorted = pos_sorted < c
    # which token fills each buffer slot (sentinel n = a zero row)
    slot_sorted = jnp.where(keep_sorted, sorted_e * c + pos_sorted, e * c)
    slot_token = jnp.full((e * c,), n, jnp.int32).at[slot_sorted].set(token.astype(jnp.int32), mode="drop")
    x_pad = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)], axis=0)
    buf = x_pad[slot_token].reshape(e, c, d)  # [E, C, D]
    g = batched_expert_matmul(buf, p["gate_proj"], m.precision)
    u = batched_expert_matmul(buf, p["up_proj"], m.precision)
    out = batched_expert_matmul(jax.nn.silu(g) * u, p["down_proj"], m.precision)  # [E, C, D]
    out_pad = jnp.concatenate([out.reshape(e * c, d), jnp.zeros((1, d), out.dtype)], axis=0)
    slot = slot_sorted[inverse]  # [k*N] slot of each assignment (e*c if dropped)
    y = out_pad[slot].reshape(k, n, d)
    y = jnp.sum(y * w.T.astype(y.dtype)[:, :, None], axis=0)  # weighted sum over the k slots
    dropped = 1.0 - keep_sorted.astype(jnp.float32).mean()
    return y, dropped


capacity_moe.drops_tokens = True  # type: ignore[attr-defined]
MOE_IMPLS.register(SAMPLER_DENSE, dense_all_experts_moe)


def drops_tokens(name: str) -> bool:
    """Whether the registered implementation `name` may drop token assignments (capacity)."""
    return bool(getattr(MOE_IMPLS.get(name), "drops_tokens", False))


def exact_moe_impls() -> list[str]:
    """The registered implementations that never drop a token: what a learner or a sampler may use."""
    return [n for n in MOE_IMPLS.names() if not drops_tokens(n)]
