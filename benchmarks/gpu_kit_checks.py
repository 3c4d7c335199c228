"""Correctness checks of the GPU kit (`benchmarks/gpu_kit.py`): every Triton kernel against its
reference, the CUDA lowering of every GPU kernel, and per-token NVFP4 batch invariance.

Each check returns report rows `{"section", "name", "status", "value", "unit", "detail"}` with
status 'pass' | 'fail' | 'error: ...'. On a GPU the kernels run compiled (`impl='triton'`); on CPU
(`--dry-run`) in Pallas interpret mode (`impl='triton_interpret'`) at small shapes. The references
are the repository's oracles: `impl='xla'` of `kernels_pallas.gmm.ops.grouped_matmul` (the same
quantisers, then `ragged_dot` / a masked einsum on the dequantised operands, with the same
custom_vjp recipe for dgrad and wgrad) and `kernels_pallas.quant.reference`.
"""
from __future__ import annotations

import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import api, gpu_validation
from kernels_pallas.gmm import hopper, ops, pallas_gmm, triton_gmm
from kernels_pallas.quant import triton_quant

# Allowed max|kernel - reference| as a fraction of max|reference|, per output (y, dx, dw). Both
# sides see identical (quantised) operands, so only the FP32 summation order differs, except the
# FP8 tensor-core path: Hopper accumulates FP8 products with ~14-bit precision inside each
# 128-element chunk before the FP32 promotion (kernels.md 2.7), hence the looser GPU bound.
GMM_TOL = {"f32": 1e-4, "bf16": 1e-4, "mxfp8": 1e-4, "nvfp4_fwd_mxfp8_bwd": 1e-4, "fp8_blockwise": 1e-4}
GMM_TOL_GPU_FP8 = 5e-3


def row(section: str, name: str, status: str, value=None, unit: str = "", detail: str = "") -> dict:
    return {"section": section, "name": name, "status": status, "value": value, "unit": unit, "detail": detail}


def _guard(section: str, name: str, fn: Callable[[], list]) -> list:
    """Run one check; an exception becomes an 'error: ...' row (the kit goes on)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report every failure, keep running
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return [row(section, name, f"error: {type(e).__name__}: {str(e)[:300]}", detail=tb)]


def ragged_sizes(m: int, g: int, seed: int = 0) -> jnp.ndarray:
    """Group sizes summing to m - 3 (3 rows past the groups), group 1 empty, the rest random."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, g)
    w[1 % g] = 0.0
    sizes = np.floor(w / w.sum() * (m - 3)).astype(np.int64)
    sizes[0] += (m - 3) - sizes.sum()
    return jnp.asarray(sizes, jnp.int32)


# ------------------------------------------------------------------ grouped matmul (fwd, dgrad, wgrad)
def check_gmm(precision: str, impl: str, m: int, k: int, n: int, g: int) -> list:
    """ops.grouped_matmul with `impl` vs impl='xla': output and both custom_vjp gradients."""
    kx, kw, kc = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (g, k, n), jnp.float32) / np.sqrt(k)
    ct = jax.random.normal(kc, (m, n), jnp.float32)
    gs = ragged_sizes(m, g)

    def run(which):
        def f(x, w):
            y, vjp = jax.vjp(lambda a, b: ops.grouped_matmul(a, b, gs, precision=precision, impl=which), x, w)
            return (y, *vjp(ct))
        return [np.asarray(v, np.float64) for v in jax.jit(f)(x, w)]

    got, ref = run(impl), run("xla")
    fp8_mma = (impl == "triton" and precision == "fp8_blockwise") or (impl == "pallas" and precision != "bf16")
    tol = GMM_TOL_GPU_FP8 if fp8_mma else GMM_TOL[precision]
    ratios = []
    for a, b in zip(got, ref):
        scale = np.max(np.abs(b)) or 1.0
        ratios.append(float(np.max(np.abs(a - b)) / (tol * scale)) if np.isfinite(a).all() else float("inf"))
    ok = all(r <= 1.0 for r in ratios)
    detail = (f"M={m} K={k} N={n} G={g} sizes={np.asarray(gs).tolist()}; err/bound y,dx,dw = "
              + ", ".join(f"{r:.3g}" for r in ratios) + f" (bound {tol:g} x max|ref|)")
    return [row("correctness", f"gmm_{precision} fwd+dgrad+wgrad [{impl}]", "pass" if ok else "fail",
                max(ratios), "err/bound", detail)]


# ------------------------------------------------------------------ quantisers (bit-exact)
def quant_inputs(r: int, k: int, seed: int = 0) -> jnp.ndarray:
    """Rows spanning 2^-20..2^20, an all-zero row, a row of E4M3/E2M1 rounding ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((r, k)) * np.exp2(rng.uniform(-20, 20, (r, 1)))
    x[1] = 0.0
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 448.0, 464.0, -0.25, -2.5, 1.0, 3.0, 4.0, 0.5])
    x[2] = np.resize(ties, k)
    return jnp.asarray(x, jnp.float32)


def check_quant(fmt: str, impl: str, r: int, k: int) -> list:
    """Triton quantiser bytes vs `quant.reference` (via api impl='xla'): mismatching bytes must be 0."""
    x = quant_inputs(r, k).astype(jnp.bfloat16)
    got = jax.jit(lambda a: api.quantize(a, fmt, -1, impl=impl))(x)
    ref = jax.jit(lambda a: api.quantize(a, fmt, -1, impl="xla"))(x)
    bad, total = 0, 0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return [row("correctness", f"quant_{fmt} [{impl}]", "fail", None, "", f"shape {a.shape} != {b.shape}")]
        eq = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else (a == b)
        bad += int((~eq).sum())
        total += a.size
    return [row("correctness", f"quant_{fmt} [{impl}]", "pass" if bad == 0 else "fail", bad,
                "mismatching values", f"x=({r}, {k}) bf16, rows 2^-20..2^20 + zero row + ties; {total} values compared")]


def check_batch_invariance(impl: str, r: int, k: int) -> list:
    """nvfp4_per_token: a row's bits are the same alone, in its batch, and with rescaled batch mates.
    Positive control: per-tensor NVFP4 (reference) changes the row's bits when the mates change."""
    x = quant_inputs(r, k, seed=3)
    i = 5
    mates = x.at[jnp.arange(r) != i].multiply(1024.0)

    def bits_of(fmt, arr, row_i, which):
        q = api.quantize(arr, fmt, -1, impl=which)
        return [np.asarray(leaf)[row_i] for leaf in (q.data, q.scales)]

    base = bits_of("nvfp4_per_token", x, i, impl)
    same = all(np.array_equal(a, b) for cand in (bits_of("nvfp4_per_token", x[i:i + 1], 0, impl),
                                                 bits_of("nvfp4_per_token", mates, i, impl))
               for a, b in zip(base, cand))
    control = not all(np.array_equal(a, b) for a, b in zip(bits_of("nvfp4", x, i, "xla"),
                                                         bits_of("nvfp4", mates, i, "xla")))
    ok = same and control
    return [row("correctness", f"nvfp4_per_token batch invariance [{impl}]", "pass" if ok else "fail", int(same),
                "invariant", f"row {i} of ({r}, {k}): alone / in batch / mates x1024 identical={same}; "
                             f"per-tensor nvfp4 control changes={control}")]


# ------------------------------------------------------------------ lowering for a CUDA target
def _lowers(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def lowering_cases() -> dict:
    """name -> (fn, abstract args, marker the lowered module must contain)."""
    S, e4, f32, u8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn, jnp.float32, jnp.uint8
    m, k, n, g = 512, 256, 256, 4
    gs = S((g,), jnp.int32)
    tri = "xla.gpu.triton"
    return {
        "triton gmm plain (bf16)": (lambda a, w, s: triton_gmm.gmm((a,), (w,), s, kind="plain"),
                                    (S((m, k), jnp.bfloat16), S((g, k, n), jnp.bfloat16), gs), tri),
        "triton gmm fp8bw": (lambda a, sa, w, sw, s: triton_gmm.gmm((a, sa), (w, sw), s, kind="fp8bw"),
                             (S((m, k), e4), S((m, k // 128), f32), S((g, k, n), e4), S((g, k // 128, n // 128), f32), gs), tri),
        "triton gmm mx": (lambda a, sa, w, sw, s: triton_gmm.gmm((a, sa), (w, sw), s, kind="mx"),
                          (S((m, k), e4), S((m, k // 32), u8), S((g, k, n), e4), S((g, k // 32, n), u8), gs), tri),
        "triton tgmm plain (bf16)": (lambda a, d, s: triton_gmm.tgmm((a,), (d,), s, kind="plain"),
                                     (S((m, k), jnp.bfloat16), S((m, n), jnp.bfloat16), gs), tri),
        "triton tgmm fp8bw": (lambda a, sa, d, sd, s: triton_gmm.tgmm((a, sa), (d, sd), s, kind="fp8bw"),
                              (S((m, k), e4), S((m // 128, k), f32), S((m, n), e4), S((m // 128, n), f32), gs), tri),
        "triton tgmm mx": (lambda a, sa, d, sd, s: triton_gmm.tgmm((a, sa), (d, sd), s, kind="mx"),
                           (S((m, k), e4), S((m // 32, k), u8), S((m, n), e4), S((m // 32, n), u8), gs), tri),
        "triton quant mxfp8_e4m3": (lambda x: triton_quant.mx_quantize_2d(x, "mxfp8_e4m3"), (S((256, 7168), jnp.bfloat16),), tri),
        "triton quant mxfp8_e5m2": (lambda x: triton_quant.mx_quantize_2d(x, "mxfp8_e5m2"), (S((256, 7168), jnp.bfloat16),), tri),
        "triton quant nvfp4_per_token": (lambda x: triton_quant.nvfp4_per_token_quantize_2d(x), (S((256, 7168), jnp.bfloat16),), tri),
        "mosaic gpu hopper fp8bw gmm": (hopper.fp8_blockwise_gmm_hopper,
                                        (S((m, k), e4), S((m, k // 128), f32), S((g, n, k), e4), S((g, k // 128, n // 128), f32), gs),
                                        "mosaic_gpu"),
    }


def check_lowering() -> list:
    """Every GPU kernel lowers for CUDA from this jaxlib; the TPU-style kernel must not (control)."""
    out = []
    for name, (fn, args, marker) in lowering_cases().items():
        def one(fn=fn, args=args, marker=marker, name=name):
            text = _lowers(fn, *args)
            ok = marker in text
            return [row("lowering", name, "pass" if ok else "fail", len(text), "chars of StableHLO",
                        f"custom call '{marker}' {'present' if ok else 'missing'}")]
        out += _guard("lowering", name, one)
    S = jax.ShapeDtypeStruct
    try:
        _lowers(lambda a, w, s: pallas_gmm.gmm((a,), (w,), s, kind="plain", m=512, k=256, n=256, interpret=False),
                S((512, 256), jnp.bfloat16), S((4, 256, 256), jnp.bfloat16), S((4,), jnp.int32))
        out.append(row("lowering", "control: TPU-style gmm (scalar prefetch) is rejected", "fail", detail="it lowered"))
    except Exception as e:  # noqa: BLE001 - the rejection is the expected outcome
        out.append(row("lowering", "control: TPU-style gmm (scalar prefetch) is rejected", "pass",
                       detail=f"{type(e).__name__}: {str(e)[:120]}"))
    return out


# ------------------------------------------------------------------ all correctness checks
def run_checks(on_gpu: bool) -> tuple[list, dict]:
    """Rows of every check, and the `gpu_validation` results (only from compiled GPU runs)."""
    impl = "triton" if on_gpu else "triton_interpret"
    gm = (2048, 1024, 512, 8) if on_gpu else (96, 128, 64, 3)
    qshape = (512, 7168) if on_gpu else (16, 256)
    rows, results = check_lowering(), {}
    for p in ops.PRECISIONS:
        r = _guard("correctness", f"gmm_{p} [{impl}]", lambda p=p: check_gmm(p, impl, *gm))
        rows += r
        results[f"gmm_{p}"] = {"passed": r[0]["status"] == "pass", "max_err_ratio": r[0]["value"]}
    if on_gpu:  # the Mosaic GPU (wgmma) kernels of gmm/hopper.py, reached by impl='pallas'
        for p in ("fp8_blockwise", "mxfp8"):
            rows += _guard("correctness", f"gmm_{p} [pallas: hopper.py]", lambda p=p: check_gmm(p, "pallas", *gm))
    for fmt in triton_quant.FORMATS:
        r = _guard("correctness", f"quant_{fmt} [{impl}]", lambda f=fmt: check_quant(f, impl, *qshape))
        rows += r
        results[f"quant_{fmt}"] = {"passed": r[0]["status"] == "pass", "mismatches": r[0]["value"]}
    rows += _guard("correctness", "nvfp4_per_token batch invariance",
                   lambda: check_batch_invariance(impl, 64 if on_gpu else 8, 7168 if on_gpu else 128))
    assert set(results) <= set(gpu_validation.KERNELS)
    return rows, (results if on_gpu else {})
