"""Hopper (sm_90) scaled-FP8 grouped matmuls in Pallas Mosaic GPU (wgmma): the DeepSeek-V3
FP8-blockwise recipe (promotion every 128) and MXFP8 (one K=32 wgmma per block, then promotion).

out[m] = sum over 128-wide K chunks c of (A[m, c] @ W[g(m)][c, :]) * sa[m, c] * sw[g, c, n/128]

* A: E4M3 (M, K) with FP32 scales per 1x128 tile; W: E4M3 with FP32 scales per 128x128 block.
* FP8 wgmma needs both operands K-major in SMEM and Pallas only transposes 16-bit types, so the
  weight is passed as an explicitly transposed FP8 copy (G, N, K) and viewed (K, N) with
  `transpose_ref` (the ragged_dot_mgpu `transpose_rhs` path).
* FP32 promotion every 128 K-elements: each pipeline step (block_k = 128) runs its wgmma into a
  fresh accumulator, which is then scaled by the row (activation) and column (weight) scales and
  added to an FP32 register carry (the Hopper tensor core's ~14-bit FP8 accumulation never sees
  more than 128 products).
* Group scheduling and the ragged row store (logarithmic ladder of TMA stores) follow
  `jax.experimental.pallas.ops.gpu.ragged_dot_mgpu` (GroupInfo, planar_snake over 132 SMs).

Status: tested on CPU with the Mosaic GPU *interpreter* only
(`jax._src.pallas.mosaic_gpu.interpret`, private API: simulates SMEM/TMA/barriers/wgmma, does not
check layouts, swizzles, register or SMEM limits). It has never been compiled for or run on an
sm_90 GPU; treat it as logic-tested, not as a working GPU kernel (README).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas.ops.gpu.ragged_dot_mgpu import GroupInfo

NUM_SMS = 132  # H100 / H200 SXM


def fp8_blockwise_gmm_hopper(a, sa, w_t, sw, group_sizes, *, block_m: int = 64, block_n: int = 128,
                             max_concurrent_steps: int = 2, out_dtype=jnp.float32,
                             interpret=None) -> jax.Array:
    """a (M, K) e4m3, sa (M, K/128) f32, w_t (G, N, K) e4m3 [transposed copy], sw (G, K/128, N/128)
    f32, group_sizes (G,) int32 -> (M, N) out_dtype. Rows past sum(group_sizes) are zero.
    `interpret`: None (compile for the GPU) or an `InterpretGPUParams` (CPU interpreter)."""
    return scaled_gmm_hopper(a, sa, w_t, jnp.repeat(sw, 128, axis=2), group_sizes, block_k=128,
                             block_m=block_m, block_n=block_n, max_concurrent_steps=max_concurrent_steps,
                             out_dtype=out_dtype, interpret=interpret)


def mxfp8_gmm_hopper(a, sa_e8m0, w_t, sw_e8m0, group_sizes, **kw) -> jax.Array:
    """MXFP8 grouped matmul: a (M, K) e4m3 with E8M0 bytes (M, K/32); w_t (G, N, K) e4m3 [K-major
    copy] with E8M0 bytes (G, K/32, N) (blocks of 32 along K). One K=32 FP8 wgmma per MX block into
    a fresh accumulator, promoted with 2^(sa-127) * 2^(sw-127): exact block-scaled semantics up to
    the tensor core's accumulation of 32 exact FP8 products (the alternative, dequantising to BF16
    for BF16 wgmma, is not written)."""
    from kernels_pallas import bits
    return scaled_gmm_hopper(a, bits.pow2_from_e8m0(sa_e8m0), w_t, bits.pow2_from_e8m0(sw_e8m0),
                             group_sizes, block_k=32, **kw)


def scaled_gmm_hopper(a, sa, w_t, sw_cols, group_sizes, *, block_k: int, block_m: int = 64,
                      block_n: int = 128, max_concurrent_steps: int = 2, out_dtype=jnp.float32,
                      interpret=None) -> jax.Array:
    """Shared kernel: a (M, K) e4m3, sa (M, K/block_k) f32 row scales, w_t (G, N, K) e4m3,
    sw_cols (G, K/block_k, N) f32 column scales; each block_k chunk is promoted separately."""
    m, k = a.shape
    g, n, k2 = w_t.shape
    if k != k2 or k % block_k or n % block_n:
        raise ValueError(f"need K ({k}) == {k2}, K % {block_k} == 0, N ({n}) % block_n ({block_n}) == 0")
    if a.dtype != jnp.float8_e4m3fn or w_t.dtype != jnp.float8_e4m3fn:
        raise TypeError("FP8 wgmma needs both operands float8_e4m3fn")
    # layout hints for the Mosaic GPU compiler; the interpreter has no lowering for them (identity)
    interp = interpret is not None
    cast = (lambda x, lay: x) if interp else plgpu.layout_cast
    # The interpreter's wgmma cannot apply `transpose_ref`; there (only) the weight is fed in its
    # (K, N) layout. On the GPU the K-major transposed FP8 copy is required.
    w_in = jnp.swapaxes(w_t, 1, 2) if interp else w_t
    sa_t = sa.T                                                     # (K/block_k, M): contiguous rows

    def body(sizes_gmem, a_gmem, sa_gmem, w_gmem, sw_gmem, o_gmem):
        grid_m = pl.cdiv(m, block_m) + g - 1
        grid_n = n // block_n

        @plgpu.nd_loop((grid_m * grid_n,), collective_axes="sm")
        def mn_loop(loop_info: plgpu.NDLoopInfo):
            mi, ni = plgpu.planar_snake(loop_info.index[0], (grid_m, grid_n), 1, 1)
            gi = GroupInfo.create(sizes_gmem, block_m, mi)

            def step(_, a_smem, w_smem, sa_smem, sw_smem, carry):
                def mma(acc_ref):
                    plgpu.wgmma(acc_ref, a_smem, w_smem if interp else plgpu.transpose_ref(w_smem, (1, 0)))
                    return acc_ref[...]

                part = pl.run_scoped(mma, plgpu.ACC((block_m, block_n)))
                row = cast(sa_smem[0], plgpu.Layout.WGMMA.reduce(1))
                col = cast(sw_smem[0], plgpu.Layout.WGMMA.reduce(0))
                scale = (lax.broadcast_in_dim(row, (block_m, block_n), [0])
                         * lax.broadcast_in_dim(col, (block_m, block_n), [1]))
                return carry + part * scale

            acc = plgpu.emit_pipeline(
                step,
                grid=(k // block_k,),
                in_specs=[
                    plgpu.BlockSpec((block_m, block_k), lambda kk: (gi.block, kk), delay_release=1),
                    (plgpu.BlockSpec((block_k, block_n), lambda kk: (kk, ni), delay_release=1) if interp
                     else plgpu.BlockSpec((block_n, block_k), lambda kk: (ni, kk), delay_release=1)),
                    plgpu.BlockSpec((1, block_m), lambda kk: (kk, gi.block)),
                    plgpu.BlockSpec((1, block_n), lambda kk: (kk, ni)),
                ],
                max_concurrent_steps=max_concurrent_steps,
                init_carry=cast(jnp.zeros((block_m, block_n), jnp.float32), plgpu.Layout.WGMMA),
            )(a_gmem, w_gmem.at[gi.group_id], sa_gmem, sw_gmem.at[gi.group_id])

            @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((block_m, block_n), dtype=o_gmem.dtype))
            def store(o_smem):
                o_smem[...] = acc.astype(o_smem.dtype)
                plgpu.commit_smem()
                start = gi.start_within_block
                remaining = min(block_m, m)
                while remaining > 0:  # static ladder of TMA store sizes (see ragged_dot_mgpu)
                    rows = 1 << int(math.log2(remaining))
                    remaining //= 2

                    @pl.when(gi.actual_size & rows != 0)
                    def _():
                        plgpu.copy_smem_to_gmem(
                            o_smem.at[pl.ds(start, rows)],
                            o_gmem.at[pl.ds(gi.block_start + start, rows), pl.ds(ni * block_n, block_n)])

                    start += gi.actual_size & rows
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((m, n), out_dtype), grid=(NUM_SMS,), grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        **({} if interpret is None else {"interpret": interpret}))
    out = kernel(group_sizes.astype(jnp.int32), a, sa_t, w_in, sw_cols)
    rows = jnp.arange(m)[:, None]
    return jnp.where(rows < jnp.sum(group_sizes), out, 0).astype(out_dtype)


def fp8_blockwise_tgmm_hopper(x_t, sx, dy_t, sdy, group_sizes, **kw) -> jax.Array:
    """FP8-blockwise wgrad (128x1 token tiles); see `scaled_tgmm_hopper`."""
    return scaled_tgmm_hopper(x_t, sx, dy_t, sdy, group_sizes, block_t=128, **kw)


def mxfp8_tgmm_hopper(x_t, sx_e8m0, dy_t, sdy_e8m0, group_sizes, **kw) -> jax.Array:
    """MXFP8 wgrad: blocks of 32 tokens (groups padded to 32), E8M0 scales (Mp/32, K) / (Mp/32, N)."""
    from kernels_pallas import bits
    return scaled_tgmm_hopper(x_t, bits.pow2_from_e8m0(sx_e8m0), dy_t, bits.pow2_from_e8m0(sdy_e8m0),
                              group_sizes, block_t=32, **kw)


def scaled_tgmm_hopper(x_t, sx, dy_t, sdy, group_sizes, *, block_t: int, block_m: int = 64,
                       block_n: int = 128, max_concurrent_steps: int = 2, out_dtype=jnp.float32,
                       interpret=None) -> jax.Array:
    """Scaled FP8 wgrad: out[g] = sum over the block_t-token chunks c of group g of
    (X_c^T @ dY_c) * sx[c, :, None] * sdy[c, None, :]  -> (G, K, N).

    Operands are the explicitly transposed FP8 copies wgmma needs (tokens contiguous = K-major for
    this GEMM): x_t (K, Mp) e4m3 with scales sx (Mp/block_t, K); dy_t (N, Mp) e4m3 with scales
    sdy (Mp/block_t, N). Groups must start at multiples of block_t tokens with zero rows in between
    (`groups.pad_groups(..., block_t)`), so no mask is needed and each chunk is promoted into the FP32
    carry with its two scale vectors. Same test status as `fp8_blockwise_gmm_hopper`.
    """
    kdim, mp = x_t.shape
    n, mp2 = dy_t.shape
    g = group_sizes.shape[0]
    bt = block_t
    if mp != mp2 or mp % bt or kdim % block_m or n % block_n:
        raise ValueError(f"need Mp ({mp}) == {mp2}, Mp % {bt} == 0, K ({kdim}) % {block_m} == 0, "
                         f"N ({n}) % {block_n} == 0")
    interp = interpret is not None
    cast = (lambda x, lay: x) if interp else plgpu.layout_cast
    gs = group_sizes.astype(jnp.int32)
    chunk_start = ((jnp.cumsum(gs) - gs) // bt).astype(jnp.int32)     # groups are block_t-aligned
    n_chunks = ((gs + bt - 1) // bt).astype(jnp.int32)
    dy_in = dy_t.T if interp else dy_t  # interpreter: no transpose_ref on wgmma operands

    def body(start_gmem, nch_gmem, x_gmem, sx_gmem, dy_gmem, sdy_gmem, o_gmem):
        grid_m, grid_n = kdim // block_m, n // block_n

        @plgpu.nd_loop((g, grid_m * grid_n), collective_axes="sm")
        def mn_loop(loop_info: plgpu.NDLoopInfo):
            gi = loop_info.index[0]
            mi, ni = plgpu.planar_snake(loop_info.index[1], (grid_m, grid_n), 1, 1)
            c0, nc = start_gmem[gi], nch_gmem[gi]

            def step(_, x_smem, dy_smem, sx_smem, sdy_smem, carry):
                def mma(acc_ref):
                    plgpu.wgmma(acc_ref, x_smem, dy_smem if interp else plgpu.transpose_ref(dy_smem, (1, 0)))
                    return acc_ref[...]

                part = pl.run_scoped(mma, plgpu.ACC((block_m, block_n)))
                row = cast(sx_smem[0], plgpu.Layout.WGMMA.reduce(1))
                col = cast(sdy_smem[0], plgpu.Layout.WGMMA.reduce(0))
                return carry + part * (lax.broadcast_in_dim(row, (block_m, block_n), [0])
                                       * lax.broadcast_in_dim(col, (block_m, block_n), [1]))

            @pl.when(nc > 0)
            def _():
                acc = plgpu.emit_pipeline(
                    step,
                    grid=(nc,),
                    in_specs=[
                        plgpu.BlockSpec((block_m, bt), lambda c: (mi, c0 + c), delay_release=1),
                        (plgpu.BlockSpec((bt, block_n), lambda c: (c0 + c, ni), delay_release=1) if interp
                         else plgpu.BlockSpec((block_n, bt), lambda c: (ni, c0 + c), delay_release=1)),
                        plgpu.BlockSpec((1, block_m), lambda c: (c0 + c, mi)),
                        plgpu.BlockSpec((1, block_n), lambda c: (c0 + c, ni)),
                    ],
                    max_concurrent_steps=max_concurrent_steps,
                    init_carry=cast(jnp.zeros((block_m, block_n), jnp.float32), plgpu.Layout.WGMMA),
                )(x_gmem, dy_gmem, sx_gmem, sdy_gmem)

                @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((block_m, block_n), dtype=o_gmem.dtype))
                def store(o_smem):
                    o_smem[...] = acc.astype(o_smem.dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(
                        o_smem, o_gmem.at[gi, pl.ds(mi * block_m, block_m), pl.ds(ni * block_n, block_n)])
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((g, kdim, n), out_dtype), grid=(NUM_SMS,), grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        **({} if interpret is None else {"interpret": interpret}))
    out = kernel(chunk_start, n_chunks, x_t, sx, dy_in, sdy)
    return jnp.where((gs > 0)[:, None, None], out, 0).astype(out_dtype)


def nvfp4_gmm_hopper(a_packed, a_scales, a_global, w_packed, w_scales, w_global, group_sizes, *,
                     block_m: int = 64, block_n: int = 64, block_k: int = 64, interpret=None) -> jax.Array:
    """NVFP4 forward on Hopper (no FP4 tensor cores): dequantise both operands to BF16 (exact:
    E2M1 x E4M3 has at most 6 significant bits) in a fused XLA pre-pass, run JAX's BF16 Mosaic GPU
    ragged dot (`ragged_dot_mgpu`, FP32 accumulation, BF16 output), then apply the FP32 global
    decode scales (per row of A, per expert of W) as the epilogue. Not the in-kernel dequantisation
    (which would save the BF16 round trip through HBM); written as the correct-semantics baseline.

    a_packed (M, K/2) uint8, a_scales (M, K/16) e4m3 bytes, a_global (M, 1); w_packed (G, K/2, N),
    w_scales (G, K/16, N), w_global (G, 1, 1) -> (M, N) f32."""
    from jax.experimental.pallas.ops.gpu.ragged_dot_mgpu import ragged_dot

    from kernels_pallas import bits
    from kernels_pallas.gmm.groups import group_bounds

    def deq(packed, scales, axis):
        codes = jnp.moveaxis(bits.unpack_nibbles(jnp.moveaxis(packed, axis, -1)), -1, axis)
        s = jnp.repeat(jax.lax.bitcast_convert_type(scales, jnp.float8_e4m3fn).astype(jnp.float32), 16, axis=axis)
        return (bits.e2m1_decode(codes) * s).astype(jnp.bfloat16)

    a = deq(a_packed, a_scales, 1)
    w = deq(w_packed, w_scales, 1)
    call = functools.partial(ragged_dot, group_sizes=group_sizes.astype(jnp.int32), block_m=block_m,
                             block_n=block_n, block_k=block_k, max_concurrent_steps=2, grid_block_n=1)
    if interpret is None:
        y = call(a, w)
    else:
        from jax._src.pallas.mosaic_gpu.interpret.params import force_gpu_interpret_mode
        with force_gpu_interpret_mode(interpret):
            y = call(a, w)
    m = a.shape[0]
    starts, ends = group_bounds(group_sizes)
    rows = jnp.arange(m)
    grp = jnp.clip(jnp.searchsorted(ends, rows, side="right"), 0, w_global.shape[0] - 1)
    out = y.astype(jnp.float32) * a_global * w_global.reshape(-1)[grp][:, None]
    return jnp.where(rows[:, None] < ends[-1], out, 0)
