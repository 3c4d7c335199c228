"""Continued-pretraining throughput on this machine: training tokens/s and model FLOPs utilisation
(MFU) of the jitted train step, against a matmul peak measured in the same run.

    python benchmarks/cpt_throughput.py                       # CPU presets: tiny and small
    python benchmarks/cpt_throughput.py --presets tiny --batch 16 --seq 128 --steps 10

Model FLOPs per token = 6 x (active parameters, LM head included, embedding lookup excluded) +
attention score/value FLOPs 6 x 2 x layers x heads x (qk_head + v_head) x S / 2 (causal), for the
main model plus MTP modules; forward + backward. The peak is the best f32 GFLOP/s of a jitted
square matmul (2048^3 by default) timed right before; MFU = achieved model FLOP/s / peak.
Prints one JSON line per preset and writes them to --out (default runs/benchmarks/cpt_throughput.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def matmul_peak(n: int = 2048, reps: int = 5) -> float:
    """Best GFLOP/s of a jitted f32 n x n x n matmul."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def model_flops_per_token(cfg, seq_len: int) -> float:
    from c2jax.model.config import count_active_params

    a = cfg.attention
    active = count_active_params(cfg, include_embedding=False)
    per_layer_attn = 2 * cfg.num_heads * (a.qk_head_dim + a.v_head_dim) * seq_len / 2  # causal, fwd
    layers = cfg.num_layers
    mtp = 0.0
    if cfg.mtp_depth:
        D, e = cfg.hidden_size, cfg.moe
        # eh_proj + one MoE block (attention + active experts) + shared LM head, per depth.
        blk = (count_active_params(cfg.replace(num_layers=1, first_k_dense_replace=0, mtp_depth=0))
               - cfg.vocab_size * D)  # one MoE layer + head
        mtp = cfg.mtp_depth * (2 * D * D + blk)
        layers += cfg.mtp_depth
    return 6.0 * (active + mtp) + 3.0 * layers * per_layer_attn


def bench(preset: str, batch: int, seq: int, steps: int, impl: str) -> dict:
    from c2jax.model import init
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
    fpt = model_flops_per_token(cfg, seq)
    return {"preset": preset, "moe_impl": impl, "batch": batch, "seq_len": seq, "compile_s": compile_s,
            "step_s_median": step_s, "step_s_min": float(np.min(times)), "tokens_per_s": tps,
            "model_flops_per_token": fpt, "model_gflops_per_s": tps * fpt / 1e9}


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
            peak = matmul_peak(args.peak_n)  # measured right before each preset (shared machine)
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
