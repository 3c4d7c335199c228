"""The `small` preset's training step on one CPU device against the same step split over N host devices.

    python benchmarks/host_devices.py                                  # batch 8 x 512, 2 devices, 7 repeats
    python benchmarks/host_devices.py --preset tiny --batch 2 --seq 32 --repeats 5   # smoke

Why: XLA:CPU runs a batched dot (attention's products) and much of the elementwise work on one thread
(README, Performance figures: on 2 cores about two thirds of the step gains nothing from the second
core). Host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, which this script sets
before jax is imported unless XLA_FLAGS already names a count) each run their share of a program on a
thread of their own, so splitting the batch over them is a way to put both cores on those parts. This
script measures whether it pays, and which way of splitting does.

Rows, each the same computation (the mean next-token cross-entropy over the whole batch and its gradient,
the step `model_step.py`'s `jax-dropless` row times):
  one device     ``jit(value_and_grad(loss))`` on device 0
  shard_map DP   the batch split over N devices under ``jax.shard_map``: each device the loss of its rows,
                 loss and gradients averaged with ``pmean`` (equal rows per device, so the mean of the
                 means is the mean)
  mesh DP        what the training loop compiles under ``config.mesh.data=N``: the model of
                 `c2jax.model.parallel.sharded.sharded_apply_fn` (each device's routed experts on its own
                 tokens, `ep_moe.local_moe`) jitted with the parameters replicated and the batch sharded
  GSPMD DP       plain `transformer.apply` under the same shardings, the partitioner deciding the rest
                 (the training loop before `local_moe`: dropless routing's sort gathered every token to
                 every device)

Parity gate before any timing: each split row's loss within --loss-rtol (1e-6) of one device's, and the
norm of its gradient's difference within 1e-4 of the gradient's norm; the script stops otherwise. Two
timing modes (--modes, both by default), each --warmup untimed calls then the median of --repeats (at
least 5) with the spread:
  interleaved  the rows alternate call by call in this process (a noisy neighbour hits all alike)
  alone        each row in its own process, one after another: one device in a process that has one
               device (XLA_FLAGS without a device count), the split rows in one with --devices; each
               worker's loss is checked against the gate's before its times are used
MFU uses the shared definition (benchmarks/perf.py: executed matmul FLOPs over the best f32 2048^3
`jnp.dot` of this run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys


def _set_device_count(argv: list[str]) -> None:
    """Ask XLA for --devices host devices; must run before jax is imported. An XLA_FLAGS that already
    names a count (the test suite's 8) is left alone; `main` then checks there are enough."""
    n = 2
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv) and argv[i + 1].isdigit():
            n = int(argv[i + 1])
        elif a.startswith("--devices=") and a.split("=", 1)[1].isdigit():
            n = int(a.split("=", 1)[1])
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


if __name__ == "__main__":
    _set_device_count(sys.argv[1:])

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import perf  # noqa: E402

GRAD_RTOL = 1e-4
ROWS = ("one device", "shard_map DP", "mesh DP", "GSPMD DP")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2, help="host devices to split the batch over (>= 2)")
    ap.add_argument("--preset", default="small", help="model preset (c2jax.model.preset), mtp off")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--loss-rtol", type=float, default=1e-6)
    ap.add_argument("--modes", default="interleaved,alone", help="comma-separated: interleaved, alone")
    ap.add_argument("--worker-timeout", type=float, default=1800.0)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = []
    if not args.modes or set(args.modes) - {"interleaved", "alone"}:
        bad.append(f"--modes must name interleaved and/or alone, got {args.modes}")
    if args.worker is not None and args.worker not in ROWS:
        bad.append(f"--worker must be one of {ROWS}, got {args.worker!r}")
    if args.devices < 2:
        bad.append(f"--devices must be >= 2, got {args.devices}")
    if args.repeats < perf.MIN_REPEATS:
        bad.append(f"--repeats must be >= {perf.MIN_REPEATS}, got {args.repeats}")
    if args.batch < 1 or args.seq < 2:
        bad.append(f"--batch >= 1 and --seq >= 2, got {args.batch} x {args.seq}")
    elif args.devices >= 2 and args.batch % args.devices:
        bad.append(f"--batch {args.batch} does not split into {args.devices} equal shares")
    if bad:
        raise SystemExit("host_devices.py: " + "; ".join(bad))
    return args


def loss_fn(cfg, mesh=None):
    """Mean next-token cross-entropy of tokens [B, S]; with `mesh`, through the training loop's sharded
    model (`sharded_apply_fn`), else plain `transformer.apply`."""
    from c2jax.model.transformer import apply

    if mesh is not None:
        from c2jax.model.parallel.sharded import sharded_apply_fn

        sharded = sharded_apply_fn(cfg, mesh)
        forward = lambda params, tok: sharded(params, {"tokens": tok})  # noqa: E731
    else:
        forward = lambda params, tok: apply(params, tok, cfg)  # noqa: E731

    def loss(params, tok):  # tok [B, S] -> mean next-token cross-entropy over B x (S-1)
        logits, tgt = forward(params, tok)["logits"][:, :-1], tok[:, 1:]  # [B, S-1, V], [B, S-1]
        nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0]
        return jnp.mean(nll)
    return loss


def build_rows(cfg, params, tokens: np.ndarray, devices: list, names: tuple = ROWS) -> dict:
    """{row name: zero-argument callable returning (loss, grads), already placed on its devices}, for the
    rows in `names` (one device needs only devices[0]; the split rows need them all)."""
    loss = loss_fn(cfg)
    one = jax.jit(jax.value_and_grad(loss))
    p1, t1 = jax.device_put(params, devices[0]), jax.device_put(jnp.asarray(tokens, jnp.int32), devices[0])
    if tuple(names) == ("one device",):  # a one-device process: no mesh to build
        return {"one device": lambda: one(p1, t1)}

    from c2jax.model.parallel.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(data=len(devices)), devices)  # axes data, fsdp, expert, context
    rep, bat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    pn, tn = jax.device_put(params, rep), jax.device_put(jnp.asarray(tokens, jnp.int32), bat)

    def local(p, tok):  # this device's rows -> the whole batch's mean loss and gradient
        val, grads = jax.value_and_grad(loss)(p, tok)
        return jax.lax.pmean(val, "data"), jax.tree.map(lambda g: jax.lax.pmean(g, "data"), grads)
    # check_vma off: the layer scan's carries start replicated and become per-device inside the map
    sm = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()), check_vma=False))
    gs = jax.jit(jax.value_and_grad(loss), in_shardings=(rep, bat), out_shardings=(rep, rep))
    md = jax.jit(jax.value_and_grad(loss_fn(cfg, mesh)), in_shardings=(rep, bat), out_shardings=(rep, rep))
    rows = {"one device": lambda: one(p1, t1), "shard_map DP": lambda: sm(pn, tn), "mesh DP": lambda: md(pn, tn),
            "GSPMD DP": lambda: gs(pn, tn)}
    return {name: rows[name] for name in names}


def check_parity(rows: dict, loss_rtol: float) -> dict:
    """Loss and gradient of every row against one device's; SystemExit before any timing on a mismatch."""
    ref_loss, ref_grads = jax.device_get(jax.block_until_ready(rows["one device"]()))
    ref = np.concatenate([np.ravel(g).astype(np.float64) for g in jax.tree.leaves(ref_grads)])
    out, bad = {}, []
    for name, fn in rows.items():
        loss, grads = jax.device_get(jax.block_until_ready(fn()))
        flat = np.concatenate([np.ravel(g).astype(np.float64) for g in jax.tree.leaves(grads)])
        dl = abs(float(loss) - float(ref_loss)) / abs(float(ref_loss))
        dg = float(np.linalg.norm(flat - ref) / np.linalg.norm(ref))
        out[name] = {"loss": float(loss), "loss_rel_diff": dl, "grad_rel_diff": dg}
        print(f"parity {name:14s} loss {float(loss):.7f} (rel diff {dl:.1e})  gradient rel diff {dg:.1e}")
        if dl > loss_rtol or dg > GRAD_RTOL:
            bad.append(name)
    if bad:
        raise SystemExit(f"parity gate FAILED for {bad}: beyond loss rtol {loss_rtol:g} / gradient rtol "
                         f"{GRAD_RTOL:g} of one device; nothing was timed")
    return out


def time_interleaved(rows: dict, repeats: int, warmup: int) -> dict:
    """{row: perf.Stats}: each round calls every row once, in order, timing each call."""
    run = {name: (lambda fn=fn: jax.block_until_ready(fn())) for name, fn in rows.items()}
    for _ in range(warmup):
        for fn in run.values():
            fn()
    samples = {name: [] for name in rows}
    for _ in range(repeats):
        for name, fn in run.items():
            samples[name].append(perf.time_repeats(fn, repeats=1, warmup=0).samples[0])
    return {name: perf.Stats(tuple(s)) for name, s in samples.items()}


def _inputs(args):
    from c2jax.model import init, preset

    cfg = preset(args.preset).replace(mtp_depth=0, **{"moe.impl": "dropless"})
    params = jax.tree.map(np.asarray, init(cfg, jax.random.key(0)))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq))
    return cfg, params, tokens


def run_worker(args) -> dict:
    """Body of `--worker ROW`: that row alone in this process; its loss and timed steps."""
    cfg, params, tokens = _inputs(args)
    fn = build_rows(cfg, params, tokens, jax.devices(), names=(args.worker,))[args.worker]
    loss = float(jax.block_until_ready(fn())[0])
    stats = perf.time_repeats(lambda: jax.block_until_ready(fn()), repeats=args.repeats, warmup=args.warmup)
    return {"row": args.worker, "loss": loss, "devices": len(jax.devices()), "times": list(stats.samples)}


def worker_env(row: str, devices: int) -> dict:
    """The worker's environment: XLA_FLAGS with its own device count (1 for one device) in place of any."""
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).split()
    n = 1 if row == "one device" else devices
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    return env


def time_alone(args, parity: dict) -> dict:
    """{row: perf.Stats}, each row timed in a process of its own; a worker whose loss is not the gate's
    (or that has the wrong number of devices) stops the script."""
    out = {}
    for name in ROWS:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--devices", str(args.devices),
               "--preset", args.preset, "--batch", str(args.batch), "--seq", str(args.seq),
               "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.worker_timeout,
                           env=worker_env(name, args.devices))
        res = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not res:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit code {p.returncode}"]
            raise SystemExit(f"alone worker for {name!r} failed: {tail[0][:300]}")
        r = json.loads(res[-1][len("RESULT "):])
        want = 1 if name == "one device" else args.devices
        ref = parity[name]["loss"]
        if r["devices"] != want or abs(r["loss"] - ref) > args.loss_rtol * abs(ref):
            raise SystemExit(f"alone worker for {name!r}: loss {r['loss']!r} on {r['devices']} devices, expected "
                             f"{ref!r} on {want}; its times are not used")
        out[name] = perf.Stats(tuple(r["times"]))
    return out


def report(title: str, stats: dict, flops: float, peak: float) -> dict:
    base = stats["one device"].median
    print(f"-- {title}")
    print(f"{'row':14s} {'median step':>12s}  {'x one device':>12s}  {'MFU':>6s}  spread")
    rows = {}
    for name in ROWS:
        s = stats[name]
        m = perf.mfu(flops, s.median, peak)
        print(f"{name:14s} {s.median:11.3f}s  {base / s.median:11.2f}x  {m:6.1%}  {s.spread()}")
        rows[name] = {**s.to_dict(), "speedup": base / s.median, "mfu": m}
    return rows


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.worker is not None:
        res = run_worker(args)
        print("RESULT " + json.dumps(res))
        return res
    devices = jax.devices()
    if len(devices) < args.devices:
        raise SystemExit(f"host_devices.py: {args.devices} devices asked, this process has {len(devices)} "
                         f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} was set before jax was imported)")
    devices = devices[:args.devices]
    cfg, params, tokens = _inputs(args)
    print(f"{args.preset} preset (mtp off, dropless MoE), batch {args.batch} x {args.seq}; {args.devices} host "
          f"devices on {perf.cores()} cores; jax {jax.__version__} on {devices[0].device_kind}")
    rows = build_rows(cfg, params, tokens, devices)
    parity = check_parity(rows, args.loss_rtol)
    peak = perf.matmul_peak_gflops()
    flops = perf.train_step_flops(cfg, args.batch, args.seq)
    print(f"matmul peak {peak:.1f} GFLOP/s (best f32 2048^3 jnp.dot, device 0); step {flops / 1e9:.1f} GFLOP")
    result = {"devices": args.devices, "cores": perf.cores(), "peak_gflops": peak, "parity": parity}
    if "interleaved" in args.modes:
        result["interleaved"] = report("interleaved (one process, rows alternating call by call)",
                                       time_interleaved(rows, args.repeats, args.warmup), flops, peak)
    if "alone" in args.modes:
        del rows
        result["alone"] = report("alone (each row in its own process; one device in a one-device process)",
                                 time_alone(args, parity), flops, peak)
    return result


if __name__ == "__main__":
    main()
