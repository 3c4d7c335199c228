"""Scale-out benchmark: communication volume per train step for each mesh axis, and the step-time
ratio sharded / unsharded, for the c2jax train step on several meshes.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        .venv/bin/python benchmarks/scaling.py --preset tiny --batch 8 --seq 64 --steps 3

Communication volume is read from the compiled HLO (`c2jax.model.parallel.comm_stats`): per-device bytes of
every collective, loops multiplied by their trip counts, attributed to the mesh axes its replica
groups span. Step time: median of ``--steps`` steps after a warm-up, with the one-device step
measured in the same process as the baseline (simulated CPU devices share the host's cores, so on
CPU the ratio shows overheads, not speed-ups). On a GPU machine the script also reports tokens/s
per device. ``--json PATH`` writes everything as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--cpu-devices" in sys.argv:  # must be set before JAX is imported
    n = sys.argv[sys.argv.index("--cpu-devices") + 1]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from c2jax.model.parallel.comm_stats import collective_stats, format_bytes  # noqa: E402
from c2jax.model.config import preset  # noqa: E402
from c2jax.model.params_spec import logical_axes, trainable_mask  # noqa: E402
from c2jax.model.parallel.sharded import jit_train_step, sharded_apply_fn, state_shardings  # noqa: E402
from c2jax.model.parallel.sharding import MeshConfig, batch_shardings, make_mesh  # noqa: E402
from c2jax.model.transformer import init, segment_positions  # noqa: E402
from c2jax.train import optim  # noqa: E402
from c2jax.train.pretrain import model_apply_fn  # noqa: E402
from c2jax.train.state import TrainState  # noqa: E402
from c2jax.train.step import make_train_step  # noqa: E402

LOSS = {"xent": 1.0, "z_loss": 1e-4, "mtp_distill": 0.3}
MESHES = {
    "fsdp8": MeshConfig(fsdp=8),
    "fsdp2_ep4": MeshConfig(fsdp=2, expert=4),
    "fsdp2_cp4": MeshConfig(fsdp=2, context=4),
    "dp2_ep2_cp2": MeshConfig(data=2, expert=2, context=2),
    "gpu_node": MeshConfig(expert=8),
}


def make_batch(cfg, B: int, S: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    seg = np.repeat(np.arange(1, 5), S // 4)[None].repeat(B, 0).astype(np.int32)  # 4 documents per row
    tokens = rng.integers(1, cfg.vocab_size, (B, S)).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1)
    loss_mask = np.concatenate([seg[:, 1:] == seg[:, :-1], np.zeros((B, 1), bool)], 1).astype(np.float32)
    return {"tokens": tokens, "targets": targets, "segment_ids": seg, "loss_mask": loss_mask,
            "positions": np.asarray(segment_positions(seg))}


def new_state(cfg, params):
    params = jax.tree_util.tree_map(lambda x: jax.numpy.array(x, copy=True), params)  # steps donate the state
    sched = optim.make_schedule({"name": "constant", "peak_lr": 1e-3}, 100)
    tx = optim.make_optimizer({"name": "adamw", "weight_decay": 0.01}, sched, params,
                              trainable=trainable_mask(cfg), axes=logical_axes(cfg))
    return TrainState.create(params, tx)


def time_steps(step, state, batch, n: int) -> tuple[float, object]:
    state, m = step(state, batch)  # warm-up (compiled already)
    jax.block_until_ready(m["loss"])
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    return statistics.median(times), state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--meshes", default="fsdp8,fsdp2_ep4,fsdp2_cp4,dp2_ep2_cp2")
    ap.add_argument("--moe-impl", default="dropless")
    ap.add_argument("--cpu-devices", type=int, default=None, help="simulate N CPU devices (set before JAX starts)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    cfg = preset(args.preset).replace(**{"moe.impl": args.moe_impl})
    params = init(cfg, jax.random.key(0))
    batch = make_batch(cfg, args.batch, args.seq)
    tokens = args.batch * args.seq
    backend, n_dev = jax.default_backend(), jax.device_count()
    print(f"backend={backend} devices={n_dev} preset={args.preset} batch={args.batch} seq={args.seq} "
          f"moe={args.moe_impl}")

    base_step = jax.jit(make_train_step(model_apply_fn(cfg), LOSS), donate_argnums=0)
    base_state = new_state(cfg, params)
    t0 = time.perf_counter()
    base_state, _ = base_step(base_state, batch)
    compile_base = time.perf_counter() - t0
    t_base, _ = time_steps(base_step, base_state, batch, args.steps)
    results = {"config": vars(args), "backend": backend, "devices": n_dev,
               "single": {"step_s": t_base, "compile_s": compile_base, "tokens_per_s_per_device": tokens / t_base}}
    print(f"{'mesh':<14}{'step s':>9}{'ratio':>8}{'tok/s/dev':>11}  comm per step (per device) by axis")
    print(f"{'1 device':<14}{t_base:>9.3f}{1.0:>8.2f}{tokens / t_base:>11.0f}  -")
    for name in [m for m in args.meshes.split(",") if m]:
        mc = MESHES[name]
        if mc.size != n_dev:
            print(f"{name:<14} skipped: needs {mc.size} devices, have {n_dev}")
            continue
        mesh = make_mesh(mc)
        state = new_state(cfg, params)
        ssh = state_shardings(state, cfg, mesh)
        bsh = batch_shardings(batch, mesh)
        step = jit_train_step(make_train_step(sharded_apply_fn(cfg, mesh, mc), LOSS), ssh, bsh)
        state = jax.device_put(state, ssh)
        gbatch = jax.device_put(batch, bsh)
        t0 = time.perf_counter()
        compiled = step.lower(state, gbatch).compile()
        compile_s = time.perf_counter() - t0
        comm = collective_stats(compiled.as_text(), mesh)
        t, _ = time_steps(step, state, gbatch, args.steps)
        by_axes = {k: v for k, v in sorted(comm["by_axes"].items(), key=lambda kv: -kv[1])}
        axes_txt = ", ".join(f"{k}: {format_bytes(v)}" for k, v in by_axes.items())
        print(f"{name:<14}{t:>9.3f}{t / t_base:>8.2f}{tokens / t / n_dev:>11.0f}  {axes_txt}")
        results[name] = {"mesh": mc.shape, "step_s": t, "ratio_vs_single": t / t_base, "compile_s": compile_s,
                         "tokens_per_s_per_device": tokens / t / n_dev, "comm_bytes_by_axes": comm["by_axes"],
                         "comm_bytes_by_kind": comm["by_kind"], "comm_bytes_total": comm["total"]}
    # CP latent gathering: the analytic all-gather ratio for the big presets
    for big in ("kimi_k2", "deepseek_v3"):
        c = preset(big)
        a = c.attention
        results[f"cp_gather_ratio_{big}"] = c.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) / (
            a.kv_lora_rank + a.qk_rope_head_dim)
    print("CP all-gather bytes, up-projected KV / latents: " + ", ".join(
        f"{b}: {results[f'cp_gather_ratio_{b}']:.1f}x" for b in ("kimi_k2", "deepseek_v3")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
