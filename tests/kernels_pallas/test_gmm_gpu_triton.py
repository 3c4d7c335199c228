"""GPU-lowerable (Pallas Triton) grouped matmuls and quantisers, checked as far as a CPU can:

* interpret mode (`interpret=True`) against the oracles: `ragged_dot` / masked einsum on the
  dequantised operands for the grouped matmuls, `quant.reference` bytes for the quantisers;
* lowering for a CUDA target from the CPU-only jaxlib (`.trace(...).lower(lowering_platforms=
  ("cuda",))` gives a module with the Triton custom call), with a control that the TPU-style kernel
  is rejected by the same check;
* GPU-only tests (compiled kernels) skip here with the reason.

Error bound for kernels vs oracle on identical (quantised) operands: FP32 summation order only,
|out - ref| <= 4 (K + 3K/128 + 2) 2^-24 (|A| @ |B|) elementwise (kernels.md 2.7, c = 4).
Shapes are small (interpret mode compiles a scan over the grid); the heavier cases are slow-marked.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import api
from kernels_pallas.gmm import groups, ops, pallas_gmm, triton_gmm
from kernels_pallas.gmm.reference import gmm_ref, tgmm_ref
from kernels_pallas.quant import reference as qref
from kernels_pallas.quant import triton_quant

ON_GPU = jax.devices()[0].platform == "gpu"
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a GPU (compiled Triton kernels); CPU runs interpret mode")
SMALL = triton_gmm.TileConfig(32, 32, 32, 4, 2)
GS = jnp.array([30, 0, 41], jnp.int32)  # empty group, ragged sizes, 25 rows past the groups
e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)  # noqa: E731
_qz = jax.jit(qref.quantize, static_argnames=("fmt", "axis", "tile"))


def _data(m=96, k=64, n=32, g=3, seed=0):
    ka, kw, kd = jax.random.split(jax.random.key(seed), 3)
    return jax.random.normal(ka, (m, k)), jax.random.normal(kw, (g, k, n)) * 0.1, jax.random.normal(kd, (m, n))


def _assert_within(out, a, b, gs, k, wgrad=False):
    fn = tgmm_ref if wgrad else gmm_ref
    ref = np.asarray(fn(a, b, gs))
    bound = 4 * (k + 3 * k / 128 + 2) * 2.0 ** -24 * np.asarray(fn(jnp.abs(a), jnp.abs(b), gs)) + 1e-30
    err = np.abs(np.asarray(out, np.float64) - ref)
    assert (err <= bound).all(), f"max err {err.max():.3g}, worst err/bound {(err / bound).max():.3g}"


# ------------------------------------------------------------------ interpret mode vs the oracles
def test_triton_gmm_bf16_interpret_matches_ragged_dot():
    x, w, _ = _data()
    a, b = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    out = triton_gmm.gmm((a,), (b,), GS, kind="plain", config=SMALL, interpret=True)
    _assert_within(out, a.astype(jnp.float32), b.astype(jnp.float32), GS, 64)
    assert (np.asarray(out)[71:] == 0).all()  # rows past sum(group_sizes)


def test_triton_tgmm_bf16_interpret_matches_einsum():
    x, _, d = _data()
    a, dy = x.astype(jnp.bfloat16), d.astype(jnp.bfloat16)
    out = triton_gmm.tgmm((a,), (dy,), GS, kind="plain", config=SMALL, interpret=True)
    _assert_within(out, a.astype(jnp.float32), dy.astype(jnp.float32), GS, 96, wgrad=True)
    assert (np.asarray(out)[1] == 0).all()  # the empty group's gradient


def test_triton_gmm_mxfp8_interpret_matches_dequantised_oracle():
    x, w, _ = _data()
    qa, qw = _qz(x, "mxfp8_e4m3", 1), _qz(w, "mxfp8_e4m3", 1)
    out = triton_gmm.gmm((e4(qa.data), qa.scales), (e4(qw.data), qw.scales), GS, kind="mx", config=SMALL,
                         interpret=True)
    _assert_within(out, qref.dequantize(qa), qref.dequantize(qw), GS, 64)


@pytest.mark.slow
@pytest.mark.parametrize("kmajor", [False, True])
def test_triton_gmm_fp8_blockwise_interpret_matches_dequantised_oracle(kmajor):
    x, w, _ = _data(k=256, n=128)
    qa, qw = _qz(x, "fp8_blockwise", 1), _qz(w, "fp8_blockwise", 1, tile=(128, 128))
    codes = e4(jnp.swapaxes(qw.data, 1, 2) if kmajor else qw.data)  # (G,N,K) copy or (G,K,N)
    out = triton_gmm.gmm((e4(qa.data), qa.scales), (codes, qw.scales), GS, kind="fp8bw",
                         config=triton_gmm.TileConfig(32, 128, 64, 4, 2), interpret=True, rhs_kmajor=kmajor)
    _assert_within(out, qref.dequantize(qa), qref.dequantize(qw), GS, 256)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,kind,align", [("mxfp8_e4m3", "mx", 32), ("fp8_blockwise", "fp8bw", 128)])
def test_triton_tgmm_scaled_interpret(fmt, kind, align):
    x, _, d = _data(n=64)
    xp, pgs, _ = groups.pad_groups(x, GS, align, align)
    dp, _, _ = groups.pad_groups(d, GS, align, align)
    qx, qd = _qz(xp, fmt, 0), _qz(dp, fmt, 0)
    cfg = triton_gmm.TileConfig(64 if kind == "mx" else 128, 32, 32, 4, 2)
    out = triton_gmm.tgmm((e4(qx.data), qx.scales), (e4(qd.data), qd.scales), pgs, kind=kind, config=cfg,
                          interpret=True)
    _assert_within(out, qref.dequantize(qx), qref.dequantize(qd), pgs, xp.shape[0], wgrad=True)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ops.PRECISIONS)
def test_grouped_matmul_triton_custom_vjp_matches_xla(precision):
    """Forward, dgrad and wgrad through the custom_vjp recipe: Triton (interpret) == the oracle."""
    x, w, ct = _data(m=80, k=64, n=48)

    def run(impl):
        y, vjp = jax.vjp(lambda a, b: ops.grouped_matmul(a, b, GS, precision=precision, impl=impl), x, w)
        return (y, *vjp(ct))

    for got, ref in zip(run("triton_interpret"), run("xla")):
        scale = float(jnp.max(jnp.abs(ref)))
        assert float(jnp.max(jnp.abs(got - ref))) <= 1e-5 * scale


def test_grouped_matmul_rejects_unknown_impl_before_compute():
    x, w, _ = _data()
    with pytest.raises(ValueError, match="impl must be one of"):
        ops.grouped_matmul(x, w, GS, impl="cuda")
    with pytest.raises(ValueError, match="powers of two"):
        triton_gmm.gmm((x,), (w,), GS, kind="plain", config=triton_gmm.TileConfig(48, 32, 32))
    with pytest.raises(ValueError, match="multiples of tk"):
        triton_gmm.gmm((x[:, :48],), (w[:, :48],), GS, kind="plain", config=SMALL)


def test_triton_mx_quantiser_interpret_bit_exact():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 128)) * np.exp2(rng.uniform(-20, 20, (20, 1)))
    x[3] = 0.0
    x[4, :8] = [0.25, 448.0, 464.0, -3.5, 480.0, 1e-30, -0.0, 7.0]
    x = jnp.asarray(x, jnp.float32)
    d, s = triton_quant.mx_quantize_2d(x, "mxfp8_e4m3", interpret=True, tc=64)
    q = _qz(x, "mxfp8_e4m3", 1)
    np.testing.assert_array_equal(np.asarray(d), np.asarray(q.data))
    np.testing.assert_array_equal(np.asarray(s), np.asarray(q.scales))


@pytest.mark.slow
def test_triton_nvfp4_per_token_interpret_bit_exact_and_batch_invariant():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((16, 64)) * np.exp2(rng.uniform(-10, 10, (16, 1))), jnp.float32)
    d, s, sd = triton_quant.nvfp4_per_token_quantize_2d(x, interpret=True, tc=32)
    q = _qz(x, "nvfp4_per_token", 1)
    for a, b in ((d, q.data), (s, q.scales), (sd, q.global_scale)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    d1, s1, _ = triton_quant.nvfp4_per_token_quantize_2d(x[5:6] * 1.0, interpret=True, tc=32)
    d2, s2, _ = triton_quant.nvfp4_per_token_quantize_2d(x.at[:5].multiply(1e3), interpret=True, tc=32)
    np.testing.assert_array_equal(np.asarray(d1)[0], np.asarray(d)[5])
    np.testing.assert_array_equal(np.asarray(d2)[5], np.asarray(d)[5])
    np.testing.assert_array_equal(np.asarray(s2)[5], np.asarray(s)[5])


def test_api_triton_quantize_rejects_unsupported_format_before_compute():
    with pytest.raises(ValueError, match="impl='triton_interpret' quantises"):
        api.quantize(jnp.ones((4, 64)), "mxfp4", impl="triton_interpret")
    with pytest.raises(ValueError, match="multiple of the block size"):
        triton_quant.mx_quantize_2d(jnp.ones((4, 48)), "mxfp8_e4m3", interpret=True)


# ------------------------------------------------------------------ lowering for CUDA (no GPU needed)
def _lower_cuda(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


S, F8, U8, F32, BF = jax.ShapeDtypeStruct, jnp.float8_e4m3fn, jnp.uint8, jnp.float32, jnp.bfloat16
M, K, N, G = 512, 256, 256, 4
LOWERING = {
    "gmm_plain": (lambda a, w, s: triton_gmm.gmm((a,), (w,), s, kind="plain"), (S((M, K), BF), S((G, K, N), BF))),
    "gmm_plain_f32": (lambda a, w, s: triton_gmm.gmm((a,), (w,), s, kind="plain"), (S((M, K), F32), S((G, K, N), F32))),
    "gmm_fp8bw": (lambda a, sa, w, sw, s: triton_gmm.gmm((a, sa), (w, sw), s, kind="fp8bw"),
                  (S((M, K), F8), S((M, K // 128), F32), S((G, K, N), F8), S((G, K // 128, N // 128), F32))),
    "gmm_fp8bw_kmajor": (lambda a, sa, w, sw, s: triton_gmm.gmm((a, sa), (w, sw), s, kind="fp8bw", rhs_kmajor=True),
                         (S((M, K), F8), S((M, K // 128), F32), S((G, N, K), F8), S((G, K // 128, N // 128), F32))),
    "gmm_mx": (lambda a, sa, w, sw, s: triton_gmm.gmm((a, sa), (w, sw), s, kind="mx"),
               (S((M, K), F8), S((M, K // 32), U8), S((G, K, N), F8), S((G, K // 32, N), U8))),
    "tgmm_plain": (lambda a, d, s: triton_gmm.tgmm((a,), (d,), s, kind="plain"), (S((M, K), BF), S((M, N), BF))),
    "tgmm_fp8bw": (lambda a, sa, d, sd, s: triton_gmm.tgmm((a, sa), (d, sd), s, kind="fp8bw"),
                   (S((M, K), F8), S((M // 128, K), F32), S((M, N), F8), S((M // 128, N), F32))),
    "tgmm_mx": (lambda a, sa, d, sd, s: triton_gmm.tgmm((a, sa), (d, sd), s, kind="mx"),
                (S((M, K), F8), S((M // 32, K), U8), S((M, N), F8), S((M // 32, N), U8))),
}


@pytest.mark.parametrize("name", sorted(LOWERING))
def test_triton_gmm_lowers_for_cuda(name):
    fn, args = LOWERING[name]
    text = _lower_cuda(fn, *args, S((G,), jnp.int32))
    assert "__gpu$xla.gpu.triton" in text
    assert f'name = "triton_{name.split("_")[0]}_{name.split("_")[1]}"' in text


@pytest.mark.parametrize("fmt", triton_quant.FORMATS)
def test_triton_quantisers_lower_for_cuda_at_kimi_width(fmt):
    fn = ((lambda x: triton_quant.mx_quantize_2d(x, fmt)) if fmt in triton_quant.MX_FORMATS
          else triton_quant.nvfp4_per_token_quantize_2d)
    assert "__gpu$xla.gpu.triton" in _lower_cuda(fn, S((256, 7168), BF))  # 7168: not a power of two


def test_tpu_style_gmm_is_rejected_by_the_same_lowering_check():
    """Control: the check can fail. The scalar-prefetch kernel has no GPU lowering."""
    with pytest.raises(NotImplementedError, match="[Ss]calar prefetch"):
        _lower_cuda(lambda a, w, s: pallas_gmm.gmm((a,), (w,), s, kind="plain", m=M, k=K, n=N, interpret=False),
                    S((M, K), BF), S((G, K, N), BF), S((G,), jnp.int32))


@pytest.mark.slow
def test_hopper_mosaic_gpu_kernel_lowers_for_cuda():
    from kernels_pallas.gmm import hopper

    text = _lower_cuda(hopper.fp8_blockwise_gmm_hopper, S((M, K), F8), S((M, K // 128), F32), S((G, N, K), F8),
                       S((G, K // 128, N // 128), F32), S((G,), jnp.int32))
    assert "mosaic_gpu" in text


# ------------------------------------------------------------------ compiled on a GPU
@needs_gpu
@pytest.mark.parametrize("precision", ops.PRECISIONS)
def test_on_gpu_triton_grouped_matmul_matches_xla(precision):
    x, w, ct = _data(m=512, k=256, n=128)

    def run(impl):
        y, vjp = jax.vjp(lambda a, b: ops.grouped_matmul(a, b, GS, precision=precision, impl=impl), x, w)
        return (y, *vjp(ct))

    tol = 5e-3 if precision == "fp8_blockwise" else 1e-4  # Hopper FP8 MMA accumulation (kernels.md 2.7)
    for got, ref in zip(run("triton"), run("xla")):
        assert float(jnp.max(jnp.abs(got - ref))) <= tol * float(jnp.max(jnp.abs(ref)))


@needs_gpu
@pytest.mark.parametrize("fmt", triton_quant.FORMATS)
def test_on_gpu_triton_quantisers_bit_exact(fmt):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((64, 7168)) * np.exp2(rng.uniform(-20, 20, (64, 1))), jnp.bfloat16)
    got, ref = api.quantize(x, fmt, impl="triton"), api.quantize(x, fmt, impl="xla")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
