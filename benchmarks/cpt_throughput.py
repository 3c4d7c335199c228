"""Continued-pretraining throughput on this machine: training tokens/s and model FLOPs utilisation
(MFU) of the jitted train step, against a matmul peak measured in the same run.

    python benchmarks/cpt_throughput.py                       # CPU presets: tiny and small
    python benchmarks/cpt_throughput.py --presets tiny --batch 16 --seq 128 --steps 10

Model FLOPs per token = `perf.train_step_flops(cfg, batch, seq, include_mtp=True, expert_rows=kept)`
/ tokens (benchmarks/perf.py, the definition every benchmark shares: matmul FLOPs of forward +
backward, the attention blocks c2jax executes, MTP modules included, and for a capacity MoE only
the expert assignments it keeps, measured by one forward pass on the benchmark batch). The peak is
`perf.matmul_peak_gflops` (best f32 GFLOP/s of a jitted square matmul, 2048^3 by default) timed
right before; MFU = achieved model FLOP/s / peak.
Prints one JSON line per preset and writes them to --out (default runs/benchmarks/cpt_throughput.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perf  # noqa: E402


def model_flops_per_token(cfg, batch: int, seq_len: int, expert_rows=None) -> float:
    """Training matmul FLOPs per token (perf.train_step_flops, MTP included)."""
    return perf.train_step_flops(cfg, batch, seq_len, include_mtp=True, expert_rows=expert_rows) / (batch * seq_len)


def bench(preset: str, batch: int, seq: int, steps: int, impl: str) -> dict:
    from c2jax.model import apply, init
    from c2jax.model.config import preset as get_preset
    from c2jax.model.params_spec import logical_axes, trainable_mask
    from c2jax.train import optim
    from c2jax.train.pretrain import model_apply_fn
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_train_step

    cfg = get_preset(preset).replace(**{"moe.impl": impl})
    params = init(cfg, jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "constant", "peak_lr": 1e-3}, steps)
    tx = optim.make_optimizer({"name": "adamw"}, sched, params, trainable=trainable_mask(cfg), axes=logical_axes(cfg))
    state = jax.device_put(TrainState.create(params, tx), jax.local_devices()[0])
    loss = {"xent": 1.0, "z_loss": 1e-4, "mtp_distill": 0.3}
    step = jax.jit(make_train_step(model_apply_fn(cfg), loss, bias_update_rate=1e-3), donate_argnums=0)
    rng = np.random.default_rng(0)
    tok = rng.integers(0, cfg.vocab_size, (batch, seq + 1))
    b = {"tokens": jnp.asarray(tok[:, :-1], jnp.int32), "targets": jnp.asarray(tok[:, 1:], jnp.int32),
         "loss_mask": jnp.ones((batch, seq), jnp.float32), "segment_ids": jnp.ones((batch, seq), jnp.int32),
         "positions": jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))}
    t = time.perf_counter()
    state, m = step(state, b)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, m = step(state, b)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))
    tps = batch * seq / step_s
    dropped = float(jnp.mean(jax.jit(lambda p, t: apply(p, t, cfg)["dropped_fraction"])(
        state.params, b["tokens"]))) if cfg.n_moe_layers else 0.0  # kept expert rows (capacity MoE)
    fpt = model_flops_per_token(cfg, batch, seq, expert_rows=batch * seq * cfg.moe.top_k * (1.0 - dropped))
    return {"preset": preset, "moe_impl": impl, "batch": batch, "seq_len": seq, "compile_s": compile_s,
            "step_s_median": step_s, "step_s_min": float(np.min(times)), "tokens_per_s": tps,
            "dropped_fraction": dropped, "model_flops_per_token": fpt, "model_gflops_per_s": tps * fpt / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--impls", default="capacity")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--peak-n", type=int, default=2048)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                  "runs", "benchmarks", "cpt_throughput.json"))
    args = ap.parse_args()
    rows = []
    for p in args.presets.split(","):
        for impl in args.impls.split(","):
            peak = perf.matmul_peak_gflops(args.peak_n)  # measured right before each preset (shared machine)
            r = bench(p, args.batch, args.seq, args.steps, impl)
            r["matmul_peak_gflops"] = peak
            r["mfu"] = r["model_gflops_per_s"] / peak
            r["device"] = str(jax.devices()[0].device_kind)
            print(json.dumps(r), flush=True)
            rows.append(r)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
