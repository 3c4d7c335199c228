"""Ragged expert-parallel dispatch/combine (GPU): `jax.lax.ragged_all_to_all` sends only the rows
that exist instead of the fixed worst-case buffers of `ep_moe` (XLA:CPU does not implement it;
`ep_moe.use_ragged` picks this path on GPU only).

Protocol, inside `shard_map` over the EP axis (EP ranks):
1. sort this rank's assignment rows by destination; ``send_sizes[j]`` rows go to rank j starting
   at ``input_offsets[j]``;
2. one small all_to_all tells every rank how many rows it receives from each source
   (``recv_sizes``); each receiver lays sources out back to back (``recv_offsets``) and a second
   small all_to_all tells every sender where its rows land (``output_offsets``);
3. rows and their local expert ids go with `ragged_all_to_all` into a buffer of the worst-case
   size (shapes stay static), the experts run, and the results come back with the roles swapped.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def _exchange(v: jax.Array, axis: str) -> jax.Array:
    """v [EP] (entry j meant for rank j) -> [EP] (entry s = what rank s meant for me)."""
    return jax.lax.all_to_all(v[:, None], axis, 0, 0, tiled=True)[:, 0]


def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                               axis_name: str):
    """`jax.lax.ragged_all_to_all` semantics built from a fixed-size all_to_all (any backend):
    the protocol of `ragged_dispatch_combine` is tested on CPU with it."""
    ep = input_offsets.shape[0]
    m = operand.shape[0]
    rows = jnp.arange(m)
    pad = jnp.concatenate([operand, jnp.zeros_like(operand)], 0)  # slices never run off the end

    def segment(j):
        seg = jax.lax.dynamic_slice_in_dim(pad, input_offsets[j], m, 0)
        keep = (rows < send_sizes[j]).reshape((m,) + (1,) * (operand.ndim - 1))
        return jnp.where(keep, seg, 0)

    send = jnp.stack([segment(j) for j in range(ep)])  # [EP, m, ...]
    got = jax.lax.all_to_all(send, axis_name, 0, 0, tiled=False)  # [EP(source), m, ...]
    offs = jax.lax.all_to_all(output_offsets[:, None], axis_name, 0, 0, tiled=True)[:, 0]  # source's offset for me
    for s in range(ep):
        idx = jnp.where(rows < recv_sizes[s], offs[s] + rows, output.shape[0])  # out of range = dropped
        output = output.at[idx].set(got[s], mode="drop")
    return output


def ragged_dispatch_combine(rows: jax.Array, dest: jax.Array, lexp: jax.Array, ep: int, n_local: int,
                            axis: str, experts: Callable[[jax.Array, jax.Array], jax.Array],
                            ragged_a2a: Callable = jax.lax.ragged_all_to_all):
    """rows [M, D] (one per assignment), dest [M] rank, lexp [M] local expert id; `experts(rows,
    ids)` runs the local experts (ids == n_local marks padding). Returns (results [M, D] in the
    input order, rows received by this rank []). `ragged_a2a`: the primitive (or the emulation)."""
    m, d = rows.shape
    order = jnp.argsort(dest, stable=True)
    xs, ids = rows[order], lexp[order].astype(jnp.int32)
    send_sizes = jnp.zeros((ep,), jnp.int32).at[dest].add(1)
    input_offsets = jnp.cumsum(send_sizes) - send_sizes
    recv_sizes = _exchange(send_sizes, axis)
    recv_offsets = jnp.cumsum(recv_sizes) - recv_sizes
    output_offsets = _exchange(recv_offsets, axis)  # where my rows land on each receiver
    cap = ep * m  # worst case: every rank sends all its rows to me
    buf = jnp.zeros((cap, d), rows.dtype)
    recv = ragged_a2a(xs, buf, input_offsets, send_sizes, output_offsets, recv_sizes,
                                     axis_name=axis)
    recv_ids = ragged_a2a(ids, jnp.full((cap,), n_local, jnp.int32), input_offsets, send_sizes,
                                         output_offsets, recv_sizes, axis_name=axis)
    out = experts(recv, recv_ids)  # [cap, D]
    back_offsets = _exchange(input_offsets, axis)  # where results land back on each source
    back = ragged_a2a(out, jnp.zeros((m, d), out.dtype), recv_offsets, recv_sizes, back_offsets,
                                     send_sizes, axis_name=axis)
    inv = jnp.zeros_like(order).at[order].set(jnp.arange(m, dtype=order.dtype))
    return back[inv], recv_sizes.sum()
