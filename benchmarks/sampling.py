"""Sampling engine throughput: c2jax `Engine` vs transformers `generate` on the identical model,
and continuous vs static batching, in one process.

    python benchmarks/sampling.py                      # small preset, batches 1/8/32, 16 + 256 tokens, 5 repeats
    python benchmarks/sampling.py --new-tokens 64 --batches 1,8 --mixed-requests 16   # quicker
    python benchmarks/sampling.py --preset tiny --batches 1,2 --new-tokens 8 --mixed-requests 4 --slots 2  # smoke

1. Same weights on both sides: the `--preset` model (default `small`; mtp_depth 0, dropless MoE)
   is initialised in JAX, written with `c2jax.model.hf.io.save_pretrained` and loaded by
   `transformers.DeepseekV3ForCausalLM.from_pretrained` (float32, transformers' default attention
   implementation, printed; CPU).
2. Decode tokens/s at each batch of `--batches`: `batch` prompts of `--prompt-len` random tokens
   (fresh prompts every repeat, the same prompts for both sides), exactly `--new-tokens` greedy
   tokens each (`min_new_tokens` = `max_new_tokens`, no EOS), timed from the call to the last
   token (prefill included on both sides); tokens/s = batch x new tokens / time. The engine's
   steps are compiled by a warm-up call first (compile time reported separately); transformers
   gets one warm-up call too. JAX and PyTorch runs are interleaved, repeat by repeat, so a noisy
   neighbour on the shared CPU hits both alike. Printed: the median of `--repeats` (at least 5)
   runs with min, max and IQR (`perf.Stats`), the ratio of the medians, and the median CPU
   milliseconds per decode step.
3. Greedy agreement is measured on the timed runs' own outputs: for every prompt of every timed
   repeat, the c2jax tokens are compared with transformers' tokens position by position (both
   are f32 argmax of the same model, so they differ only after a near-tie flips one argmax and
   the continuations diverge). Printed per batch: the fraction of identical tokens and the
   fraction of prompts identical end to end, each as the median over the repeats with its min
   and max, the same two fractions pooled over all repeats x batch prompts, and the median index
   of the first difference over those prompts (= new tokens when identical).
4. Continuous vs static batching: the same engine shape (`--slots`) on a mixed-length workload of
   `--mixed-requests` requests (three quarters short: new tokens in [n/32, 5n/32), a quarter long:
   [5n/8, 7n/8), n = `--new-tokens`); static batching (`continuous=False`) admits a new batch
   only when every slot is free, continuous batching refills a slot as soon as it frees. One
   untimed run of the workload per engine compiles every shape; then the median of `--repeats`
   runs each (with min, max, IQR), interleaved, and the ratio of the medians.
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
from typing import Optional

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
    diff = ours != theirs  # [prompts, new_tokens]
    first = np.where(diff.any(1), diff.argmax(1), ours.shape[1])
    return {"tokens": float((~diff).mean()), "prompts": float((~diff.any(1)).mean()), "first_diff": first.tolist(),
            "n_tokens": int(diff.size), "n_same_tokens": int((~diff).sum()), "n_prompts": int(diff.shape[0]),
            "n_same_prompts": int((~diff.any(1)).sum())}


def summarise_agreement(per_repeat: list[dict]) -> str:
    """One line from `greedy_agreement` results of every timed repeat: median [min, max] over the
    repeats of the identical-token and identical-prompt fractions, the pooled fractions over every
    prompt of every repeat, and the median first-difference index."""
    tok = perf.Stats(tuple(a["tokens"] for a in per_repeat))
    pro = perf.Stats(tuple(a["prompts"] for a in per_repeat))
    same_t, all_t = sum(a["n_same_tokens"] for a in per_repeat), sum(a["n_tokens"] for a in per_repeat)
    same_p, all_p = sum(a["n_same_prompts"] for a in per_repeat), sum(a["n_prompts"] for a in per_repeat)
    firsts = [f for a in per_repeat for f in a["first_diff"]]
    return (f"tokens identical {tok.median:.3f} [min {tok.min:.3f}, max {tok.max:.3f}], prompts identical "
            f"{pro.median:.3f} [min {pro.min:.3f}, max {pro.max:.3f}] (median over {tok.n} repeats); pooled over "
            f"all {all_p} prompts: tokens {same_t}/{all_t}, prompts {same_p}/{all_p}; median first difference at "
            f"{int(np.median(firsts))}")


def mixed_workload(n_req: int, new_tokens: int, vocab: int, rng: np.random.Generator):
    """Mixed-length requests: a quarter long (new tokens in [5n/8, 7n/8)), the rest short ([n/32, 5n/32)),
    prompts of 8..47 tokens. Returns (prompts, new tokens per request [n_req], long mask [n_req])."""
    long = rng.random(n_req) < 0.25
    lo_l, hi_l = max(1, 5 * new_tokens // 8), max(2, 7 * new_tokens // 8)
    lo_s, hi_s = max(1, new_tokens // 32), max(2, 5 * new_tokens // 32)
    new = np.where(long, rng.integers(lo_l, max(hi_l, lo_l + 1), n_req), rng.integers(lo_s, max(hi_s, lo_s + 1), n_req))
    plen = rng.integers(8, 48, n_req)
    prompts = [list(map(int, rng.integers(0, vocab, p))) for p in plen]
    return prompts, new, long


def _hf_model(params, cfg, tmp):
    import torch
    from transformers import DeepseekV3ForCausalLM
    from c2jax.model.hf.io import save_pretrained

    save_pretrained(params, cfg, tmp, dtype="float32")
    model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    model.eval()
    return model


def _hf_generate(model, prompts: np.ndarray, new: int) -> tuple[np.ndarray, tuple[float, float]]:
    """transformers greedy tokens [batch, new] and (wall s, process CPU s)."""
    import torch

    ids = torch.as_tensor(prompts, dtype=torch.long)
    t, c = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                             eos_token_id=None)
    return out[:, prompts.shape[1]:].numpy(), (time.perf_counter() - t, time.process_time() - c)


def _ours_generate(eng: Engine, prompts: np.ndarray, new: int) -> tuple[np.ndarray, tuple[float, float]]:
    """c2jax engine greedy tokens [batch, new] and (wall s, process CPU s)."""
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


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and validate the command line (every check runs before any model is built)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", choices=["tiny", "small"])
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
    try:
        args.batch_list = [int(x) for x in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches must be a comma list of integers, got {args.batches!r}")
    if not args.batch_list or min(args.batch_list) < 1:
        ap.error(f"--batches must list batch sizes >= 1, got {args.batches!r}")
    return args


def _fmt_stats(st: Optional["perf.Stats"]) -> str:
    return "-" if st is None else st.spread(unit="", digits=1)


def bench_decode(params, cfg, hf, args, rng: np.random.Generator) -> None:
    """Section 2 + 3 of the module docstring: decode tokens/s per batch and greedy agreement."""
    print("\n== decode throughput (tokens/s, prefill included; median [min, max; IQR] n) ==")
    max_len = 1 << (args.prompt_len + args.new_tokens).bit_length()
    for b in args.batch_list:
        eng = Engine(params, cfg, EngineConfig(max_slots=b, max_len=max_len, prefix_reuse=False))
        pr = rng.integers(0, cfg.vocab_size, (b, args.prompt_len))
        t0 = time.perf_counter()
        _ours_generate(eng, pr, args.new_tokens)  # compile
        compile_s = time.perf_counter() - t0
        if hf is not None:
            _hf_generate(hf, pr, args.new_tokens)  # warm-up on the PyTorch side too
        ours_t, hf_t, agree = [], [], []
        for _ in range(args.repeats):
            pr = rng.integers(0, cfg.vocab_size, (b, args.prompt_len))  # [b, prompt_len], fresh each repeat
            o_tok, o_t = _ours_generate(eng, pr, args.new_tokens)
            ours_t.append(o_t)
            if hf is not None:
                h_tok, h_t = _hf_generate(hf, pr, args.new_tokens)
                hf_t.append(h_t)
                agree.append(greedy_agreement(o_tok, h_tok))  # every prompt of this timed run
        n = b * args.new_tokens
        o = perf.Stats(tuple(n / t[0] for t in ours_t))
        h = perf.Stats(tuple(n / t[0] for t in hf_t)) if hf_t else None
        oc = 1e3 * float(np.median([t[1] for t in ours_t])) / args.new_tokens
        hc = 1e3 * float(np.median([t[1] for t in hf_t])) / args.new_tokens if hf_t else float("nan")
        ratio = f"{o.median / h.median:.2f}x" if h else "-"
        print(f"batch {b:3d}: c2jax {_fmt_stats(o)} tok/s", flush=True)
        print(f"           transformers {_fmt_stats(h)} tok/s", flush=True)
        print(f"           c2jax / transformers (ratio of medians) {ratio}; CPU ms per decode step {oc:.1f} vs "
              f"{hc:.1f}; c2jax first call incl. compile {compile_s:.1f}s", flush=True)
        if agree:
            print(f"           greedy agreement on these timed outputs ({args.repeats} repeats x {b} prompts x "
                  f"{args.new_tokens} tokens): {summarise_agreement(agree)}", flush=True)


def bench_batching(params, cfg, args, rng: np.random.Generator) -> None:
    """Section 4: continuous vs static batching on a mixed-length workload."""
    print("\n== continuous vs static batching (mixed lengths) ==")
    prompts, new, long = mixed_workload(args.mixed_requests, args.new_tokens, cfg.vocab_size, rng)
    mixed_len = 1 << int(max(map(len, prompts)) + new.max()).bit_length()
    reqs = [Request(p, SamplingParams(temperature=0.0, max_new_tokens=int(m))) for p, m in zip(prompts, new)]
    engines = {mode: Engine(params, cfg, EngineConfig(max_slots=args.slots, max_len=mixed_len, prefix_reuse=False,
                                                      continuous=(mode == "continuous")))
               for mode in ("static", "continuous")}
    for eng in engines.values():
        eng.generate(reqs)  # untimed warm-up on the workload itself: compiles every shape it uses
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
    wall = {m: perf.Stats(tuple(v[0] for v in out[m])) for m in out}
    cpu = {m: perf.Stats(tuple(v[1] for v in out[m])) for m in out}
    for m in out:
        print(f"{m:10s} tok/s {_fmt_stats(wall[m])}")
    print(f"continuous / static (ratio of medians of {args.repeats}): "
          f"{wall['continuous'].median / wall['static'].median:.2f}x wall, "
          f"{cpu['continuous'].median / cpu['static'].median:.2f}x per CPU second "
          f"({args.mixed_requests} requests, {args.slots} slots, new tokens {new.min()}..{new.max()}, "
          f"{int(long.sum())} long)")


def bench_memory(params, cfg, hf) -> None:
    """Section 5: bytes per cached token, c2jax latent cache vs transformers' cache."""
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


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    cfg = preset(args.preset).replace(mtp_depth=0, **{"moe.impl": "dropless"})
    params = init(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        hf = None if args.skip_hf else _hf_model(params, cfg, tmp)
        attn = hf.config._attn_implementation if hf is not None else "-"
        print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
              f"({torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')!r}, "
              f"attention {attn}); model: {args.preset} preset, dropless MoE, f32", flush=True)
        bench_decode(params, cfg, hf, args, rng)
    bench_batching(params, cfg, args, rng)
    bench_memory(params, cfg, hf)
    print("\n(wall-clock figures: re-measure on an idle machine before quoting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
