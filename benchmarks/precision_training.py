"""Train the tiny preset 50 steps in each MoE precision and report the loss gap to f32.

    python benchmarks/precision_training.py [--steps 50] [--precisions f32,mxfp8,...]

Same init, same data (a learnable synthetic stream: t[i+1] = (a * t[i] + b) mod V with a per-sequence
(a, b) drawn from 4 rules), same AdamW; only `config.model.moe.precision` changes, so the routed
experts' three grouped matmuls run the recipe of `kernels_pallas.gmm.ops` (on CPU through the
XLA reference of each recipe). Aim (issue 4): final-loss gap within 2% of f32 for fp8_blockwise /
mxfp8 and 5% for nvfp4_fwd_mxfp8_bwd. Final loss = mean of the last 5 steps.
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
import optax

from c2jax.model.config import preset
from c2jax.model.transformer import apply, init

AIMS = {"bf16": 0.02, "fp8_blockwise": 0.02, "mxfp8": 0.02, "nvfp4_fwd_mxfp8_bwd": 0.05}


def make_batches(steps: int, batch: int, seq: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rules = np.array([[3, 1], [5, 7], [7, 3], [11, 5]])
    out = np.zeros((steps, batch, seq + 1), np.int32)
    r = rules[rng.integers(0, 4, (steps, batch))]
    t = rng.integers(0, vocab, (steps, batch))
    for i in range(seq + 1):
        out[:, :, i] = t
        t = (r[..., 0] * t + r[..., 1]) % vocab
    return out


def loss_fn(params, tokens, cfg):
    out = apply(params, tokens[:, :-1], cfg)
    logp = jax.nn.log_softmax(out["logits"], axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()


def train(precision: str, steps: int, batches: np.ndarray, lr: float) -> list[float]:
    cfg = preset("tiny").replace(**{"mtp_depth": 0, "moe.precision": precision})
    params = init(cfg, jax.random.key(0))
    opt = optax.adamw(lr, weight_decay=0.0)
    state = opt.init(params)

    @jax.jit
    def step(params, state, tokens):
        loss, g = jax.value_and_grad(loss_fn)(params, tokens, cfg)
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, loss

    losses = []
    for i in range(steps):
        params, state, loss = step(params, state, jnp.asarray(batches[i]))
        losses.append(float(loss))
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--precisions", default="f32,bf16,fp8_blockwise,mxfp8,nvfp4_fwd_mxfp8_bwd")
    args = ap.parse_args()
    batches = make_batches(args.steps, args.batch, args.seq, preset("tiny").vocab_size)
    results = {}
    for p in args.precisions.split(","):
        t = time.perf_counter()
        losses = train(p, args.steps, batches, args.lr)
        results[p] = (losses, time.perf_counter() - t)
        print(f"{p:20s} loss {losses[0]:.4f} -> {np.mean(losses[-5:]):.4f}  ({results[p][1]:.1f} s)", flush=True)
    if "f32" not in results:
        return
    ref = np.mean(results["f32"][0][-5:])
    print(f"\nfinal-loss gap to f32 (f32 final {ref:.4f}), {args.steps} steps, tiny preset, {jax.default_backend()}")
    for p, (losses, secs) in results.items():
        if p == "f32":
            continue
        gap = (np.mean(losses[-5:]) - ref) / ref
        aim = AIMS.get(p)
        verdict = "" if aim is None else ("within aim" if abs(gap) <= aim else f"OUTSIDE aim {aim:.0%}")
        print(f"  {p:20s} {gap:+.2%}  {verdict}")


if __name__ == "__main__":
    main()
