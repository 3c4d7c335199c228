"""The attention backward's products that contract the query axis, as XLA:CPU runs them: the product as
autodiff asks for it against the same product on an explicitly transposed copy.

    python benchmarks/attention_dots.py                          # the `small` preset's causal block
    python benchmarks/attention_dots.py --shape 64,4,128,640,24  # the RL quickstart learner's block
    python benchmarks/attention_dots.py --repeats 5 --calls 2    # smoke

Why: in a causal block's backward, dK = dS^T Q and dV = P^T dO contract the query axis, which is
not the minor axis of dS [B,H,S,T] or P. XLA:CPU runs such a "TN" product off its fast matmul path
(a plain `dot` thunk, not a `ynn_fusion`), so a custom VJP that hands it a transposed copy looked
like a way to speed the step up (issue 15's lead). This script measures whether it would pay:

  as asked     einsum('bhst,bhsk->bhtk', dS, Q)                       (what autodiff emits)
  transposed   einsum('bhts,bhsk->bhtk', barrier(swapaxes(dS)), Q)    (copy, then the fast form)
  copy alone   swapaxes(dS) materialised

The barrier stops XLA folding the transpose back into the product. Both products are checked to
agree (within 1e-4 relative) before timing. Printed: medians over ``--repeats`` (at least 5) of
the mean over ``--calls`` calls, in ms, and the transposed form's total over the product as asked.

``--roofline`` adds what bounds the block's score product S = Q K^T [B,H,S,T] (K columns per head):
  score product   einsum('bhsk,bhtk->bhst', Q, K) alone, its GFLOP/s against the run's matmul peak
                  (best f32 2048^3 `jnp.dot`, benchmarks/perf.py)
  torch.bmm       the same product in PyTorch (a thread per core), checked equal first, timed last
  streaming pass  exp(x * c) over a tensor of the scores' shape: one read and one write per element,
                  the elementwise work a softmax does between the two products, as GB/s
  write bound     the product's output bytes at that streaming rate: a time no schedule that writes
                  the scores to memory can beat, whatever the matmul kernel
The roofline's lines are bounds, not an A/B of two forms: the peak is the one definition every benchmark
here shares (`perf.matmul_peak_gflops`), and the timed product is first checked against float64 numpy on
one head (within 1e-4 relative). With few columns per head (48 here) the product does only 2K FLOPs per 4-byte output element, so
it could be bound by writing S rather than by its FLOPs; the three lines say which of the two is
closer to its measured time, or that the matmul kernel itself falls short of both.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perf  # noqa: E402


def timed(fn, args, repeats: int, calls: int) -> float:
    """Median over `repeats` of the mean ms per call over `calls` calls (compiled first)."""
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        per.append((time.perf_counter() - t) / calls * 1e3)
    return float(np.median(per))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8,8,128,512,48",
                    help="B,H,S,T,K: batch, heads, query block, keys, head dim (default: the small preset's "
                         "causal block with qk = 32 + 16)")
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--roofline", action="store_true",
                    help="also time the score product alone, a streaming pass over its output's shape and "
                         "the matmul peak (see the module docstring)")
    args = ap.parse_args(argv)
    if args.repeats < perf.MIN_REPEATS:
        raise SystemExit(f"--repeats must be >= {perf.MIN_REPEATS} (median of at least {perf.MIN_REPEATS})")
    try:
        b, h, s, t, k = (int(x) for x in args.shape.split(","))
    except ValueError:
        raise SystemExit(f"--shape must be five integers B,H,S,T,K, got {args.shape!r}")
    rng = np.random.default_rng(0)
    ds = jnp.asarray(rng.standard_normal((b, h, s, t)).astype(np.float32))  # dS [B,H,S,T]
    q = jnp.asarray(rng.standard_normal((b, h, s, k)).astype(np.float32))  # Q [B,H,S,K]

    def as_asked(d, x):
        return jnp.einsum("bhst,bhsk->bhtk", d, x)  # [B,H,T,K]

    def transposed(d, x):
        return jnp.einsum("bhts,bhsk->bhtk", jax.lax.optimization_barrier(jnp.swapaxes(d, 2, 3)), x)

    def copy_alone(d):
        return jax.lax.optimization_barrier(jnp.swapaxes(d, 2, 3))

    a, c = np.asarray(jax.jit(as_asked)(ds, q)), np.asarray(jax.jit(transposed)(ds, q))
    rel = float(np.abs(a - c).max() / np.abs(a).max())
    if rel > 1e-4:
        raise SystemExit(f"the two forms disagree (max rel diff {rel:.1e}): not timing them")
    res = {"as_asked_ms": timed(as_asked, (ds, q), args.repeats, args.calls),
           "transposed_ms": timed(transposed, (ds, q), args.repeats, args.calls),
           "copy_ms": timed(copy_alone, (ds,), args.repeats, args.calls)}
    print(f"dK = dS^T Q for dS [{b},{h},{s},{t}], Q [{b},{h},{s},{k}] (forms agree: max rel diff {rel:.1e}); "
          f"ms per call, median of {args.repeats}")
    print(f"as asked (TN)           {res['as_asked_ms']:.2f} ms")
    print(f"transposed copy + NN    {res['transposed_ms']:.2f} ms   "
          f"{res['transposed_ms'] / res['as_asked_ms']:.2f}x the product as asked")
    print(f"  of which the copy     {res['copy_ms']:.2f} ms (the NN product alone ~"
          f"{max(res['transposed_ms'] - res['copy_ms'], 0.0):.2f} ms)")
    if args.roofline:
        res.update(roofline(q, rng, t, args.repeats, args.calls))
    return res


def roofline(q: jax.Array, rng: np.random.Generator, t: int, repeats: int, calls: int) -> dict:
    """The score product S = Q K^T alone against the matmul peak and against the time a streaming pass
    needs to write S (module docstring, ``--roofline``)."""
    b, h, s, k = q.shape
    keys = jnp.asarray(rng.standard_normal((b, h, t, k)).astype(np.float32))  # K [B,H,T,K]
    scores = jnp.asarray(rng.standard_normal((b, h, s, t)).astype(np.float32))  # S-shaped [B,H,S,T]
    flops = 2.0 * b * h * s * t * k
    out_bytes = 4.0 * b * h * s * t
    product = lambda x, y: jnp.einsum("bhsk,bhtk->bhst", x, y)  # noqa: E731
    full = np.asarray(jax.jit(product)(q, keys))  # the timed program's output, every head [B,H,S,T]
    got = full[0, 0].astype(np.float64)
    want = np.asarray(q[0, 0], np.float64) @ np.asarray(keys[0, 0], np.float64).T  # [S, T] in float64
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    if rel > 1e-4:
        raise SystemExit(f"the score product disagrees with float64 numpy (max rel diff {rel:.1e}): not timing it")
    product_ms = timed(product, (q, keys), repeats, calls)
    stream_ms = timed(lambda x: jnp.exp(x * 0.125), (scores,), repeats, calls)
    peak = perf.matmul_peak_gflops()
    # torch last: its OpenMP threads are timed after every JAX figure, so they cannot slow one
    torch_ms, torch_threads = torch_bmm_ms(q, keys, full, repeats, calls)
    stream_gbs = 2 * out_bytes / (stream_ms * 1e6)  # one read + one write per element
    write_ms = out_bytes / (stream_gbs * 1e6)
    gflops = flops / (product_ms * 1e6)
    print(f"\nroofline of the score product S = Q K^T [{b},{h},{s},{t}] ({k} columns per head; ms per call, "
          f"median of {repeats}):")
    print(f"score product alone     {product_ms:.2f} ms   {gflops:.1f} GFLOP/s = {100 * gflops / peak:.0f}% of the "
          f"matmul peak ({peak:.1f} GFLOP/s, f32 2048^3, on {perf.cores()} cores)")
    if torch_ms is not None:
        print(f"torch.bmm, same product {torch_ms:.2f} ms   {flops / (torch_ms * 1e6):.1f} GFLOP/s "
              f"({torch_threads} threads; checked equal to the timed product, every head)")
    print(f"streaming pass exp(x*c) {stream_ms:.2f} ms   {stream_gbs:.1f} GB/s (read + write)")
    print(f"write bound of S        {write_ms:.2f} ms   (its {out_bytes / 1e6:.1f} MB at that rate: "
          f"{100 * write_ms / product_ms:.0f}% of the product's time; at the peak the FLOPs alone take "
          f"{flops / (peak * 1e6):.2f} ms)")
    return {"product_ms": product_ms, "stream_ms": stream_ms, "write_bound_ms": write_ms, "peak_gflops": peak,
            "product_gflops": gflops, "stream_gbs": stream_gbs, "cores": perf.cores(), "torch_bmm_ms": torch_ms}


def torch_bmm_ms(q: jax.Array, keys: jax.Array, jax_scores: np.ndarray, repeats: int, calls: int):
    """(ms per call, threads) of the same score product as `torch.bmm` over the B*H heads, one torch
    thread per core this process may use (the baseline that splits the batch over the cores), or
    (None, 0) without torch. Every head must agree with the JAX product's ``jax_scores`` [B,H,S,T]
    (within 1e-4 of its largest entry) before it is timed."""
    try:
        import torch
    except ImportError:
        return None, 0
    torch.set_num_threads(perf.cores())
    b, h, s, k = q.shape
    tq = torch.from_numpy(np.array(q).reshape(b * h, s, k))
    tk = torch.from_numpy(np.array(keys).reshape(b * h, -1, k)).transpose(1, 2)  # [B*H, K, T]
    out = torch.bmm(tq, tk)  # [B*H, S, T]
    ref = jax_scores.reshape(out.shape)
    rel = float(np.abs(out.numpy() - ref).max() / np.abs(ref).max())
    if rel > 1e-4:
        raise SystemExit(f"torch.bmm disagrees with the JAX score product (max rel diff {rel:.1e})")
    st = perf.time_repeats(lambda: [torch.bmm(tq, tk, out=out) for _ in range(calls)], repeats=repeats)
    return st.median / calls * 1e3, torch.get_num_threads()


if __name__ == "__main__":
    main()
