"""GPU kit: one run that proves the low-precision MoE kernels on a lent GPU and records them.

    bash benchmarks/gpu_kit.sh [--out DIR]        # on the GPU machine (installs, then runs this)
    python benchmarks/gpu_kit.py --dry-run --out DIR   # CPU: interpret-mode correctness + skeleton

Writes `DIR/gpu_kit.json` and `DIR/gpu_kit.md` (one row per check or measurement) and, on a GPU,
the validation record that `impl='auto'` reads (`kernels_pallas.gpu_validation`; a copy goes to
`DIR/kernel_validation.json`). Sections:
  * device: platform, device kind, memory, versions, datasheet peaks (`perf.DATASHEET`);
  * lowering: every GPU kernel lowers for CUDA (Triton / Mosaic GPU custom calls); control: the
    TPU-style kernel is rejected;
  * correctness: Triton grouped matmuls (fwd + dgrad + wgrad through the custom_vjp) for every
    precision against impl='xla'; Mosaic GPU Hopper kernels (GPU only); Triton quantisers
    bit-exact against the reference; per-token NVFP4 batch invariance (with a per-tensor control);
  * gmm: TFLOP/s at the kimi_k2 preset's expert shapes (K=7168 -> N=2048 and back, 8 experts,
    512..8192 tokens per expert) per format, as a share of the datasheet peak of the MMA format
    it runs in, beside `jax.lax.ragged_dot` in bf16; aims: FP8 >= 50% of FP8 peak, >= 1.5x bf16
    ragged_dot;
  * quant: quantiser GB/s as a share of HBM bandwidth (aim >= 60%), beside the XLA reference;
  * model: the `small` preset's train step (tokens/s) and the sampler's greedy decode tokens/s.
With `--dry-run` (or no GPU) every GPU row says "not run: no GPU". Times are medians of
`perf.time_repeats` after a warm-up call; FLOPs use the unpadded token counts (2*M*K*N).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gpu_kit_checks as checks  # noqa: E402
import perf  # noqa: E402
from gpu_kit_checks import row  # noqa: E402
from kernels_pallas import api, gpu_validation  # noqa: E402
from kernels_pallas.gmm import hopper, triton_gmm  # noqa: E402
from kernels_pallas.quant import reference as qref, triton_quant  # noqa: E402

NO_GPU = "not run: no GPU"
KIMI = {"experts_per_device": 8, "hidden": 7168, "moe_ff": 2048}   # c2jax.model preset('kimi_k2')
SWEEP_TOKENS = 2048
QUANT_SHAPE = (16384, 7168)
INTERPRET = False  # --simulate-on-cpu: the GPU sections' code on CPU in interpret mode (plumbing only)
SWEEP = {  # Triton tile configs tried at one shape; the fastest is used for the table
    "plain": [triton_gmm.TileConfig(128, 64, 128, 8, 3), triton_gmm.TileConfig(128, 64, 256, 8, 3),
              triton_gmm.TileConfig(64, 64, 128, 4, 4)],
    "fp8bw": [triton_gmm.TileConfig(128, 128, 128, 8, 3), triton_gmm.TileConfig(64, 128, 128, 4, 3),
              triton_gmm.TileConfig(128, 128, 64, 4, 4)],
    "mx": [triton_gmm.TileConfig(128, 64, 128, 8, 3), triton_gmm.TileConfig(64, 64, 128, 4, 4)],
}


class Timer:
    """Median wall seconds of a jitted call, or None in a dry run (the row then says NO_GPU)."""

    def __init__(self, dry: bool, repeats: int):
        self.dry, self.repeats = dry, repeats

    def __call__(self, fn, *args):
        if self.dry:
            return None
        return perf.time_repeats(lambda: jax.block_until_ready(fn(*args)), repeats=self.repeats, warmup=1).median


# ------------------------------------------------------------------ device facts
def device_facts(on_gpu: bool) -> dict:
    import jaxlib
    dev = jax.devices()[0]
    facts = {"platform": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count(),
             "jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": platform.python_version(),
             "host": platform.node(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        stats = dev.memory_stats() or {}
        facts["memory_bytes"] = stats.get("bytes_limit")
    except Exception:  # noqa: BLE001 - CPU devices have no memory stats
        facts["memory_bytes"] = None
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        facts["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    if on_gpu:  # this machine's ceilings: an 8192^3 bf16 matmul and a device-to-device copy
        a = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16)
        mm = perf.time_repeats(lambda: jax.block_until_ready(jnp.dot(a, a)), repeats=10, warmup=3).median
        big = jnp.ones((2 ** 30,), jnp.float32)
        cp = jax.jit(lambda v: v + 0.0)
        sec = perf.time_repeats(lambda: jax.block_until_ready(cp(big)), repeats=10, warmup=3).median
        facts["measured_bf16_matmul_tflops"] = round(2 * 8192 ** 3 / mm / 1e12, 1)
        facts["measured_copy_tbs_read_plus_write"] = round(2 * 4 * 2 ** 30 / sec / 1e12, 2)
        del a, big
    kind = dev.device_kind if on_gpu else "H200 (datasheet, for the skeleton)"
    facts["peaks"] = {"bf16_tflops": perf.datasheet_peak_tflops(kind, "bf16"),
                      "fp8_tflops": perf.datasheet_peak_tflops(kind, "fp8_blockwise"),
                      "hbm_tbs": perf.datasheet_hbm_tbs(kind)}
    return facts


# ------------------------------------------------------------------ grouped matmul speed
def _quantised(x, w) -> dict:
    """The FP8-blockwise and MXFP8 operands of one shape (jitted reference quantisers, outside timing)."""
    e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)  # noqa: E731
    qa, qw = api.quantize(x, "fp8_blockwise", 1, impl="xla"), api.quantize(w, "fp8_blockwise", 1, impl="xla", tile=(128, 128))
    ma, mw = api.quantize(x, "mxfp8_e4m3", 1, impl="xla"), api.quantize(w, "mxfp8_e4m3", 1, impl="xla")
    return {"fp8": (e4(qa.data), qa.scales, e4(qw.data), qw.scales),
            "mx": (e4(ma.data), ma.scales, e4(mw.data), mw.scales)}


def _gmm_candidates(x, w, gs, q, cfgs):
    """name -> (fn, args, MMA precision for the peak) at one shape."""
    bf = jnp.bfloat16
    tri = lambda kind, cfg: jax.jit(lambda a, sa, b, sb, g: triton_gmm.gmm(  # noqa: E731
        (a, sa), (b, sb), g, kind=kind, out_dtype=bf, config=cfg, interpret=INTERPRET))
    return {
        "ragged_dot bf16 (XLA baseline)": (jax.jit(lambda a, b, g: jax.lax.ragged_dot(a, b, g, preferred_element_type=bf)),
                                           (x, w, gs), "bf16"),
        "triton bf16": (jax.jit(lambda a, b, g: triton_gmm.gmm((a,), (b,), g, kind="plain", out_dtype=bf,
                                                               config=cfgs["plain"], interpret=INTERPRET)),
                        (x, w, gs), "bf16"),
        "triton fp8_blockwise": (tri("fp8bw", cfgs["fp8bw"]), (*q["fp8"], gs), "fp8_blockwise"),
        "triton mxfp8 (BF16 MMA)": (tri("mx", cfgs["mx"]), (*q["mx"], gs), "mxfp8"),
        "mosaic hopper fp8_blockwise": (jax.jit(lambda a, sa, b, sb, g: hopper.fp8_blockwise_gmm_hopper(
            a, sa, jnp.swapaxes(b, 1, 2), sb, g, out_dtype=bf)), (*q["fp8"], gs), "fp8_blockwise"),
    }


def _operands(t: int, k: int, n: int, dry: bool):
    g = KIMI["experts_per_device"]
    if dry:  # shapes only: nothing is allocated in a dry run
        return None, None, None
    x = jax.random.normal(jax.random.key(0), (g * t, k), jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(1), (g, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    return x, w, jnp.full((g,), t, jnp.int32)


def sweep_tiles(timer: Timer, dry: bool) -> tuple[dict, list]:
    """Fastest Triton TileConfig per kind at kimi up/gate, 2048 tokens per expert."""
    best = {kind: cfgs[0] for kind, cfgs in SWEEP.items()}
    rows = []
    if dry:
        return best, [row("gmm", "tile sweep (kimi up/gate, 2048 tok/expert)", NO_GPU)]
    x, w, gs = _operands(SWEEP_TOKENS, KIMI["hidden"], KIMI["moe_ff"], dry)
    q = _quantised(x, w)
    for kind, cfgs in SWEEP.items():
        times = {}
        for cfg in cfgs:
            cands = _gmm_candidates(x, w, gs, q, {**best, kind: cfg})
            name = {"plain": "triton bf16", "fp8bw": "triton fp8_blockwise", "mx": "triton mxfp8 (BF16 MMA)"}[kind]
            fn, args, _ = cands[name]
            try:
                times[cfg] = timer(fn, *args)
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is skipped
                rows.append(row("gmm", f"tile sweep {kind} {cfg}", f"error: {type(e).__name__}: {str(e)[:200]}"))
        if times:
            best[kind] = min(times, key=times.get)
            rows.append(row("gmm", f"tile sweep {kind}", "measured", str(best[kind]), "best config",
                            "; ".join(f"{c}: {1e3 * s:.3f} ms" for c, s in times.items())))
    return best, rows


def bench_gmm(timer: Timer, device_kind: str, tokens: list, cfgs: dict, dry: bool) -> list:
    rows = []
    g, h, f = KIMI["experts_per_device"], KIMI["hidden"], KIMI["moe_ff"]
    shapes = [("up/gate", h, f), ("down", f, h)]
    for label, k, n in shapes:
        for t in tokens:
            x, w, gs = _operands(t, k, n, dry)
            cands = _gmm_candidates(x, w, gs, _quantised(x, w), cfgs) if not dry else {name: (None, None, prec) for name, prec in (
                ("ragged_dot bf16 (XLA baseline)", "bf16"), ("triton bf16", "bf16"),
                ("triton fp8_blockwise", "fp8_blockwise"), ("triton mxfp8 (BF16 MMA)", "mxfp8"),
                ("mosaic hopper fp8_blockwise", "fp8_blockwise"))}
            flops = 2.0 * g * t * k * n
            base = None
            for name, (fn, args, prec) in cands.items():
                rname = f"{label} K={k} N={n} G={g} T={t}: {name}"
                if dry:
                    rows.append(row("gmm", rname, NO_GPU, unit="TFLOP/s"))
                    continue
                try:
                    sec = timer(fn, *args)
                except Exception as e:  # noqa: BLE001
                    rows.append(row("gmm", rname, f"error: {type(e).__name__}: {str(e)[:200]}"))
                    continue
                tf = flops / sec / 1e12
                base = tf if name.startswith("ragged_dot") else base
                peak = perf.datasheet_peak_tflops(device_kind, prec)
                share = f"{100 * tf / peak:.1f}% of {prec} MMA peak {peak:g}" if peak else "peak unknown"
                vs = f"; {tf / base:.2f}x ragged_dot bf16" if base else ""
                rows.append(row("gmm", rname, "measured", round(tf, 1), "TFLOP/s", f"{1e3 * sec:.3f} ms; {share}{vs}"))
                if name == "triton fp8_blockwise" and peak and base:
                    ok = tf >= 0.5 * peak and tf >= 1.5 * base
                    rows.append(row("aims", f"FP8 gmm {label} T={t}: >= 50% FP8 peak and >= 1.5x bf16 ragged_dot",
                                    "pass" if ok else "fail", round(tf / peak, 3), "share of FP8 peak",
                                    f"{tf / base:.2f}x ragged_dot"))
            if dry:
                rows.append(row("aims", f"FP8 gmm {label} T={t}: >= 50% FP8 peak and >= 1.5x bf16 ragged_dot", NO_GPU))
    return rows


# ------------------------------------------------------------------ quantiser bandwidth
def bench_quant(timer: Timer, device_kind: str, dry: bool) -> list:
    m, k = QUANT_SHAPE
    rows = []
    hbm = perf.datasheet_hbm_tbs(device_kind)
    x = None if dry else jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    write = {"mxfp8_e4m3": 1 + 1 / 32, "mxfp8_e5m2": 1 + 1 / 32, "nvfp4_per_token": 0.5 + 1 / 16 + 4 / k}
    for fmt in triton_quant.FORMATS:
        for impl in ("xla", "triton_interpret" if INTERPRET else "triton"):
            name = f"{fmt} x=({m}, {k}) bf16 [{impl}]"
            if dry:
                rows.append(row("quant", name, NO_GPU, unit="GB/s"))
                continue
            try:
                sec = timer(jax.jit(lambda a, f=fmt, i=impl: api.quantize(a, f, -1, impl=i)), x)
            except Exception as e:  # noqa: BLE001
                rows.append(row("quant", name, f"error: {type(e).__name__}: {str(e)[:200]}"))
                continue
            gbs = m * k * (2 + write[fmt]) / sec / 1e9
            share = gbs / (hbm * 1e3) if hbm else None
            rows.append(row("quant", name, "measured", round(gbs, 1), "GB/s",
                            f"{1e3 * sec:.3f} ms; " + (f"{100 * share:.1f}% of HBM {hbm} TB/s" if share else "HBM unknown")))
            if impl != "xla" and share is not None:
                rows.append(row("aims", f"quantiser {fmt} >= 60% of HBM bandwidth", "pass" if share >= 0.6 else "fail",
                                round(share, 3), "share of HBM"))
        if dry:
            rows.append(row("aims", f"quantiser {fmt} >= 60% of HBM bandwidth", NO_GPU))
    return rows


# ------------------------------------------------------------------ model train step and decode
def bench_model(timer: Timer, dry: bool, batch: int = 8, seq: int = 512, new_tokens: int = 128) -> list:
    names = [f"small preset train step (value_and_grad), batch {batch} x {seq}",
             f"small preset sampler greedy decode, {batch} requests x {new_tokens} new tokens"]
    if dry:
        return [row("model", n, NO_GPU, unit="tokens/s") for n in names]
    from c2jax.model import init, preset
    from c2jax.model.transformer import apply
    from c2jax.sampling import Engine, EngineConfig, Request, SamplingParams

    rows = []
    cfg = preset("small")
    params = init(cfg, jax.random.key(0))
    tok = jax.random.randint(jax.random.key(1), (batch, seq), 0, cfg.vocab_size)

    def loss(p, t):
        logits = apply(p, t, cfg)["logits"][:, :-1]
        nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, t[:, 1:, None], -1)[..., 0]
        return jnp.mean(nll)

    try:
        sec = timer(jax.jit(jax.value_and_grad(loss)), params, tok)
        rows.append(row("model", names[0], "measured", round(batch * seq / sec, 1), "tokens/s",
                        f"{1e3 * sec:.2f} ms/step; moe.impl={cfg.moe.impl}"))
    except Exception as e:  # noqa: BLE001
        rows.append(row("model", names[0], f"error: {type(e).__name__}: {str(e)[:200]}"))
    try:
        eng = Engine(params, cfg, EngineConfig(max_slots=batch, max_len=16 + new_tokens + 16))
        prompts = np.asarray(jax.random.randint(jax.random.key(2), (batch, 16), 0, cfg.vocab_size))
        reqs = lambda: [Request(list(map(int, p)), SamplingParams(temperature=0.0, max_new_tokens=new_tokens))  # noqa: E731
                        for p in prompts]
        eng.generate(reqs())  # compile
        t0 = time.perf_counter()
        res = eng.generate(reqs())
        sec = time.perf_counter() - t0
        n = sum(len(r.output_tokens) for r in res)
        rows.append(row("model", names[1], "measured", round(n / sec, 1), "tokens/s", f"{n} tokens in {sec:.2f} s"))
    except Exception as e:  # noqa: BLE001
        rows.append(row("model", names[1], f"error: {type(e).__name__}: {str(e)[:200]}"))
    return rows


# ------------------------------------------------------------------ report
def write_report(out: str, facts: dict, rows: list, meta: dict) -> tuple[str, str]:
    os.makedirs(out, exist_ok=True)
    jpath, mpath = os.path.join(out, "gpu_kit.json"), os.path.join(out, "gpu_kit.md")
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "device": facts, "rows": rows}, f, indent=2, default=str)
    lines = [f"# GPU kit report ({'dry run' if meta['dry_run'] else 'GPU run'})", "",
             f"Command: `{meta['command']}`  ", f"Wall time: {meta['wall_s']:.1f} s", "", "## Device", ""]
    lines += [f"* {k}: {v}" for k, v in facts.items()]
    for section in ("lowering", "correctness", "aims", "gmm", "quant", "model"):
        sec_rows = [r for r in rows if r["section"] == section]
        if not sec_rows:
            continue
        lines += ["", f"## {section}", "", "| check | status | value | unit | detail |", "|---|---|---|---|---|"]
        for r in sec_rows:
            cells = [r["name"], r["status"], "" if r["value"] is None else r["value"], r["unit"], r["detail"]]
            lines.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |")
    with open(mpath, "w") as f:
        f.write("\n".join(lines) + "\n")
    return jpath, mpath


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU part only (interpret mode); GPU rows 'not run'")
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_kit", help="report directory")
    ap.add_argument("--record", default=None, help="validation record path (default: gpu_validation.record_path())")
    ap.add_argument("--tokens", default="512,2048,8192", help="tokens per expert for the gmm table")
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--skip-model", action="store_true", help="skip the small-model train/decode rows")
    ap.add_argument("--simulate-on-cpu", action="store_true",
                    help="plumbing smoke test: run the GPU sections' code on CPU in interpret mode at toy shapes "
                         "(numbers meaningless; nothing is recorded)")
    args = ap.parse_args(argv)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        ap.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if not args.tokens or min(args.tokens) < 1:
        ap.error("--tokens needs at least one positive count")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    on_gpu = jax.devices()[0].platform == "gpu" and not args.dry_run
    dry = not on_gpu
    if args.simulate_on_cpu:
        global KIMI, SWEEP_TOKENS, QUANT_SHAPE, INTERPRET
        KIMI, SWEEP_TOKENS, QUANT_SHAPE, INTERPRET = {"experts_per_device": 2, "hidden": 256, "moe_ff": 128}, 64, (64, 256), True
        for kind in SWEEP:
            SWEEP[kind] = [triton_gmm.TileConfig(32, 128 if kind == "fp8bw" else 32, 32, 4, 2)]
        dry = False
    facts = device_facts(on_gpu)
    print(f"[gpu_kit] device {facts['device_kind']} ({facts['platform']}), jax {facts['jax']}; "
          f"{'GPU run' if on_gpu else 'CPU simulation of the GPU sections' if args.simulate_on_cpu else 'dry run (CPU part only)'}", flush=True)
    rows, results = ([], {}) if args.simulate_on_cpu else checks.run_checks(on_gpu)
    if dry:
        rows += [row("correctness", f"gmm_{p} fwd+dgrad+wgrad [triton, compiled]", NO_GPU) for p in api.PRECISIONS]
        rows += [row("correctness", f"gmm_{p} [pallas: hopper.py]", NO_GPU) for p in ("fp8_blockwise", "mxfp8")]
        rows += [row("correctness", f"quant_{f} [triton, compiled]", NO_GPU) for f in triton_quant.FORMATS]
        rows.append(row("correctness", "nvfp4_per_token batch invariance [triton, compiled]", NO_GPU))
    print(f"[gpu_kit] checks done ({time.perf_counter() - t0:.0f} s)", flush=True)
    timer = Timer(dry, args.repeats)
    kind = facts["device_kind"]
    meta = {"dry_run": dry, "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
            "complete": False, "validation_record": None, "validated": []}

    def save():  # after every section, so a run cut short by the time limit still reports
        meta["wall_s"] = time.perf_counter() - t0
        return write_report(args.out, facts, rows, meta)

    record = None
    if on_gpu and results and not args.simulate_on_cpu:  # the record first: it only depends on the correctness checks
        record = str(gpu_validation.write(results, kind, args.record))
        os.makedirs(args.out, exist_ok=True)
        shutil.copy(record, os.path.join(args.out, "kernel_validation.json"))
        meta.update(validation_record=record, validated=sorted(k for k, v in results.items() if v["passed"]))
    save()
    cfgs, sweep_rows = sweep_tiles(timer, dry)
    rows += sweep_rows
    rows += bench_gmm(timer, kind, args.tokens, cfgs, dry)
    save()
    rows += bench_quant(timer, kind, dry)
    save()
    rows += [] if args.skip_model else bench_model(timer, dry)
    meta["complete"] = True
    jpath, mpath = save()
    bad = [r for r in rows if r["status"] == "fail" or r["status"].startswith("error")]
    for r in rows:
        print(f"  [{r['section']}] {r['name']}: {r['status']}" + (f" {r['value']} {r['unit']}" if r["value"] is not None else ""))
    print(f"[gpu_kit] wrote {jpath} and {mpath}; {len(bad)} failed/error rows; "
          f"record: {record or 'none (dry run)'}", flush=True)
    return 1 if any(r["section"] in ("lowering", "correctness") for r in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
