"""Deterministic test inputs for bit-exactness checks (numpy only, no torch needed).

`general_inputs`: finite f32, every 16/32-element block with max in [2^-100, 2^100] (the input
class on which the references must agree bit for bit), containing Gaussian rows with per-block
binade offsets, heavy-tailed rows, all-zero blocks (+0), blocks whose elements sit exactly on
E4M3 / E5M2 / E2M1 rounding boundaries at scale 1, and small negatives that round to -0.
`boundary_maxima`: block maxima 448*2^k (E4M3), 57344*2^k (E5M2), 6*2^k (E2M1) and +-1, 2 ulp
around them, where torchao 0.18.0's float log2 RCEIL is one step low.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np


def grid_midpoints(dtype, top: float) -> np.ndarray:
    """All positive finite values of a small float dtype up to `top` and the midpoints between them."""
    vals = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)))
    vals = vals[np.isfinite(vals) & (vals <= top)]
    mids = (vals[1:] + vals[:-1]) / 2
    return np.concatenate([vals, mids]).astype(np.float32)


def _tie_rows(dtype, top: float, k: int, rng) -> np.ndarray:
    """Rows whose 32-blocks hold `top` (so the RCEIL scale is exactly 1) plus grid values and ties."""
    pts = grid_midpoints(dtype, top)
    n_per = 31
    rows = []
    pts = rng.permutation(np.concatenate([pts, -pts]))
    for start in range(0, len(pts), n_per * (k // 32)):
        chunk = pts[start:start + n_per * (k // 32)]
        chunk = np.pad(chunk, (0, n_per * (k // 32) - len(chunk)))
        blocks = chunk.reshape(k // 32, n_per)
        blocks = np.concatenate([np.full((k // 32, 1), top, np.float32), blocks], axis=1)
        rows.append(blocks.reshape(k))
    return np.stack(rows).astype(np.float32)


def general_inputs(seed: int = 0, rows: int = 64, k: int = 256) -> np.ndarray:
    rng = np.random.default_rng(seed)
    nb = k // 32
    g = rng.standard_normal((rows, k)).astype(np.float32)
    shift = rng.integers(-60, 60, size=(rows, nb)).astype(np.float32)
    g = (g.reshape(rows, nb, 32) * np.exp2(shift)[..., None]).reshape(rows, k)
    heavy = (rng.standard_t(2, size=(rows // 4, k)) * 3).astype(np.float32)
    zero_blk = rng.standard_normal((4, k)).astype(np.float32)
    zero_blk[:, 32:64] = 0.0
    zero_blk[:, 160:176] = 0.0
    e4 = _tie_rows(ml_dtypes.float8_e4m3fn, 448.0, k, rng)
    e5 = _tie_rows(ml_dtypes.float8_e5m2, 57344.0, k, rng)
    e2 = _tie_rows(ml_dtypes.float4_e2m1fn, 6.0, k, rng)
    neg = rng.standard_normal((2, k)).astype(np.float32)
    neg[:, ::7] = -1e-3  # tiny negatives next to O(1) values: round to -0
    x = np.concatenate([g, heavy, zero_blk, e4, e5, e2, neg]).astype(np.float32)
    # keep every nonzero element a normal f32 (XLA:CPU flushes subnormals); zero stays +0
    tiny = (np.abs(x) < np.float32(2.0 ** -110)) & (x != 0)
    x[tiny] = np.float32(2.0 ** -110)
    x[x == 0] = 0.0  # no -0.0 inputs (TE maps them to +0; we keep the sign)
    return x


def boundary_maxima() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(rows (n, 32) f32 with prescribed block max, {elem: block maxima}) near elem_max * 2^k."""
    out = {}
    for name, top in (("e4m3", 448.0), ("e5m2", 57344.0), ("e2m1", 6.0)):
        base = np.float32(top) * np.exp2(np.arange(-40, 41, 4)).astype(np.float32)
        u = base.view(np.uint32).astype(np.int64)
        m = np.concatenate([(u + d).astype(np.uint32).view(np.float32) for d in (-2, -1, 0, 1, 2)])
        out[name] = m.astype(np.float32)
    rows = []
    for m in np.concatenate(list(out.values())):
        r = np.linspace(-1, 1, 32, dtype=np.float32) * m * np.float32(0.5)
        r[7] = m
        rows.append(r)
    return np.stack(rows).astype(np.float32), out
