"""The sampling engine's device steps, timed one by one: a decode step over all slots and a prefill
call into one row, at each attention window, with same-process A/B variants of the model code.

    python benchmarks/engine_steps.py                                   # quickstart policy, 32 slots
    python benchmarks/engine_steps.py --variants absorbed-out=bshc      # the decode layout before 2026-12-07
    python benchmarks/engine_steps.py --variants draw-reduce=argmax     # the sampler's draw before 2026-12-07
    python benchmarks/engine_steps.py --windows 256 --chunks 16 --repeats 5 --steps 4   # smoke

Why: an RL evaluation of the quickstart (2048 agent episodes) keeps the engine's loop busy for
nearly all of its wall time, and most of that is decode steps (a 256-episode evaluation measured
2151 decode steps against 1285 prefill calls). This script times those steps alone, with no
harness or sandbox around them, so a change to the serving forward can be judged on its own.

What runs: the engine's own jitted steps (`c2jax.sampling.device`, cache donated as in the
engine) for the model of ``--config`` (the rl_quickstart policy's shape by default; random init:
the time does not depend on the weights) with ``--slots`` cache rows of ``--max-len`` positions,
filled with random latents. Decode: every slot active, rows at ``window - steps - 1`` positions, so
``--steps`` consecutive steps stay inside the window. Prefill: ``chunk`` tokens into one row at
``window - chunk`` (the bucket the engine would pick for a row that long).

Variants (``--variants NAME=VALUE,...``, names in VARIANTS) trace the steps with a module switch of
the model set; each is compiled once, then checked against the default on the same inputs before any
timing (parity gate, every timed cell: same sampled tokens, raw logprobs within 1e-5), and the variants are timed
interleaved, repeat by repeat, so a noisy neighbour hits all alike. Printed per (step, window): the
median over ``--repeats`` (at least 5) of the mean time per step within a repeat, with min, max and
IQR, and each variant's median over the default's (> 1: the variant is slower).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perf  # noqa: E402

DEFAULT_CONFIG = "experiments/configs/rl_quickstart.py"
# name -> (module, attribute); the value comes from the command line
VARIANTS = {
    # decode's absorbed value product: "bhsc" (default since 2026-12-07) or "bshc" (before)
    "absorbed-out": ("c2jax.model.mla", "ABSORBED_OUT"),
    "split-rope": ("c2jax.model.mla", "SPLIT_ROPE_SCORES"),
    # the sampler's Gumbel-max reduction: "first" (default since 2026-12-07) or "argmax" (before)
    "draw-reduce": ("c2jax.sampling.sample", "DRAW_REDUCE"),
}


def parse_variants(text: str) -> list[tuple[str, str, str, Any]]:
    """'absorbed-out=bshc,split-rope=true' -> [(label, module, attr, value)]; bad names fail here."""
    return perf.parse_variants(text, VARIANTS)


class Steps:
    """The engine's decode and prefill steps compiled under one variant (None = the default)."""

    def __init__(self, run_cfg, variant, windows: list[int], chunks: list[int], args_for):
        from c2jax.sampling.device import _decode, _prefill

        dec = jax.jit(functools.partial(_decode, run_cfg), static_argnums=(0,), donate_argnums=(2,))
        pre = jax.jit(functools.partial(_prefill, run_cfg), static_argnums=(0,), donate_argnums=(2,))
        with perf.switched(variant):
            self.decode = {w: dec.lower(w, *args_for("decode", w)).compile() for w in windows}
            self.prefill = {(w, c): pre.lower(w, *args_for("prefill", w, c)).compile()
                            for w in windows for c in chunks if c <= w}

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="experiment file[:preset] whose config.model is timed")
    ap.add_argument("--slots", type=int, default=32, help="cache rows (the quickstart evaluates 32 episodes at once)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--windows", default="256,512,1024")
    ap.add_argument("--chunks", default="16,64,256", help="prefill chunk buckets to time")
    ap.add_argument("--steps", type=int, default=16, help="calls per timed repeat")
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--variants", default="", help=f"comma list of NAME=VALUE, NAME in {sorted(VARIANTS)}")
    args = ap.parse_args(argv)
    if args.repeats < perf.MIN_REPEATS:
        raise SystemExit(f"--repeats must be >= {perf.MIN_REPEATS} (median of at least {perf.MIN_REPEATS})")
    windows = [int(w) for w in args.windows.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    if max(windows) > args.max_len or args.steps + 1 >= min(windows):
        raise SystemExit("need every window <= --max-len and --steps + 1 < the smallest window")
    variants = [None] + parse_variants(args.variants)

    from c2jax.config import load_config_file
    from c2jax.model import init
    from c2jax.model.config import ModelConfig
    from c2jax.sampling import Engine, EngineConfig

    cfg = ModelConfig.from_config(load_config_file(args.config).model)
    S, T = args.slots, args.max_len
    eng = Engine(init(cfg, jax.random.key(0)), cfg, EngineConfig(max_slots=S, max_len=T))
    rng = np.random.default_rng(0)
    base_layers = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in layer.items()}
                   for layer in eng.cache["layers"]]
    samp_rows = {"temperature": jnp.ones((S,), jnp.float32), "top_p": jnp.ones((S,), jnp.float32),
                 "top_k": jnp.zeros((S,), jnp.int32), "seed": jnp.arange(S, dtype=jnp.uint32)}
    samp_one = {"temperature": jnp.float32(1.0), "top_p": jnp.float32(1.0), "top_k": jnp.int32(0),
                "seed": jnp.uint32(7)}
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, S), jnp.int32)

    def cache_at(length: int) -> dict:  # a fresh device cache (the steps donate theirs)
        return {"lengths": jnp.full((S,), length, jnp.int32),
                "layers": [{k: jnp.asarray(v) for k, v in layer.items()} for layer in base_layers]}

    def args_for(kind: str, w: int, c: int = 0) -> tuple:
        if kind == "decode":
            return (eng.params, cache_at(w - args.steps - 1), tokens, jnp.ones((S,), bool), samp_rows,
                    jnp.zeros((S,), jnp.int32))
        chunk = jnp.asarray(np.random.default_rng([w, c]).integers(0, cfg.vocab_size, c), jnp.int32)  # same per cell
        return (eng.params, cache_at(w - c), jnp.int32(1), chunk, jnp.int32(w - c), jnp.int32(c), samp_one,
                jnp.int32(0))

    t0 = time.perf_counter()
    compiled = [Steps(eng.run_cfg, v, windows, chunks, args_for) for v in variants]
    print(f"model: {args.config} config.model ({cfg.num_layers} layers, d {cfg.hidden_size}, "
          f"{cfg.moe.n_routed_experts} experts, MoE as {eng.run_cfg.moe.impl}); {S} slots x {T} positions; "
          f"compiled {len(variants)} variant(s) in {time.perf_counter() - t0:.1f} s")

    cells = [("decode", w, None) for w in windows] + [("prefill", w, c) for w in windows for c in chunks if c <= w]

    def first_call(st: Steps, kind: str, w: int, c: Optional[int]):
        a = args_for(kind, w, c or 0)
        return st.decode[w](*a) if kind == "decode" else st.prefill[(w, c)](*a)

    # parity gate: each variant's first call of every timed cell (decode step, prefill call) samples the
    # same tokens as the default's on the same inputs, with raw logprobs within 1e-5
    for v, st in zip(variants[1:], compiled[1:]):
        for kind, w, c in cells:
            ref, out = first_call(compiled[0], kind, w, c), first_call(st, kind, w, c)
            same_tok = bool(np.array_equal(np.asarray(ref[1]), np.asarray(out[1])))
            diff = float(np.max(np.abs(np.asarray(ref[3]) - np.asarray(out[3]))))
            where = f"{kind} window {w}" + (f" chunk {c}" if c else "")
            if not same_tok or diff > 1e-5:
                raise SystemExit(f"parity gate failed: variant {v[0]} at {where}: same tokens {same_tok}, "
                                 f"raw logprob max diff {diff:.2e}")
            print(f"parity: {v[0]} {where}: same sampled tokens, raw logprob max diff {diff:.1e}")

    times: dict[tuple, list[float]] = {}
    for _ in range(args.repeats):
        for kind, w, c in cells:
            for vi, st in enumerate(compiled):
                a = args_for(kind, w, c or 0)
                fn = st.decode[w] if kind == "decode" else st.prefill[(w, c)]
                jax.block_until_ready(a)
                t = time.perf_counter()
                cache = a[1]
                for i in range(args.steps):
                    out = fn(a[0], cache, *a[2:]) if kind == "decode" else \
                        fn(a[0], cache, jnp.int32(i % S), *a[3:])
                    cache = out[0]
                    jax.device_get(out[1:])  # the engine reads tokens/logprobs/routes every step
                times.setdefault((kind, w, c, vi), []).append((time.perf_counter() - t) / args.steps)

    labels = ["default"] + [v[0] for v in variants[1:]]
    print(f"\nms per call: median of {args.repeats} repeats of {args.steps} calls [min, max; IQR], variants interleaved")
    for kind, w, c in cells:
        name = f"{kind} window {w}" + (f" chunk {c}" if c else f" ({S} rows)")
        base = perf.Stats(tuple(times[(kind, w, c, 0)]))
        for vi, label in enumerate(labels):
            s = perf.Stats(tuple(times[(kind, w, c, vi)]))
            ratio = "" if vi == 0 else f"   {s.median / base.median:.2f}x the default"
            print(f"{name:32s} {label:22s} {s.spread(1e3, ' ms', 2)}{ratio}")


if __name__ == "__main__":
    main()
