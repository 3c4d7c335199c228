"""Expert parallelism: token dispatch/combine for the routed experts inside `shard_map`.

Routed experts [E, D, F] are sharded over the mesh axis ``expert`` (EP ranks, E/EP local experts
each); tokens are sharded over every token axis (data, fsdp, expert, context). Routing runs before
(under GSPMD, `moe.moe_block`); this module replaces the routed-expert computation
(`moe_impls.MOE_IMPLS` signature) with:

1. dispatch: each (token, slot) assignment goes to rank ``idx // (E/EP)``. On CPU a fixed-size
   `all_to_all` (``ragged_all_to_all`` is not implemented on XLA:CPU): the send buffer is
   [EP, cap, D] with ``cap = n_local * min(top_k, E/EP)``, the most assignments one rank can
   send to another (a token's k experts are distinct), so no token is ever dropped however
   uneven the load. On GPU (``ragged='auto'``, unquantised dispatch) `jax.lax.ragged_all_to_all`
   sends only the rows that exist (`ep_ragged`; its offsets protocol is tested on CPU through an
   emulation of the primitive, the primitive itself only runs on GPU).
2. local experts: received rows sorted by local expert, `moe_impls.expert_matmul` (ragged_dot, or
   the kernels for low-precision recipes / impl 'pallas'); padding rows fall outside every group.
3. combine: results return by the inverse exchange, in the compute dtype (high precision), and the
   gate-weighted sum over the k slots happens on the token's own rank in float32.

Quantise-before-dispatch (``quant``: a `kernels_pallas` block format such as 'mxfp8_e4m3'): the
send buffer is block-quantised, the codes and scales cross the all_to_all (about 1/4 of the f32
bytes for 8-bit formats) and are dequantised on arrival; the backward pass sends the cotangents
back unquantised. When the experts themselves run in low precision their kernels quantise again;
the error of quantising twice is bounded in tests/model/parallel/test_sharding_ep.py.

Without an ``expert`` axis (``mesh.expert == 1``) but with tokens split over other axes (data, fsdp,
context), `local_moe` runs ``moe.impl`` inside `shard_map` on each device's own tokens with every
expert present. Left to the partitioner, dropless routing's sort over a sharded token axis gathers
every token to every device, so each device computed the whole batch's experts: a data-parallel
step on two host devices took 2.14 s against one device's 1.82 s (benchmarks/host_devices.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from c2jax.model.config import MoEConfig
from c2jax.model.expert_matmul import expert_matmul

EP_AXIS = "expert"


# ---- quantised transport (hook for the kernels package) -----------------------------------------

def _kernels_quant():
    try:
        from kernels_pallas import api  # type: ignore
    except ImportError as e:  # pragma: no cover - depends on the kernels package being present
        raise NotImplementedError(f"dispatch_quant needs kernels_pallas.api.quantize, which could not be "
                                  f"imported: {e}") from e
    return api


def quantize_dequantize(x: jax.Array, fmt: str) -> jax.Array:
    """Round trip through the block format `fmt` along the last axis (what the receiver sees)."""
    api = _kernels_quant()
    return api.dequantize(api.quantize(x, fmt, axis=-1), x.dtype)


def _a2a(x, axis):
    return jax.lax.all_to_all(x, axis, 0, 0, tiled=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def quantized_all_to_all(x: jax.Array, fmt: Optional[str], axis: str) -> jax.Array:
    """all_to_all of x [EP, ...] over `axis`; with `fmt` the payload is the quantised codes and
    scales (dequantised on arrival). Gradient: the plain inverse all_to_all of the cotangent."""
    if fmt is None:
        return _a2a(x, axis)
    api = _kernels_quant()
    q = api.quantize(x, fmt, axis=-1)
    if q.global_scale is not None:
        raise ValueError(f"dispatch format {fmt!r} has a per-tensor scale; use a block-scaled format")
    q = dataclasses.replace(q, data=_a2a(q.data, axis), scales=_a2a(q.scales, axis))
    return api.dequantize(q, x.dtype)


def _qa2a_fwd(x, fmt, axis):
    return quantized_all_to_all(x, fmt, axis), None


def _qa2a_bwd(fmt, axis, _, g):
    return (_a2a(g, axis),)


quantized_all_to_all.defvjp(_qa2a_fwd, _qa2a_bwd)


# ---- local pieces ----------------------------------------------------------------------------------

def dispatch_layout(idx: jax.Array, n_experts: int, n_ranks: int):
    """Where each assignment goes. idx [n, k] -> (dest [n*k] rank, local expert [n*k], pos [n*k]
    row in the per-destination buffer, cap). Assignment a = t*k + j (token-major)."""
    n, k = idx.shape
    el = n_experts // n_ranks
    flat = idx.reshape(-1)
    dest = flat // el
    lexp = flat % el
    onehot = (dest[:, None] == jnp.arange(n_ranks)[None]).astype(jnp.int32)  # [n*k, EP]
    pos = jnp.take_along_axis(jnp.cumsum(onehot, 0) - 1, dest[:, None], axis=1)[:, 0]
    cap = n * min(k, el)
    return dest, lexp, pos, cap


def local_experts(p: dict, x: jax.Array, lexp: jax.Array, n_local: int, m: MoEConfig) -> jax.Array:
    """SwiGLU of rows x [M, D] by local expert ids lexp [M] (n_local = padding, output 0)."""
    order = jnp.argsort(lexp, stable=True)
    sizes = jnp.zeros((n_local + 1,), jnp.int32).at[lexp].add(1)[:n_local]
    xs = x[order]
    use_k = m.impl == "pallas"
    g = expert_matmul(xs, p["gate_proj"], sizes, m.precision, use_k)
    u = expert_matmul(xs, p["up_proj"], sizes, m.precision, use_k)
    ys = expert_matmul(jax.nn.silu(g) * u, p["down_proj"], sizes, m.precision, use_k)
    inv = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    pad = lexp[:, None] < n_local  # rows outside every group: force exact zeros
    return jnp.where(pad, ys[inv], 0)


def ep_moe_local(p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig, *, axis: str = EP_AXIS,
                 quant: Optional[str] = None, ragged: object = False, stats: bool = False):
    """Body inside `shard_map`: local tokens x [n, D], idx/w [n, k]; p = local experts [E/EP, ...].
    Returns (y [n, D], dropped [] = 0) (+ rows received per rank [1] when `stats`)."""
    ep = jax.lax.axis_size(axis)
    e = m.n_routed_experts
    el = e // ep
    n, k = idx.shape
    d = x.shape[-1]
    dest, lexp, pos, cap = dispatch_layout(idx, e, ep)
    tok = jnp.arange(n * k) // k
    if ragged:
        from c2jax.model.parallel import ep_ragged

        a2a = ep_ragged.emulated_ragged_all_to_all if ragged == "emulated" else jax.lax.ragged_all_to_all
        back, received = ep_ragged.ragged_dispatch_combine(
            x[tok], dest, lexp, ep, el, axis, lambda rows, ids: local_experts(p, rows, ids, el, m), a2a)
    else:
        send_x = jnp.zeros((ep, cap, d), x.dtype).at[dest, pos].set(x[tok])
        send_e = jnp.full((ep, cap), el, jnp.int32).at[dest, pos].set(lexp.astype(jnp.int32))
        recv_x = quantized_all_to_all(send_x, quant, axis)  # [EP(source), cap, D]
        recv_e = _a2a(send_e, axis)
        out = local_experts(p, recv_x.reshape(ep * cap, d), recv_e.reshape(-1), el, m).reshape(ep, cap, d)
        back = _a2a(out, axis)[dest, pos]  # [n*k, D] results in assignment order
        received = (recv_e < el).sum()
    y = jnp.einsum("nkd,nk->nd", back.reshape(n, k, d).astype(jnp.float32), w.astype(jnp.float32))
    res = (y.astype(x.dtype), jnp.zeros((), jnp.float32))
    return res + (received[None],) if stats else res


def use_ragged(ragged: str):
    """'auto': ragged_all_to_all on GPU only (XLA:CPU does not implement it); 'never'; 'always';
    'emulated' (the ragged protocol over a fixed-size all_to_all: tests the offsets on CPU)."""
    if ragged == "emulated":
        return "emulated"
    if ragged == "always":
        return True
    return ragged == "auto" and jax.default_backend() == "gpu"


def ep_moe(mesh: Mesh, p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig, *,
           quant: Optional[str] = None, ragged: str = "auto", stats: bool = False):
    """Expert-parallel routed experts on global arrays x [N, D], idx/w [N, k] (tokens sharded over
    all token axes, experts over ``expert``). Same result as `moe_impls.dropless_moe`."""
    from c2jax.model.parallel.sharding import activation_spec

    ep = mesh.shape[EP_AXIS]
    if m.n_routed_experts % ep:
        raise ValueError(f"mesh.expert={ep} must divide n_routed_experts={m.n_routed_experts}")
    tok = activation_spec("tokens", None)  # [tokens, embed] / [tokens, top_k]
    pspec = jax.tree_util.tree_map(lambda _: P(EP_AXIS), p)
    out_specs = (tok, P()) + ((P(tuple(mesh.axis_names)),) if stats else ())
    # quantised dispatch uses the fixed-size path (the ragged one sends compute-dtype rows)
    rg = use_ragged(ragged) if quant is None else False
    fn = functools.partial(ep_moe_local, m=m, axis=EP_AXIS, quant=quant, ragged=rg, stats=stats)
    return jax.shard_map(fn, mesh=mesh, in_specs=(pspec, tok, tok, tok), out_specs=out_specs,
                         )(p, x, idx, w)


def local_moe(mesh: Mesh, p: dict, x: jax.Array, idx: jax.Array, w: jax.Array, m: MoEConfig):
    """The routed experts when every device holds every expert (``mesh.expert == 1``): each device runs
    ``moe.impl`` on its own tokens x [N, D], idx/w [N, k] (sharded over every token axis); FSDP-sharded
    expert weights are gathered for it, as FSDP does for any layer. Same result as the impl on the whole
    batch for the dropless impls (a token's output depends on its own routes only); a capacity impl's
    capacity becomes per device, as in GShard's groups, and its dropped fraction is averaged over them."""
    from c2jax.model.moe_impls import MOE_IMPLS
    from c2jax.model.parallel.sharding import TOKEN_AXES, activation_spec

    if mesh.shape[EP_AXIS] != 1:
        raise ValueError(f"local_moe needs mesh.expert == 1 (got {mesh.shape[EP_AXIS]}); use ep_moe")
    impl = MOE_IMPLS.get(m.impl)
    tok = activation_spec("tokens", None)  # [tokens, embed] / [tokens, top_k]

    def body(p, x, idx, w):
        y, dropped = impl(p, x, idx, w, m)
        return y, jax.lax.pmean(dropped, TOKEN_AXES)  # equal tokens per device: the mean is the global share

    pspec = jax.tree_util.tree_map(lambda _: P(), p)
    # check_vma off: the impls' tile scans start their carries replicated and make them per-device
    return jax.shard_map(body, mesh=mesh, in_specs=(pspec, tok, tok, tok), out_specs=(tok, P()),
                         check_vma=False)(p, x, idx, w)


def make_local_experts_fn(mesh: Mesh):
    """An `experts_fn` running `local_moe` on `mesh` (the `MOE_IMPLS` signature)."""

    def fn(p, x, idx, w, m):
        return local_moe(mesh, p, x, idx, w, m)

    return fn


def make_experts_fn(mesh: Mesh, quant: Optional[str] = None, ragged: str = "auto"):
    """An `experts_fn` for `transformer.apply` / `moe.moe_block` (the `MOE_IMPLS` signature)."""

    def fn(p, x, idx, w, m):
        return ep_moe(mesh, p, x, idx, w, m, quant=quant, ragged=ragged)

    return fn
