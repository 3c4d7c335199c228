"""PyTorch oracles (need the `torch` extra: torch 2.13.0, torchao 0.18.0).

Provenance of the committed golden vectors (tests/data/kernels_quant_golden.npz), per oracle:
* torchao: the installed package itself (torchao 0.18.0 from PyPI) was RUN — library output.
* Transformer Engine and DeepGEMM: FORMULA TRANSCRIPTIONS, not library output. Neither package was
  run (TE does not import without CUDA; DeepGEMM needs a GPU build): the functions below re-type
  their plain-torch reference code, so the vectors show that our kernels equal our reading of their
  formulas, not that they equal TE/DeepGEMM bits. Sources:
  - TE: NVIDIA/TransformerEngine `transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py`
    (`NVFP4QuantizerRef._quantize_blockwise_reference`, `cast_to_fp4x2`); upstream commit not
    recorded at transcription time (not pinned — recheck against a pinned commit before relying on it).
  - DeepGEMM: deepseek-ai/DeepGEMM `deep_gemm/utils/math.py` (`per_token_cast_to_fp8`,
    `per_block_cast_to_fp8`); the same two functions appear verbatim in the HF mirror
    kernels-community/deep-gemm `tests/test_core.py` at commit 4913396; upstream commit not recorded.
  Known disagreement of the transcribed TE encoder with our pinned semantics: exactly -0.0 encodes
  to +0 there (its threshold table starts at `x >= 0.0`), -0 (0x8) here;
  kernels_pallas/quant/test_quant_disputed.py documents this and the other disputed inputs.

* `torchao_mx`: torchao 0.18.0 `to_mx(..., ScaleCalculationMode.RCEIL)` bytes.
* `te_nvfp4`: Transformer Engine's NVFP4 reference formula
  (`transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py`,
  `_quantize_blockwise_reference`, 1x16 tiles, no RHT/4over6), re-typed here in torch fp32 because
  TE itself does not import without CUDA. `row_scaled=True` is TE's `row_scaled_nvfp4` (one global
  amax per row), the oracle of our `nvfp4_per_token`.
* `deepgemm_fp8`: DeepGEMM's `per_token_cast_to_fp8` (1x128) / `per_block_cast_to_fp8` (128x128).
* `numpy_rceil`: the integer RCEIL rule in numpy (golden values where torchao 0.18.0 is known to
  be one step low: block maxima just above 448*2^k, because it uses a float ceil(log2(.))).

Known torchao 0.18.0 deviations from our pinned semantics (documented in kernels_pallas/README.md):
Inf block max -> scale byte 0xFE (ours 0xFF); block max just above elem_max*2^k -> one step low;
blocks with byte 0 are multiplied by 1 instead of 2^127 (only blocks with max < ~2^-119 differ).
"""
from __future__ import annotations

import numpy as np


def torchao_mx(x: np.ndarray, elem: str):
    """(scale bytes uint8 (rows, K/32), element codes uint8) from torchao 0.18.0 to_mx RCEIL."""
    import torch
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}[elem]
    s, d = to_mx(torch.from_numpy(np.ascontiguousarray(x, np.float32)), dt, 32,
                 scaling_mode=ScaleCalculationMode.RCEIL)
    return s.view(torch.uint8).numpy().copy(), d.view(torch.uint8).numpy().copy()


def _te_cast_to_fp4x2(x):
    """TE's threshold E2M1 encoder (RNE; -0.0 input maps to +0) and nibble packing."""
    import torch

    r = torch.zeros_like(x, dtype=torch.uint8)
    for lo_op, lo, hi_op, hi, code in [
        ("ge", 0.0, "le", 0.25, 0), ("gt", 0.25, "lt", 0.75, 1), ("ge", 0.75, "le", 1.25, 2),
        ("gt", 1.25, "lt", 1.75, 3), ("ge", 1.75, "le", 2.5, 4), ("gt", 2.5, "lt", 3.5, 5),
        ("ge", 3.5, "le", 5.0, 6)]:
        m = getattr(x, lo_op)(lo) & getattr(x, hi_op)(hi)
        r[m] = code
    r[x > 5.0] = 7
    for lo_op, lo, hi_op, hi, code in [
        ("ge", -0.25, "lt", -0.0, 8), ("lt", -0.25, "gt", -0.75, 9), ("le", -0.75, "ge", -1.25, 10),
        ("lt", -1.25, "gt", -1.75, 11), ("le", -1.75, "ge", -2.5, 12), ("lt", -2.5, "gt", -3.5, 13),
        ("le", -3.5, "ge", -5.0, 14)]:
        m = getattr(x, lo_op)(lo) & getattr(x, hi_op)(hi)
        r[m] = code
    r[x < -5.0] = 15
    return r[:, ::2] + r[:, 1::2] * 16


def te_nvfp4(x: np.ndarray, row_scaled: bool = False):
    """(packed codes uint8 (m, n/2), E4M3 scale bytes (m, n/16), S_dec f32) by TE's formula."""
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    m, n = xt.shape
    xb = xt.view(m, n // 16, 16)
    vmax = torch.amax(torch.abs(xb), dim=-1, keepdim=True)
    fp4max = torch.tensor(6.0)
    fp8max = torch.tensor(448.0)
    flt_max = torch.tensor(torch.finfo(torch.float32).max)
    gamax = torch.amax(torch.abs(xt), dim=-1).view(m, 1, 1) if row_scaled else torch.amax(torch.abs(xt))
    s_enc = torch.div(fp8max * fp4max, gamax)
    s_enc = torch.min(s_enc, flt_max)
    s_enc = torch.where(s_enc == 0.0, torch.ones_like(s_enc), s_enc)
    s_dec = torch.div(1.0, s_enc)
    mult = s_enc * torch.reciprocal(fp4max)
    dec = torch.min(vmax * mult, flt_max)
    dec = torch.clamp(dec, min=-fp8max, max=fp8max).to(torch.float8_e4m3fn)
    enc = torch.min(torch.div(1.0, dec.to(torch.float32) * s_dec), flt_max)
    y = torch.clamp(xb * enc, -fp4max, fp4max).reshape(m, n)
    return (_te_cast_to_fp4x2(y).numpy().copy(), dec.squeeze(-1).view(torch.uint8).numpy().copy(),
            s_dec.reshape(-1).numpy().copy())


def deepgemm_fp8(x: np.ndarray, tile: str):
    """DeepGEMM's FP8 casts: tile '1x128' (per token) or '128x128' (per block).
    Returns (E4M3 codes uint8, FP32 decode scales)."""
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    m, n = xt.shape
    if tile == "1x128":
        xv = xt.view(m, -1, 128)
        amax = xv.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
        q = (xv * (448.0 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, n)
        return q.view(torch.uint8).numpy().copy(), (amax / 448.0).numpy().copy()
    xv = xt.view(m // 128, 128, n // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn).view(m, n)
    return q.view(torch.uint8).numpy().copy(), (amax / 448.0).view(m // 128, n // 128).numpy().copy()


def numpy_rceil(amax: np.ndarray, emax: int, mant_thresh: int) -> np.ndarray:
    """Integer RCEIL rule in numpy (independent of the jnp code path)."""
    b = np.asarray(amax, np.float32).view(np.uint32).astype(np.int64)
    ef, mf = (b >> 23) & 0xFF, b & 0x7FFFFF
    s = np.clip(ef - emax + (mf > mant_thresh), 0, 254)
    s = np.where(ef == 0, 0, s)
    return np.where(ef == 255, 255, s).astype(np.uint8)
