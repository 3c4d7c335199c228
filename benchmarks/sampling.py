"""Sampling engine throughput: c2jax `Engine` vs transformers `generate` on the identical model,
and continuous vs static batching, in one process.

    python benchmarks/sampling.py                      # small preset, batches 1/8/32, 16 + 256 tokens, 5 repeats
    python benchmarks/sampling.py --new-tokens 64 --batches 1,8 --mixed-requests 16   # quicker

1. Same weights on both sides: the `small` preset (mtp_depth 0, dropless MoE) is initialised in
   JAX, written with `c2jax.model.hf.io.save_pretrained` and loaded by
   `transformers.DeepseekV3ForCausalLM.from_pretrained` (float32, transformers' default attention,
   CPU).
2. Decode tokens/s at batch 1, 8, 32: `batch` prompts of `--prompt-len` random tokens (fresh
   prompts every repeat, the same prompts for both sides), exactly `--new-tokens` greedy tokens
   each (`min_new_tokens` = `max_new_tokens`, no EOS), timed from the call to the last token
   (prefill included on both sides); tokens/s = batch x new tokens / time. The engine's steps are
   compiled by a warm-up call first (compile time reported separately); transformers gets one
   warm-up call too. JAX and PyTorch runs are
   interleaved, repeat by repeat, so a noisy neighbour on the shared CPU hits both alike; the
   figure is the median of `--repeats` (at least 5) runs, printed with its min and max.
3. Greedy agreement is measured on the timed runs' own outputs: for every prompt of every timed
   repeat, the c2jax tokens are compared with transformers' tokens position by position (both
   are f32 argmax of the same model, so they differ only after a near-tie flips one argmax and
   the continuations diverge). Printed per batch: the fraction of identical tokens, the fraction
   of prompts identical end to end, and the median index of the first difference.
4. Continuous vs static batching: the same engine shape (8 slots) on a mixed-length workload
   (most requests short, a quarter long); static batching (`continuous=False`) admits a new
   batch only when every slot is free, continuous batching refills a slot as soon as it frees.
   Median of `--repeats` runs each, interleaved.
5. Memory per cached token: the engine's latent MLA cache (c_kv + k_rope per layer) against the
   per-head K/V cache transformers keeps for the same model.

PyTorch's OpenMP threads busy-wait between parallel regions by default; on a shared, oversubscribed
CPU that costs transformers up to 10x (measured: 9-35 vs 170-300 tok/s at batch 8, contended;
compare ``python benchmarks/sampling.py --batches 8 --omp-default`` with the same command without
the flag). The benchmark therefore sets ``OMP_WAIT_POLICY=PASSIVE`` (transformers' best showing here) unless
``--omp-default`` is given. CPU seconds per decode step are printed beside wall-clock figures
because the wall clock on a shared machine depends on the neighbours. Every figure above is
printed by this script; re-measure wall-clock figures on an idle machine before quoting them.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if "--omp-default" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede the torch import

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from c2jax.model import init, preset  # noqa: E402
from c2jax.sampling import Engine, EngineConfig, Request, SamplingParams  # noqa: E402
import perf  # noqa: E402


def greedy_agreement(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Position-by-position comparison of two [prompts, new_tokens] greedy outputs: fraction of
    identical tokens, fraction of prompts identical end to end, first differing index per prompt
    (new_tokens when identical)."""
    if ours.shape != theirs.shape:
        raise ValueError(f"outputs differ in shape: {ours.shape} vs {theirs.shape}")
    diff = ours != theirs
    first = np.where(diff.any(1), diff.argmax(1), ours.shape[1])
    return {"tokens": float((~diff).mean()), "prompts": float((~diff.any(1)).mean()), "first_diff": first.tolist()}


def _hf_model(params, cfg, tmp):
    import torch
    from transformers import DeepseekV3ForCausalLM
    from c2jax.model.hf.io import save_pretrained

    save_pretrained(params, cfg, tmp, dtype="float32")
    model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    model.eval()
    return model


def _hf_generate(model, prompts: np.ndarray, new: int) -> tuple[np.ndarray, float]:
    import torch

    ids = torch.as_tensor(prompts, dtype=torch.long)
    t, c = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                             eos_token_id=None)
    return out[:, prompts.shape[1]:].numpy(), (time.perf_counter() - t, time.process_time() - c)


def _ours_generate(eng: Engine, prompts: np.ndarray, new: int) -> tuple[np.ndarray, float]:
    reqs = [Request(list(map(int, p)), SamplingParams(temperature=0.0, max_new_tokens=new)) for p in prompts]
    t, c = time.perf_counter(), time.process_time()
    res = eng.generate(reqs)
    return np.stack([r.output_tokens for r in res]), (time.perf_counter() - t, time.process_time() - c)


def _hf_cache_bytes_per_token(model, cfg) -> float:
    import torch

    ids = torch.zeros((1, 32), dtype=torch.long)
    with torch.inference_mode():
        pkv = model(ids, use_cache=True).past_key_values
    total = 0
    for layer in getattr(pkv, "layers", []):
        for name in ("keys", "values"):
            x = getattr(layer, name, None)
            if x is not None:
                total += x.numel() * x.element_size()
    return total / 32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--mixed-requests", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--omp-default", action="store_true", help="keep PyTorch's default OpenMP wait policy")
    args = ap.parse_args(argv)
    if args.repeats < perf.MIN_REPEATS:
        ap.error(f"--repeats must be >= {perf.MIN_REPEATS} (a median needs a spread), got {args.repeats}")
    if min(args.prompt_len, args.new_tokens, args.mixed_requests, args.slots) < 1:
        ap.error("--prompt-len, --new-tokens, --mixed-requests and --slots must be >= 1")
    import torch

    cfg = preset("small").replace(mtp_depth=0, **{"moe.impl": "dropless"})
    params = init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); model: small preset, dropless MoE, f32", flush=True)
    max_len = 1 << (args.prompt_len + args.new_tokens).bit_length()

    with tempfile.TemporaryDirectory() as tmp:
        hf = None if args.skip_hf else _hf_model(params, cfg, tmp)
        print("\n== decode throughput (tokens/s, prefill included) ==")
        for b in [int(x) for x in args.batches.split(",")]:
            eng = Engine(params, cfg, EngineConfig(max_slots=b, max_len=max_len, prefix_reuse=False))
            pr = rng.integers(0, cfg.vocab_size, (b, args.prompt_len))
            t0 = time.perf_counter()
            _ours_generate(eng, pr, args.new_tokens)  # compile
            compile_s = time.perf_counter() - t0
            if hf is not None:
                _hf_generate(hf, pr, args.new_tokens)  # warm-up on the PyTorch side too
            ours_t, hf_t, agree = [], [], []
            for _ in range(args.repeats):
                pr = rng.integers(0, cfg.vocab_size, (b, args.prompt_len))
                o_tok, o_t = _ours_generate(eng, pr, args.new_tokens)
                ours_t.append(o_t)
                if hf is not None:
                    h_tok, h_t = _hf_generate(hf, pr, args.new_tokens)
                    hf_t.append(h_t)
                    agree.append(greedy_agreement(o_tok, h_tok))
            n = b * args.new_tokens
            o = perf.Stats(tuple(n / t[0] for t in ours_t))
            h = perf.Stats(tuple(n / t[0] for t in hf_t)) if hf_t else None
            oc = 1e3 * float(np.median([t[1] for t in ours_t])) / args.new_tokens
            hc = 1e3 * float(np.median([t[1] for t in hf_t])) / args.new_tokens if hf_t else float("nan")
            ratio = f"{o.median / h.median:5.2f}x" if h else "  -  "
            print(f"batch {b:3d}: c2jax {o.median:8.1f} tok/s [{o.min:.1f}, {o.max:.1f}]   transformers "
                  f"{h.median if h else float('nan'):8.1f} tok/s [{h.min if h else float('nan'):.1f}, "
                  f"{h.max if h else float('nan'):.1f}]   ratio of medians {ratio}   CPU ms/step {oc:6.1f} vs "
                  f"{hc:6.1f}   (first call incl. compile {compile_s:.1f}s; median of {args.repeats})", flush=True)
            if agree:
                firsts = [f for a in agree for f in a["first_diff"]]
                print(f"           greedy agreement on these timed outputs ({args.repeats} x {b} prompts x "
                      f"{args.new_tokens} tokens): tokens {np.mean([a['tokens'] for a in agree]):.3f}, prompts "
                      f"identical {np.mean([a['prompts'] for a in agree]):.3f}, median first difference at "
                      f"{int(np.median(firsts))}", flush=True)

    print("\n== continuous vs static batching (mixed lengths) ==")
    n_req = args.mixed_requests
    long = rng.random(n_req) < 0.25
    new = np.where(long, rng.integers(160, 225, n_req), rng.integers(8, 40, n_req))
    plen = rng.integers(8, 48, n_req)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, p))) for p in plen]
    mixed_len = 1 << int(plen.max() + new.max()).bit_length()
    reqs = [Request(p, SamplingParams(temperature=0.0, max_new_tokens=int(m))) for p, m in zip(prompts, new)]
    engines = {mode: Engine(params, cfg, EngineConfig(max_slots=args.slots, max_len=mixed_len, prefix_reuse=False,
                                                      continuous=(mode == "continuous")))
               for mode in ("static", "continuous")}
    warm = [Request(list(range(1, n + 1)), SamplingParams(temperature=0.0, max_new_tokens=2))
            for n in (8, 16, 32, 48)]  # compile every prefill bucket the workload uses
    for eng in engines.values():
        eng.generate(warm)
    out = {m: [] for m in engines}
    for _ in range(args.repeats):
        for mode, eng in engines.items():
            eng.stats.clear()
            t, c = time.perf_counter(), time.process_time()
            res = eng.generate(reqs)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            toks = sum(len(r.output_tokens) for r in res)
            out[mode].append((toks / dt, toks / dc))
            print(f"{mode:10s}: {toks} tokens in {dt:6.1f}s = {toks / dt:7.1f} tok/s ({toks / dc:7.1f} per CPU s), "
                  f"{eng.stats['decode_steps']} decode steps", flush=True)
    med = {m: (float(np.median([v[0] for v in out[m]])), float(np.median([v[1] for v in out[m]]))) for m in out}
    print(f"continuous / static (medians of {args.repeats}): {med['continuous'][0] / med['static'][0]:.2f}x wall, "
          f"{med['continuous'][1] / med['static'][1]:.2f}x per CPU second "
          f"({n_req} requests, {args.slots} slots, new tokens {new.min()}..{new.max()}, "
          f"{int(long.sum())} long)")

    print("\n== memory per cached token ==")
    c = Engine(params, cfg, EngineConfig(max_slots=1, max_len=64)).cache
    ours_b = sum(x.nbytes for x in jax.tree.leaves(c["layers"])) / 64
    a = cfg.attention
    mha_b = cfg.num_layers * cfg.num_heads * (a.qk_head_dim + a.v_head_dim) * 4
    print(f"c2jax latent cache: {ours_b:.0f} bytes/token ({cfg.num_layers} layers x "
          f"(kv_lora {a.kv_lora_rank} + rope {a.qk_rope_head_dim}) x 4 B)")
    if hf is not None:
        print(f"transformers DynamicCache (measured): {_hf_cache_bytes_per_token(hf, cfg):.0f} bytes/token "
              f"(transformers 5 also caches the latent, and re-expands per-head K/V over the whole history "
              f"at every step); a per-head K/V cache would need {mha_b} bytes/token")
    else:
        print(f"per-head K/V cache of the same model (formula): {mha_b} bytes/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
