"""Exact FP32 bit arithmetic shared by the quantisers and kernels (no float division, no log).

Why: on XLA:CPU an f32 `a / b` under jit is evaluated as `a * (1/b)` (not correctly rounded),
FP32 subnormals are flushed to zero, and `astype(float8_e8m0fnu)` rounds to the *nearest* power
of two. Every quantity the recipes need is therefore built here from integer operations on the
IEEE-754 bit pattern, which gives the same bits on every backend (CPU interpret mode, XLA:GPU,
Mosaic GPU / Triton):

* `e8m0_rceil` / `e8m0_floor`: MX shared-scale bytes from the block max's exponent/mantissa fields.
* `pow2_from_e8m0` / `recip_pow2_from_e8m0`: 2^(s-127) and its exact reciprocal 2^(127-s).
* `div_rn`: correctly rounded IEEE-754 f32 division (round to nearest even, with subnormal and
  special-value semantics) by integer long division of the significands.
* `e2m1_encode` / `e2m1_decode`: FP4 E2M1 codes by comparisons (portable to GPU kernels, where an
  fp4 cast may not lower) and `pack_nibbles` / `unpack_nibbles` (even element in the low nibble).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32_MAX = float(np.finfo(np.float32).max)
NAN_BYTE = 0xFF  # scale byte of a block containing NaN or Inf (E8M0 NaN; E4M3 negative NaN)


def f32_bits(x: jax.Array) -> jax.Array:
    """Bit pattern of an f32 array as uint32."""
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def bits_f32(b: jax.Array) -> jax.Array:
    """f32 array from a uint32 (or int32) bit pattern."""
    return lax.bitcast_convert_type(b.astype(jnp.uint32), jnp.float32)


# ------------------------------------------------------------------ E8M0 (MX) shared scales
def e8m0_rceil(amax: jax.Array, emax: int, mant_thresh: int) -> jax.Array:
    """RCEIL scale byte: smallest power of two X with amax / X <= elem_max (as uint8).

    Division-free form (kernels.md 1.4): s = Ef(amax) - emax + [Mf(amax) > mant_thresh],
    clamped to [0, 254]; amax = 0 or subnormal -> 0; NaN or Inf amax -> 0xFF.
    """
    b = f32_bits(amax).astype(jnp.int32)
    ef = (b >> 23) & 0xFF
    mf = b & 0x7FFFFF
    s = ef - emax + (mf > mant_thresh).astype(jnp.int32)
    s = jnp.clip(s, 0, 254)
    s = jnp.where(ef == 0, 0, s)  # zero / subnormal amax
    s = jnp.where(ef == 255, NAN_BYTE, s)
    return s.astype(jnp.uint8)


def e8m0_floor(amax: jax.Array, emax: int) -> jax.Array:
    """OCP (FLOOR) scale byte: Ef(amax) - emax clamped to [0, 254]; NaN/Inf -> 0xFF."""
    b = f32_bits(amax).astype(jnp.int32)
    ef = (b >> 23) & 0xFF
    s = jnp.clip(ef - emax, 0, 254)
    s = jnp.where(ef == 255, NAN_BYTE, s)
    return s.astype(jnp.uint8)


def pow2_from_e8m0(s: jax.Array) -> jax.Array:
    """2^(s-127) as f32 (s=0 gives the subnormal 2^-127; s=255 gives NaN)."""
    s = s.astype(jnp.uint32)
    b = jnp.where(s == 0, jnp.uint32(0x00400000), s << 23)
    b = jnp.where(s == 255, jnp.uint32(0x7FC00000), b)
    return bits_f32(b)


def recip_pow2_from_e8m0(s: jax.Array) -> jax.Array:
    """Exact reciprocal 2^(127-s) of an E8M0 scale, a normal f32 for s in [0, 253].

    Built from bits so no subnormal divisor is ever formed (s=0 gives 2^127, not 1/0).
    s >= 254 never occurs for the element formats here (the RCEIL byte is at most 253);
    it returns 0, and callers zero the elements of NaN blocks anyway.
    """
    e = 254 - s.astype(jnp.int32)
    return bits_f32(jnp.where(e >= 1, e << 23, 0).astype(jnp.uint32))


# ------------------------------------------------------------------ exact division
def div_rn(a: jax.Array, b: jax.Array) -> jax.Array:
    """Correctly rounded f32 division a / b (IEEE-754 round-to-nearest-even), bit-exact everywhere.

    Integer long division of the 24-bit significands (25 quotient bits + sticky), then rounding with
    full subnormal-result and overflow handling. Specials: x/0 = +-Inf, 0/0 = Inf/Inf = NaN,
    x/Inf = +-0. Subnormal inputs are honoured (normalised with clz), so the result equals numpy's
    float32 division for every pair of inputs (tested on random bit patterns).
    """
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    a, b = jnp.broadcast_arrays(a, b)
    ia = f32_bits(a).astype(jnp.int32)
    ib = f32_bits(b).astype(jnp.int32)
    sign = ((ia >> 31) ^ (ib >> 31)) & 1
    ea, eb = (ia >> 23) & 0xFF, (ib >> 23) & 0xFF
    fa, fb = ia & 0x7FFFFF, ib & 0x7FFFFF
    nan_a, nan_b = (ea == 255) & (fa != 0), (eb == 255) & (fb != 0)
    inf_a, inf_b = (ea == 255) & (fa == 0), (eb == 255) & (fb == 0)
    zero_a, zero_b = (ea == 0) & (fa == 0), (eb == 0) & (fb == 0)

    def normalise(e, f):
        # significand in [2^23, 2^24) and unbiased exponent, subnormals shifted up
        sh = jnp.maximum(lax.clz(f) - 8, 0)
        sub = e == 0
        m = jnp.where(sub, f << sh, f | 0x800000)
        ex = jnp.where(sub, -126 - sh, e - 127)
        return m, ex

    ma, xa = normalise(ea, fa)
    mb, xb = normalise(eb, fb)
    lt = (ma < mb).astype(jnp.int32)
    r = jnp.where(lt == 1, ma << 1, ma)  # r / mb in [1, 2)
    eq = xa - xb - lt

    def step(_, qr):  # one quotient bit; 25 steps = 24 significand bits + 1 guard bit
        q, r = qr
        ge = r >= mb
        return (q << 1) | ge.astype(jnp.int32), jnp.where(ge, r - mb, r) << 1

    q, r = lax.fori_loop(0, 25, step, (jnp.zeros_like(r), r))
    sticky = r != 0
    shift = jnp.clip(-125 - eq, 1, 26)  # 1 for normal results, more for subnormal ones
    mant = q >> shift
    rem = q & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (rem > half) | ((rem == half) & (sticky | ((mant & 1) == 1)))
    mant = mant + up.astype(jnp.int32)
    normal = shift == 1
    mag = jnp.where(normal, ((jnp.clip(eq, -126, 127) + 126) << 23) + mant, mant)
    mag = jnp.where(eq > 127, 0x7F800000, mag)
    mag = jnp.where(zero_a | inf_b, 0, mag)
    mag = jnp.where(inf_a | zero_b, 0x7F800000, mag)
    out = mag.astype(jnp.uint32) | (sign.astype(jnp.uint32) << 31)
    nan = nan_a | nan_b | (inf_a & inf_b) | (zero_a & zero_b)
    out = jnp.where(nan, jnp.uint32(0x7FC00000), out)
    return bits_f32(out)


def divide(a: jax.Array, b: jax.Array, div: str = "exact") -> jax.Array:
    """Division used at every quantiser site: 'exact' = `div_rn`; 'approx' = the backend's `/`
    (on XLA:CPU under jit a multiply by a reciprocal; kept only for the RL-divergence ablation)."""
    if div == "exact":
        return div_rn(a, b)
    if div == "approx":
        return jnp.asarray(a, jnp.float32) / jnp.asarray(b, jnp.float32)
    raise ValueError(f"div must be 'exact' or 'approx', got {div!r}")


# ------------------------------------------------------------------ FP4 E2M1 codes
def e2m1_encode(y: jax.Array) -> jax.Array:
    """E2M1 code (uint8, 0..15) of f32 values already clamped to [-6, 6], round-to-nearest-even.

    Decision points (kernels.md 1.1): 0.25 tie->0, 0.75 tie->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4,
    5->4. The sign bit is taken from the f32 bits, so a negative value rounding to zero gives -0
    (code 8). NaN inputs give code 7 | sign (callers zero NaN blocks).
    """
    a = jnp.abs(y)
    mag = ((a > 0.25).astype(jnp.int32) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
           + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    sign = (f32_bits(y) >> 31).astype(jnp.int32)
    return (mag | (sign << 3)).astype(jnp.uint8)


def e2m1_decode(code: jax.Array) -> jax.Array:
    """f32 value of E2M1 codes (uint8 0..15), by arithmetic (no table gather)."""
    c = code.astype(jnp.int32)
    e = (c >> 1) & 3
    m = (c & 1).astype(jnp.float32)
    mag = jnp.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * bits_f32(((e - 1 + 127) << 23)))
    return jnp.where((c & 8) != 0, -mag, mag)


def pack_nibbles(codes: jax.Array) -> jax.Array:
    """Pack 4-bit codes two per byte along the last axis: element 2i low nibble, 2i+1 high."""
    c = codes.astype(jnp.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return c[..., 0] | (c[..., 1] << 4)


def unpack_nibbles(packed: jax.Array) -> jax.Array:
    """Inverse of `pack_nibbles`: (..., n/2) uint8 -> (..., n) uint8 codes."""
    lo = packed & 0xF
    hi = packed >> 4
    return jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
