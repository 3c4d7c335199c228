"""Kernel benchmark: quantiser GB/s and grouped-matmul TFLOP/s per precision, each against a
baseline run in the same process, plus a correctness check of every timed kernel.

    python benchmarks/kernel_bench.py                 # CPU: interpret-mode kernels vs the XLA reference
    python benchmarks/kernel_bench.py --impl pallas --size large   # on a GPU/TPU (compiled kernels)

Quantiser bytes (kernels.md 5): read 4 B/elem (f32 input) + write codes (1 B FP8, 0.5 B FP4) +
scale bytes (1 per 32 MX / 16 NVFP4, 4 per 128 fp8_blockwise). Grouped-matmul FLOPs:
2 * K * N * sum(group_sizes) (unpadded). On a GPU the fraction of the datasheet dense peak of the
tensor-core format each recipe's forward runs in is printed (`perf.datasheet_peak_tflops`):
fp8_blockwise and mxfp8 against the FP8 peak (H100/H200 1979 TFLOP/s), bf16 against BF16 (989),
f32 against TF32 (495), nvfp4_fwd_mxfp8_bwd against BF16 on Hopper (its forward dequantises to
BF16) and FP4 on Blackwell; quantisers against HBM bandwidth (H100 3.35, H200 4.8 TB/s). Times
are the median of --repeats (at least 5) calls after a warm-up, printed with min/max. On CPU the
numbers are interpret-mode timings (a correctness harness, not a speed claim) next to the XLA
reference.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perf  # noqa: E402
from kernels_pallas import api, bits  # noqa: E402

REPEATS = perf.MIN_REPEATS
Q_FORMATS = ["mxfp8_e4m3", "mxfp4", "nvfp4", "nvfp4_per_token", "fp8_blockwise"]
W_BYTES = {"mxfp8_e4m3": 1 + 1 / 32, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16,
           "nvfp4_per_token": 0.5 + 1 / 16, "fp8_blockwise": 1 + 4 / 128}


def timeit(fn, *args, reps: int = 0) -> perf.Stats:
    """Wall seconds of fn(*args) after one warm-up (compile) call: median/min/max of `reps`
    (default: --repeats) timed calls."""
    return perf.time_repeats(lambda: jax.block_until_ready(fn(*args)), repeats=reps or REPEATS, warmup=1)


def percent_of_peak(tflops: float, kind: str, precision: str) -> Optional[float]:
    """`tflops` as a percentage of the dense datasheet peak of the tensor-core format the recipe
    `precision` runs its forward in on `kind` (`perf.datasheet_peak_tflops`: FP8 for fp8_blockwise
    and mxfp8, BF16 for bf16, ...); None off the datasheet (a CPU)."""
    peak = perf.datasheet_peak_tflops(kind, precision)
    return None if peak is None else 100.0 * tflops / peak


def bench_quant(m: int, k: int, impl: str, kind: str):
    hbm = perf.datasheet_hbm_tbs(kind)
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    print(f"\n## quantisers  x=({m}, {k}) f32   baseline = XLA reference (jit)")
    print(f"{'format':18s} {'ref ms':>9s} {impl + ' ms':>12s} {'GB/s':>8s} {'vs ref':>7s} {'%HBM':>6s} bit-exact")
    for fmt in Q_FORMATS:
        fr = jax.jit(lambda a, f=fmt: api.quantize(a, f, impl="xla"))
        fk = jax.jit(lambda a, f=fmt: api.quantize(a, f, impl=impl))
        same = all(np.array_equal(np.asarray(u), np.asarray(v))
                   for u, v in zip(jax.tree.leaves(fr(x)), jax.tree.leaves(fk(x))))
        sr, sk = timeit(fr, x), timeit(fk, x)
        tr, tk = sr.median, sk.median
        gbs = m * k * (4 + W_BYTES[fmt]) / tk / 1e9
        pct = f"{100 * gbs / (hbm * 1e3):5.1f}" if hbm else "   -"
        print(f"{fmt:18s} {tr * 1e3:9.2f} {tk * 1e3:12.2f} {gbs:8.3f} {tr / tk:7.2f} {pct:>6s} {same}"
              f"   [{impl} min {sk.min * 1e3:.2f}, max {sk.max * 1e3:.2f} ms]")


def bench_gmm(m: int, k: int, n: int, g: int, impl: str, kind: str):
    rng = np.random.default_rng(0)
    sizes = rng.multinomial(m - m // 8, np.ones(g) / g).astype(np.int32)  # ragged, 1/8 rows unused
    gs = jnp.asarray(sizes)
    a = jax.random.normal(jax.random.key(1), (m, k), jnp.float32)
    w = jax.random.normal(jax.random.key(2), (g, k, n), jnp.float32) / np.sqrt(k)
    dy = jax.random.normal(jax.random.key(3), (m, n), jnp.float32)
    flops = 2 * k * n * int(sizes.sum())
    print(f"\n## grouped matmul  M={m} K={k} N={n} G={g}  baseline = jax.lax.ragged_dot f32 (jit)")
    base = jax.jit(lambda a, w: jax.lax.ragged_dot(a, w, gs))
    sb = timeit(base, a, w)
    tb = sb.median
    print(f"ragged_dot f32 fwd: {tb * 1e3:.2f} ms [min {sb.min * 1e3:.2f}, max {sb.max * 1e3:.2f}]  "
          f"{flops / tb / 1e12:.4f} TFLOP/s")
    y32 = base(a, w)
    print("(*%peak: of the dense datasheet peak of the MMA format the recipe's forward runs in: FP8 for "
          "fp8_blockwise/mxfp8, BF16 for bf16, TF32 for f32, see perf.MMA_FORMAT; '-' off the datasheet)")
    print(f"{'precision':20s} {'fwd ms':>9s} {'TFLOP/s':>9s} {'vs base':>8s} {'%peak*':>6s} "
          f"{'fwd+bwd ms':>11s} {'rel.err fwd':>11s} {'kernel=oracle':>13s}")
    for p in api.PRECISIONS:
        fk = jax.jit(lambda a, w, p=p: api.grouped_matmul(a, w, gs, precision=p, impl=impl))
        fo = jax.jit(lambda a, w, p=p: api.grouped_matmul(a, w, gs, precision=p, impl="xla"))
        loss = lambda a, w, p=p: jnp.sum(api.grouped_matmul(a, w, gs, precision=p, impl=impl) * dy)
        gk = jax.jit(jax.grad(loss, (0, 1)))
        try:
            yk = fk(a, w)
        except NotImplementedError as e:  # e.g. f32/bf16 have no GPU kernel under impl='pallas'
            print(f"{p:20s} no {impl} kernel: {str(e)[:70]}")
            continue
        yo = fo(a, w)
        agree = float(jnp.max(jnp.abs(yk - yo)) / jnp.max(jnp.abs(yo)))
        rel = float(jnp.linalg.norm(yk - y32) / jnp.linalg.norm(y32))
        t = timeit(fk, a, w).median
        tg = timeit(gk, a, w).median
        tf = flops / t / 1e12
        pk = percent_of_peak(tf, kind, p)
        pct = f"{pk:5.1f}" if pk is not None else "   -"
        print(f"{p:20s} {t * 1e3:9.2f} {tf:9.4f} {tb / t:8.2f} {pct:>6s} {tg * 1e3:11.1f} {rel:11.4f} "
              f"{agree:13.1e}")


def division_ablation():
    """How often the backend's `/` differs from correctly rounded division at the fp8 scale site."""
    rng = np.random.default_rng(0)
    amax = (np.abs(rng.standard_normal(100000)) * np.exp2(rng.integers(-20, 20, 100000))).astype(np.float32)
    exact = np.asarray(jax.jit(lambda a: bits.divide(a, jnp.float32(448.0), "exact"))(amax))
    approx = np.asarray(jax.jit(lambda a: bits.divide(a, jnp.float32(448.0), "approx"))(amax))
    want = amax / np.float32(448.0)
    print(f"\n## division ablation (amax/448 under jit on {jax.default_backend()}): exact == numpy on "
          f"{np.mean(exact == want):.4f}, approx '/' == numpy on {np.mean(approx == want):.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default=None, help="interpret (CPU default) | pallas (GPU/TPU default)")
    ap.add_argument("--size", default=None, choices=["small", "large"])
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    args = ap.parse_args()
    if args.repeats < perf.MIN_REPEATS:
        ap.error(f"--repeats must be >= {perf.MIN_REPEATS}, got {args.repeats}")
    global REPEATS
    REPEATS = args.repeats
    on_cpu = jax.default_backend() == "cpu"
    impl = args.impl or ("interpret" if on_cpu else "pallas")
    size = args.size or ("small" if on_cpu else "large")
    kind = jax.devices()[0].device_kind
    print(f"device: {kind} ({jax.default_backend()}), impl={impl}, size={size}, median of {REPEATS}")
    if size == "small":
        bench_quant(256, 1024, impl, kind)
        bench_gmm(512, 256, 256, 8, impl, kind)
    else:
        bench_quant(16384, 7168, impl, kind)
        bench_gmm(32768, 7168, 2048, 32, impl, kind)
    division_ablation()


if __name__ == "__main__":
    main()
