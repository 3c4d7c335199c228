"""Weight deltas on the real RL stage: bit-identical bf16 share and delta size per step, Adam vs Muon
at two learning rates, and the step time with delta publishing on vs off.

    python benchmarks/weight_deltas_rl.py                      # 4 study cells x 4 steps + the A/B (6 steps per arm)
    python benchmarks/weight_deltas_rl.py --optimizers adamw --lrs 3e-4 --steps 2 --ab-steps 0

Each cell is one ordinary run of the RL stage of ``experiments/configs/rl_quickstart.py``
(`experiments/run.py` in a subprocess, its own workdir under ``--workdir``): the build stages (CPT,
agent SFT) come from the shared build cache (built on first use, ~13 min on 2 cores), the RL stage
then runs ``--steps`` optimizer steps on real rollouts (harness, engine, sandboxes, grader) with the
held-out evaluation off. What the benchmark reads is the stage's own ``rl/train.jsonl``.

1. Study: ``--config.rl.weight_sync.mode=delta`` with ``wire_dtype=bfloat16`` (the engine receives
   bf16 weights; the learner keeps f32 masters) and ``full_every`` larger than the run, so every
   publish after the first is an XOR delta against the previous version. Per cell: the median over
   steps of ``weight_sync/identical_share/bfloat16`` (elements whose bf16 bits did not change) and
   ``weight_sync/stored_over_raw`` (zstd delta bytes / raw bf16 snapshot bytes), for
   ``rl.optimizer.name`` in ``--optimizers`` and ``rl.learning_rate`` in ``--lrs``.
   Reference (Fireworks, quoted in the Composer 2 report): > 98% bit-identical, delta ~2% of a snapshot.
2. A/B, publish off vs on: the same run (same seed, same tasks) with ``weight_sync.mode=direct`` (the
   arrays handed to the engine in memory) and with ``mode=delta`` at the learner's own f32 wire dtype.
   The engine then samples from bit-identical weights in both arms, so rollouts are the same (checked:
   the per-step rewards and sampled token counts must agree, else the A/B is reported invalid) and
   the step times differ only by publishing: compression, the store write and the engine-side
   rebuild and hash check (the next step waits for the rebuild, so all of it lands in step time).
   Printed: median step time per arm over the steps after the first (the first compiles), the ratio,
   and whether it is within the 10% budget. The machine's load average is printed with it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join("experiments", "configs", "rl_quickstart.py")  # default preset; --config for another


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=CONFIG, help="config[:preset] whose RL stage runs (':smoke' for a quick check)")
    ap.add_argument("--optimizers", default="adamw,muon")
    ap.add_argument("--lrs", default="1e-4,3e-4", help="rl.learning_rate values (the quickstart's default is 3e-4)")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per study cell")
    ap.add_argument("--ab-steps", type=int, default=6, help="RL steps per A/B arm (0 = skip the A/B)")
    ap.add_argument("--workdir", default=os.path.join("runs", "bench", "weight_deltas_rl"))
    ap.add_argument("--extra", action="append", default=[],
                    help="extra --config.KEY=VALUE for every run, written --extra=--config.KEY=VALUE "
                         "(argparse reads a separate value starting with -- as an option)")
    ap.add_argument("--out", default=os.path.join("runs", "bench", "weight_deltas_rl.json"))
    args = ap.parse_args(argv)
    bad = [o for o in args.optimizers.split(",") if o not in ("adamw", "muon")]
    if bad:
        ap.error(f"--optimizers: unknown {bad}; known: adamw, muon")
    try:
        lrs = [float(x) for x in args.lrs.split(",")]
    except ValueError:
        ap.error(f"--lrs must be comma-separated numbers, got {args.lrs!r}")
    if any(not lr > 0 for lr in lrs):
        ap.error(f"--lrs must be positive, got {args.lrs!r}")
    if args.steps < 0 or args.ab_steps < 0 or args.ab_steps == 1:
        ap.error("--steps must be >= 0 and --ab-steps 0 or >= 2 (the first step of each arm compiles)")
    return args


def run_rl(config: str, workdir: str, overrides: list[str]) -> list[dict[str, Any]]:
    """Run the RL stage once (build stages from the cache); return its per-step metrics rows."""
    cmd = [sys.executable, os.path.join("experiments", "run.py"), "--config", config, "--workdir", workdir,
           "--config.rl.eval.enabled=False", *overrides]
    print("$", " ".join(cmd), flush=True)
    log = os.path.join(workdir + ".log")
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"run failed (exit {rc}); see {log}")
    with open(os.path.join(ROOT, workdir, "rl", "train.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "time/step_s" in r]


def med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def study(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for opt in args.optimizers.split(","):
        for lr in args.lrs.split(","):
            wd = os.path.join(args.workdir, f"{opt}_lr{lr}")
            rows = run_rl(args.config, wd, [f"--config.rl.optimizer.name={opt}", f"--config.rl.learning_rate={lr}",
                               f"--config.rl.steps={args.steps}", "--config.rl.weight_sync.mode=delta",
                               "--config.rl.weight_sync.wire_dtype=bfloat16",
                               f"--config.rl.weight_sync.full_every={args.steps + 10}", *args.extra])
            deltas = [r for r in rows if r.get("weight_sync/is_full") == 0.0]
            cell = dict(optimizer=opt, lr=float(lr), delta_steps=len(deltas),
                        identical_share_bf16=med(deltas, "weight_sync/identical_share/bfloat16"),
                        delta_over_raw=med(deltas, "weight_sync/stored_over_raw"),
                        identical_share_bf16_per_step=[r.get("weight_sync/identical_share/bfloat16") for r in deltas],
                        delta_over_raw_per_step=[r.get("weight_sync/stored_over_raw") for r in deltas],
                        kl_k1=med(rows, "kl/k1"))
            out.append(cell)
            print(f"{opt:6s} lr {lr:>6s}: bf16 bit-identical {100 * cell['identical_share_bf16']:.1f}%  "
                  f"delta {100 * cell['delta_over_raw']:.2f}% of the raw bf16 snapshot "
                  f"(median of {len(deltas)} delta publishes)", flush=True)
    return out


def ab(args: argparse.Namespace) -> dict[str, Any]:
    arms = {}
    for name, mode in (("off", "direct"), ("on", "delta")):
        wd = os.path.join(args.workdir, f"ab_{name}")
        arms[name] = run_rl(args.config, wd, [f"--config.rl.steps={args.ab_steps}", f"--config.rl.weight_sync.mode={mode}",
                                 *args.extra])
    same = all(a.get(k) == b.get(k) for a, b in zip(arms["off"], arms["on"])
               for k in ("reward/total", "tokens/policy")) and len(arms["off"]) == len(arms["on"])
    t = {n: [r["time/step_s"] for r in rows[1:]] for n, rows in arms.items()}
    res = dict(same_rollouts=same, step_s_off=statistics.median(t["off"]), step_s_on=statistics.median(t["on"]),
               step_s_off_all=t["off"], step_s_on_all=t["on"],
               publish_s_on=[r.get("time/publish_s") for r in arms["on"][1:]],
               weight_wait_s_on=[r.get("time/weight_wait_s") for r in arms["on"][1:]],
               loadavg=os.getloadavg())
    res["ratio"] = res["step_s_on"] / res["step_s_off"]
    verdict = "INVALID (rollouts differ)" if not same else ("within" if res["ratio"] <= 1.10 else "OVER")
    print(f"publish off/on: median step {res['step_s_off']:.2f} s / {res['step_s_on']:.2f} s over "
          f"{len(t['on'])} steps each, ratio {res['ratio']:.3f} ({verdict} the 10% budget); "
          f"same rollouts in both arms: {same}; load average {res['loadavg'][0]:.2f}", flush=True)
    return res


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    t0 = time.time()
    result: dict[str, Any] = dict(args=vars(args), study=study(args) if args.steps > 0 else [])
    if args.ab_steps > 1:
        result["ab"] = ab(args)
    result["wall_s"] = time.time() - t0
    os.makedirs(os.path.dirname(os.path.join(ROOT, args.out)), exist_ok=True)
    with open(os.path.join(ROOT, args.out), "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
