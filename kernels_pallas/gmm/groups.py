"""Group bookkeeping for ragged grouped matmuls (all jit-able, static shapes).

Rows of `lhs` are sorted by group (expert); `group_sizes[g]` rows belong to group g, rows past
`sum(group_sizes)` belong to no group (their outputs are zero, as in `jax.lax.ragged_dot`).

* `tile_schedule`: the (m-tile, group) work items a tiled kernel visits, megablox style: every
  row tile is split at group boundaries, so a tile shared by k groups is visited k times.
* `pad_groups` / `unpad_groups`: move each group to a start that is a multiple of `align`
  (zero rows in between) so that quantisation blocks along the token axis (32 for MX, 128 for
  FP8 blockwise) never straddle two experts — needed for wgrad.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def group_bounds(group_sizes: jax.Array):
    """(starts, ends) int32 of each group's row range."""
    gs = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(gs)
    return ends - gs, ends


def tile_schedule(group_sizes: jax.Array, m: int, tm: int):
    """Work items for row tiles of `tm` rows: (item_group, item_tile, item_first, item_last).

    Static length `m // tm + G` (an upper bound); surplus items repeat the last real item (they
    recompute and rewrite the same values). `item_first` marks the first visit of a row tile
    (its rows outside the group are written as zeros); `item_last` marks the last item of a group
    (the wgrad kernel writes its accumulator there). Requires m % tm == 0.
    """
    g = group_sizes.shape[0]
    starts, ends = group_bounds(group_sizes)
    n_items = m // tm + g
    nonempty = group_sizes > 0
    first_t = starts // tm
    last_t = jnp.maximum(ends - 1, 0) // tm
    count = jnp.where(nonempty, last_t - first_t + 1, 0)
    cum = jnp.cumsum(count)
    total = cum[-1]
    i = jnp.arange(n_items, dtype=jnp.int32)
    i_eff = jnp.minimum(i, jnp.maximum(total - 1, 0))
    grp = jnp.searchsorted(cum, i_eff, side="right").astype(jnp.int32)
    grp = jnp.minimum(grp, g - 1)
    tile = first_t[grp] + (i_eff - (cum[grp] - count[grp]))
    tile = jnp.where(total > 0, tile, 0).astype(jnp.int32)
    grp = jnp.where(total > 0, grp, 0)
    prev_tile = jnp.concatenate([jnp.full((1,), -1, jnp.int32), tile[:-1]])
    first = (tile != prev_tile) & (i < jnp.maximum(total, 1))
    next_grp = jnp.concatenate([grp[1:], jnp.full((1,), -1, jnp.int32)])
    last = ((grp != next_grp) | (i == total - 1)) & (i < total)
    return grp, tile, first.astype(jnp.int32), last.astype(jnp.int32)


def padded_size(m: int, g: int, align: int, multiple: int = 1) -> int:
    """Static row count after padding every group to a multiple of `align`."""
    mp = m + g * (align - 1)
    mult = max(align, multiple)
    return -(-mp // mult) * mult


def pad_groups(x: jax.Array, group_sizes: jax.Array, align: int, multiple: int = 1):
    """Rows regrouped so each group starts at a multiple of `align` (zeros between groups).

    Returns (x_padded (Mp, ...), padded_group_sizes, src_index (Mp,) with -1 for padding rows).
    """
    m, g = x.shape[0], group_sizes.shape[0]
    mp = padded_size(m, g, align, multiple)
    gs = group_sizes.astype(jnp.int32)
    pgs = (gs + align - 1) // align * align
    pstarts, pends = group_bounds(pgs)
    starts, _ = group_bounds(gs)
    j = jnp.arange(mp, dtype=jnp.int32)
    grp = jnp.minimum(jnp.searchsorted(pends, j, side="right"), g - 1)
    off = j - pstarts[grp]
    valid = (off < gs[grp]) & (j < pends[-1])
    src = jnp.where(valid, starts[grp] + off, -1)
    xp = jnp.where(valid.reshape(-1, *([1] * (x.ndim - 1))), x[jnp.maximum(src, 0)], 0)
    return xp.astype(x.dtype), pgs, src


def unpad_groups(xp: jax.Array, src: jax.Array, m: int) -> jax.Array:
    """Inverse of `pad_groups` for row-aligned outputs: scatter padded rows back to (m, ...)."""
    out = jnp.zeros((m, *xp.shape[1:]), xp.dtype)
    return out.at[jnp.where(src >= 0, src, m)].set(xp, mode="drop")
