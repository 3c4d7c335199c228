"""Kernel benchmark: quantiser GB/s and grouped-matmul TFLOP/s per precision, each against a
baseline run in the same process, plus a correctness check of every timed kernel.

    python benchmarks/kernels.py                 # CPU: interpret-mode kernels vs the XLA reference
    python benchmarks/kernels.py --impl pallas --size large   # on a GPU/TPU (compiled kernels)

Quantiser bytes (kernels.md 5): read 4 B/elem (f32 input) + write codes (1 B FP8, 0.5 B FP4) +
scale bytes (1 per 32 MX / 16 NVFP4, 4 per 128 fp8_blockwise). Grouped-matmul FLOPs:
2 * K * N * sum(group_sizes) (unpadded). On a GPU the fraction of the datasheet peak is printed
(H100/H200: 989 dense BF16, 1979 dense FP8 TFLOP/s, HBM 3.35 / 4.8 TB/s). On CPU the numbers are
interpret-mode timings (a correctness harness, not a speed claim) next to the XLA reference.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import api, bits

PEAKS = {  # device_kind substring -> (bf16 TFLOP/s, fp8 TFLOP/s, HBM TB/s)
    "H200": (989.4, 1978.9, 4.8), "H100": (989.4, 1978.9, 3.35),
}
Q_FORMATS = ["mxfp8_e4m3", "mxfp4", "nvfp4", "nvfp4_per_token", "fp8_blockwise"]
W_BYTES = {"mxfp8_e4m3": 1 + 1 / 32, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16,
           "nvfp4_per_token": 0.5 + 1 / 16, "fp8_blockwise": 1 + 4 / 128}


def timeit(fn, *args, reps: int = 3) -> float:
    """Median wall seconds of fn(*args) after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def peak():
    kind = jax.devices()[0].device_kind
    for k, v in PEAKS.items():
        if k in kind:
            return kind, v
    return kind, None


def bench_quant(m: int, k: int, impl: str, hbm):
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    print(f"\n## quantisers  x=({m}, {k}) f32   baseline = XLA reference (jit)")
    print(f"{'format':18s} {'ref ms':>9s} {impl + ' ms':>12s} {'GB/s':>8s} {'vs ref':>7s} {'%HBM':>6s} bit-exact")
    for fmt in Q_FORMATS:
        fr = jax.jit(lambda a, f=fmt: api.quantize(a, f, impl="xla"))
        fk = jax.jit(lambda a, f=fmt: api.quantize(a, f, impl=impl))
        same = all(np.array_equal(np.asarray(u), np.asarray(v))
                   for u, v in zip(jax.tree.leaves(fr(x)), jax.tree.leaves(fk(x))))
        tr, tk = timeit(fr, x), timeit(fk, x)
        gbs = m * k * (4 + W_BYTES[fmt]) / tk / 1e9
        pct = f"{100 * gbs / (hbm * 1e3):5.1f}" if hbm else "   -"
        print(f"{fmt:18s} {tr * 1e3:9.2f} {tk * 1e3:12.2f} {gbs:8.3f} {tr / tk:7.2f} {pct:>6s} {same}")


def bench_gmm(m: int, k: int, n: int, g: int, impl: str, peaks):
    rng = np.random.default_rng(0)
    sizes = rng.multinomial(m - m // 8, np.ones(g) / g).astype(np.int32)  # ragged, 1/8 rows unused
    gs = jnp.asarray(sizes)
    a = jax.random.normal(jax.random.key(1), (m, k), jnp.float32)
    w = jax.random.normal(jax.random.key(2), (g, k, n), jnp.float32) / np.sqrt(k)
    dy = jax.random.normal(jax.random.key(3), (m, n), jnp.float32)
    flops = 2 * k * n * int(sizes.sum())
    print(f"\n## grouped matmul  M={m} K={k} N={n} G={g}  baseline = jax.lax.ragged_dot f32 (jit)")
    base = jax.jit(lambda a, w: jax.lax.ragged_dot(a, w, gs))
    tb = timeit(base, a, w)
    print(f"ragged_dot f32 fwd: {tb * 1e3:.2f} ms  {flops / tb / 1e12:.4f} TFLOP/s")
    y32 = base(a, w)
    print(f"{'precision':20s} {'fwd ms':>9s} {'TFLOP/s':>9s} {'vs base':>8s} {'%peak':>6s} "
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
        t = timeit(fk, a, w)
        tg = timeit(gk, a, w, reps=1)
        tf = flops / t / 1e12
        pk = None if peaks is None else (peaks[1] if p in ("fp8_blockwise",) else peaks[0])
        pct = f"{100 * tf / pk:5.1f}" if pk else "   -"
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
    args = ap.parse_args()
    on_cpu = jax.default_backend() == "cpu"
    impl = args.impl or ("interpret" if on_cpu else "pallas")
    size = args.size or ("small" if on_cpu else "large")
    kind, peaks = peak()
    print(f"device: {kind} ({jax.default_backend()}), impl={impl}, size={size}")
    if size == "small":
        bench_quant(256, 1024, impl, None if peaks is None else peaks[2])
        bench_gmm(512, 256, 256, 8, impl, peaks)
    else:
        bench_quant(16384, 7168, impl, None if peaks is None else peaks[2])
        bench_gmm(32768, 7168, 2048, 32, impl, peaks)
    division_ablation()


if __name__ == "__main__":
    main()
