"""How small are per-step weight deltas, and does publishing them slow training down?

    python benchmarks/weight_deltas.py                       # tiny model, AdamW + Muon, lr 1e-6 and 1e-5
    python benchmarks/weight_deltas.py --model small --steps 6 --ab-repeats 7
    python benchmarks/weight_deltas.py --dry-run             # smoke shape the tests run (numbers meaningless)

Trainer: the continued-pretraining train step (`c2jax.train.step.make_train_step` over the model's
forward, loss ``{"xent": 1.0}``, `c2jax.train.optim.make_optimizer` with clipping 1.0, weight decay
0.1, the frozen router bias and its aux-free update) of the ``--model`` preset, NOT the RL stage's
learner (its rollouts make a step minutes long on CPU; the update rule — Adam(W) on the same
parameters — is the same). Data: a fixed-seed synthetic token stream with learnable structure
(t[i+1] = 7 t[i] + 3 mod V, 10% random), a fresh batch every step.

1. Delta statistics, per (optimizer, learning rate): the initial weights are published as a full
   snapshot, then every step's weights as an XOR delta against the previous step, cast to bf16 as
   the engine would receive them (``wire_dtype='bfloat16'``; f32 masters stay in the trainer). Per
   step: the share of bit-identical bf16 elements, the zstd delta size as a share of the raw bf16
   snapshot and of the zstd full snapshot, and the reader's rebuild time. The last version is
   rebuilt by a fresh reader and checked sha256-identical to the trainer's bf16 weights.
   Reference figure (Fireworks, quoted in the Composer 2 report): > 98% of bf16 weights
   bit-identical between RL steps, a delta ~2% of a full snapshot.
2. A/B of the step time with publishing on vs off, in the same process: blocks of
   ``--ab-block`` steps alternate between "off" (step only) and "on" (step + ``publish``, whose
   compression runs on a background thread during the following steps); the publisher is flushed
   (untimed) before an "off" block so its work never lands in "off" time. Each step is timed to
   ``block_until_ready`` of the new state. Printed: the median of ``--ab-repeats`` (>= 5) steps per
   arm, their ratio, and whether it is within the 10% budget.

Compiles (one train step per optimizer and learning rate) dominate the run time on CPU; they are
kept in a JAX persistent compilation cache (``--compile-cache``), so a rerun starts timing at once.

Every figure is printed by this script. The machine's load average is printed with the timings:
timings taken on a shared (contended) machine are labelled as such and must be re-measured on an
idle one before they are quoted. On a GPU trainer the step runs on the accelerator and the
publisher on host CPUs, so a CPU-only A/B is the pessimistic case (both compete for the same cores).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from c2jax.model.config import preset  # noqa: E402
from c2jax.model.params_spec import logical_axes, trainable_mask  # noqa: E402
from c2jax.model.transformer import init  # noqa: E402
from c2jax.sync import MemoryStore, WeightPublisher, WeightSubscriber  # noqa: E402
from c2jax.sync.deltas import flatten_tree  # noqa: E402
from c2jax.train import optim  # noqa: E402
from c2jax.train.pretrain import model_apply_fn  # noqa: E402
from c2jax.train.state import TrainState  # noqa: E402
from c2jax.train.step import make_train_step  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="model preset (tiny, small)")
    ap.add_argument("--optimizers", default="adamw,muon")
    ap.add_argument("--lrs", default="1e-6,1e-5", help="comma-separated learning rates (rl.learning_rate "
                    "defaults to 1e-5)")
    ap.add_argument("--steps", type=int, default=8, help="published steps per (optimizer, lr)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--level", type=int, default=3, help="zstd level")
    ap.add_argument("--ab-repeats", type=int, default=7, help="timed steps per arm of the A/B (>= 5)")
    ap.add_argument("--ab-block", type=int, default=1, help="consecutive steps per arm before switching")
    ap.add_argument("--out", default="runs/bench/weight_deltas.json")
    ap.add_argument("--compile-cache", default=os.path.join("runs", "cache", "jax_bench_weight_deltas"),
                    help="JAX persistent compilation cache dir ('' = off): a rerun loads the train steps "
                         "instead of compiling them (minutes on a busy 2-core machine)")
    ap.add_argument("--dry-run", action="store_true", help="tiny smoke shape for tests (numbers meaningless)")
    a = ap.parse_args(argv)
    if a.dry_run:
        a.model, a.optimizers, a.lrs, a.steps, a.batch, a.seq, a.ab_repeats = "tiny", "adamw", "1e-4", 2, 2, 16, 5
    a.lrs = [float(x) for x in str(a.lrs).split(",") if x]
    a.optimizers = [x for x in str(a.optimizers).split(",") if x]
    errors = []
    if a.ab_repeats < 5:
        errors.append(f"--ab-repeats must be >= 5 (a median of fewer is noise), got {a.ab_repeats}")
    if a.steps < 1 or a.batch < 1 or a.seq < 2 or a.ab_block < 1:
        errors.append("--steps, --batch, --ab-block must be >= 1 and --seq >= 2")
    if not a.lrs or any(lr <= 0 for lr in a.lrs):
        errors.append(f"--lrs must be positive numbers, got {a.lrs}")
    unknown = [o for o in a.optimizers if o not in optim.OPTIMIZERS.names()]
    if unknown or not a.optimizers:
        errors.append(f"--optimizers must be among {optim.OPTIMIZERS.names()}, got {a.optimizers}")
    if errors:
        ap.error("; ".join(errors))
    return a


def make_trainer(model: str, opt_name: str, lr: float, batch: int, seq: int):
    """(cfg, state, jitted step, batch_of(step)) for the CPT train step of `model`."""
    cfg = preset(model)
    params = init(cfg, jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "constant", "peak_lr": lr}, 1_000_000)
    tx = optim.make_optimizer({"name": opt_name, "clip_norm": 1.0, "weight_decay": 0.1}, sched, params,
                              trainable=trainable_mask(cfg), axes=logical_axes(cfg))
    state = TrainState.create(params, tx)
    step = jax.jit(make_train_step(model_apply_fn(cfg), {"xent": 1.0}, bias_update_rate=1e-3), donate_argnums=0)
    V = cfg.vocab_size

    def batch_of(i: int) -> dict:
        rng = np.random.default_rng(10_000 + i)
        t = np.empty((batch, seq + 1), np.int32)
        t[:, 0] = rng.integers(0, V, batch)
        for j in range(1, seq + 1):
            t[:, j] = (7 * t[:, j - 1] + 3) % V
        noise = rng.random(t.shape) < 0.1
        t = np.where(noise, rng.integers(0, V, t.shape), t).astype(np.int32)
        return {"tokens": jnp.asarray(t[:, :-1]), "targets": jnp.asarray(t[:, 1:]),
                "loss_mask": jnp.ones((batch, seq), jnp.float32), "segment_ids": jnp.ones((batch, seq), jnp.int32),
                "positions": jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))}

    return cfg, state, step, batch_of


def _sha_bf16(params: Any) -> dict:
    wire = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                                  params)
    return {k: hashlib.sha256(np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)).hexdigest()
            for k, x in flatten_tree(wire).items()}


def delta_stats(args, opt_name: str, lr: float) -> dict:
    """Publish the initial weights + `args.steps` steps in bf16; per-step statistics."""
    _, state, step, batch_of = make_trainer(args.model, opt_name, lr, args.batch, args.seq)
    store = MemoryStore()
    pub = WeightPublisher(store, full_every=10**9, wire_dtype="bfloat16", level=args.level, keep_full=None)
    full = pub.publish(state.params, 0).result()
    reader = WeightSubscriber(store)
    reader.rebuild(0)
    rows = []
    for i in range(1, args.steps + 1):
        state, m = step(state, batch_of(i))
        st = pub.publish(state.params, i).result()
        t0 = time.monotonic()
        reader.rebuild(i)
        rebuild_s = time.monotonic() - t0
        rows.append({"step": i, "loss": float(m.get("loss", float("nan"))),
                     "identical_bf16": st.identical_share["bfloat16"], "identical_f32": st.identical_share.get("float32"),
                     "delta_over_raw": st.stored_over_raw, "delta_over_zstd_full": st.stored_bytes / full.stored_bytes,
                     "delta_bytes": st.stored_bytes, "encode_s": st.encode_s, "rebuild_s": rebuild_s})
    pub.close()
    ok = _sha_bf16(WeightSubscriber(store).rebuild(args.steps)) == _sha_bf16(state.params)
    return {"optimizer": opt_name, "lr": lr, "raw_bytes": full.raw_bytes, "full_zstd_bytes": full.stored_bytes,
            "rows": rows, "rebuild_sha256_identical": ok}


def ab_step_time(args) -> dict:
    """Median step time with publishing off vs on (same process, alternating blocks)."""
    opt, lr = args.optimizers[0], args.lrs[0]
    _, state, step, batch_of = make_trainer(args.model, opt, lr, args.batch, args.seq)
    pub = WeightPublisher(MemoryStore(), full_every=10, wire_dtype="bfloat16", level=args.level, keep_full=1)
    for i in range(2):  # compile + one publish of each kind before timing
        state, _ = step(state, batch_of(i))
        jax.block_until_ready(state)
        pub.publish(state.params, i)
    pub.flush()
    times: dict[str, list[float]] = {"off": [], "on": []}
    caller_s: list[float] = []
    caller_cpu_s: list[float] = []  # CPU time of the trainer thread inside publish(): robust to contention
    version, i = 2, 2
    while min(len(v) for v in times.values()) < args.ab_repeats:
        for arm in ("off", "on"):
            if arm == "off":
                pub.flush()  # untimed: background work of the "on" block must not land in "off"
            for _ in range(args.ab_block):
                b = batch_of(i)
                jax.block_until_ready(b)
                t0 = time.perf_counter()
                state, _ = step(state, b)
                jax.block_until_ready(state)
                if arm == "on":
                    t1, c1 = time.perf_counter(), time.thread_time()
                    pub.publish(state.params, version)
                    caller_s.append(time.perf_counter() - t1)
                    caller_cpu_s.append(time.thread_time() - c1)
                    version += 1
                times[arm].append(time.perf_counter() - t0)
                i += 1
    pub.close()
    enc = [s.encode_s for s in list(pub.history)[2:]]
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {"optimizer": opt, "lr": lr, "repeats": len(times["on"]), "off_median_s": off, "on_median_s": on,
            "ratio_on_over_off": on / off, "within_10pct": on / off <= 1.10,
            "publish_call_median_s": statistics.median(caller_s),
            "publish_call_cpu_median_s": statistics.median(caller_cpu_s),
            "background_encode_median_s": statistics.median(enc),
            "off_s": times["off"], "on_s": times["on"]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from c2jax.compile_cache import enable_compile_cache

    enable_compile_cache(args.compile_cache, min_compile_time_s=0.0)
    cores = os.cpu_count() or 1
    print(f"# weight_deltas: model {args.model} (CPT train step, not the RL learner), batch {args.batch} x {args.seq}, "
          f"wire dtype bfloat16, zstd level {args.level}; jax {jax.__version__} on {jax.default_backend()}")
    results: dict[str, Any] = {"model": args.model, "trainer": "cpt_train_step", "stats": [], "ab": None}
    print("\n## per-step deltas (vs the previous step's bf16 weights)")
    print(f"{'optimizer':<8} {'lr':>8} {'step':>4} {'loss':>7} {'bf16 identical':>15} {'delta/raw':>10} "
          f"{'delta/zstd full':>16} {'delta KiB':>10} {'rebuild ms':>11}")
    for opt in args.optimizers:
        for lr in args.lrs:
            r = delta_stats(args, opt, lr)
            results["stats"].append(r)
            for row in r["rows"]:
                print(f"{opt:<8} {lr:>8.0e} {row['step']:>4} {row['loss']:>7.3f} {row['identical_bf16']:>15.2%} "
                      f"{row['delta_over_raw']:>10.2%} {row['delta_over_zstd_full']:>16.2%} "
                      f"{row['delta_bytes'] / 1024:>10.1f} {row['rebuild_s'] * 1e3:>11.2f}")
            med = statistics.median(x["identical_bf16"] for x in r["rows"])
            medd = statistics.median(x["delta_over_raw"] for x in r["rows"])
            print(f"{opt:<8} {lr:>8.0e} median: bf16 identical {med:.2%}, delta {medd:.2%} of the raw bf16 snapshot "
                  f"({r['raw_bytes'] / 2**20:.2f} MiB; zstd full {r['full_zstd_bytes'] / 2**20:.2f} MiB); "
                  f"rebuild sha256-identical: {r['rebuild_sha256_identical']}")
    load = os.getloadavg()[0]
    label = f"CONTENDED: load average {load:.1f} on {cores} cores" if load > 0.5 * cores else \
        f"load average {load:.1f} on {cores} cores"
    ab = ab_step_time(args)
    results["ab"] = dict(ab, load_average=load, cores=cores, contended=load > 0.5 * cores)
    print(f"\n## step time, publish off vs on ({ab['optimizer']} lr {ab['lr']:.0e}, median of {ab['repeats']} each; {label})")
    print(f"off {ab['off_median_s'] * 1e3:.1f} ms   on {ab['on_median_s'] * 1e3:.1f} ms   on/off {ab['ratio_on_over_off']:.3f} "
          f"({'within' if ab['within_10pct'] else 'OVER'} the 10% budget); publish() call {ab['publish_call_median_s'] * 1e3:.2f} ms "
          f"wall / {ab['publish_call_cpu_median_s'] * 1e3:.2f} ms CPU in the trainer thread, background encode {ab['background_encode_median_s'] * 1e3:.1f} ms per version")
    if results["ab"]["contended"]:
        print("note: timings taken on a contended machine; re-measure on an idle one before quoting them")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nwrote {args.out}")
    return results


if __name__ == "__main__":
    main()
