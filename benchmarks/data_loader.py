"""Loader throughput: packed, source-mixed batches vs copying the same number of contiguous tokens.

    python benchmarks/data_loader.py [--dir runs/data] [--seq-len 512] [--batch-size 32] [--steps 50]

Builds (or finds) the quickstart data, then times `Loader.next_batch` for a text mix (stream
packing) and for the SFT mix (whole-document packing), and, as the baseline measured in the same
process, plain contiguous slices of the in-memory token array into a preallocated [B, S+1] buffer.
Prints tokens/s and the ratio loader / baseline (the packing overhead).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rate(fn, steps: int, tokens_per_step: int) -> float:
    fn()  # warm-up (permutation caches, page cache)
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return steps * tokens_per_step / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="runs/data")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    from c2jax.data import presets
    from c2jax.data.build import build

    built = build(presets.quickstart(dir=args.dir), progress=False)
    reader = built.reader("train")
    S, B = args.seq_len, args.batch_size
    toks = reader.read_spans([(0, reader.n_tokens)])[0]
    buf = np.empty((B, S + 1), np.int32)
    rng = np.random.default_rng(0)
    hi = max(1, reader.n_tokens - S - 1)

    def baseline():
        for r, a in enumerate(rng.integers(0, hi, B)):
            buf[r] = toks[a:a + S + 1]

    base = rate(baseline, args.steps, B * S)
    text = built.loader(seq_len=S, batch_size=B, seed=0,
                        weights={k: v for k, v in built.default_weights.items() if built.source_kinds[k] == "text"},
                        reader=reader)
    t_rate = rate(text.next_batch, args.steps, B * S)
    print(f"baseline contiguous copy : {base / 1e6:8.2f} M tokens/s")
    print(f"loader, text mix (stream): {t_rate / 1e6:8.2f} M tokens/s  ratio {t_rate / base:.3f}")
    if built.tokens["train"].get("sft_synth", 0):
        sft = built.loader(seq_len=S * 4, batch_size=max(1, B // 4), seed=0, weights={"sft_synth": 1.0},
                           reader=reader)
        s_rate = rate(sft.next_batch, args.steps, max(1, B // 4) * S * 4)
        print(f"loader, SFT mix (whole)  : {s_rate / 1e6:8.2f} M tokens/s  ratio {s_rate / base:.3f}")


if __name__ == "__main__":
    main()
