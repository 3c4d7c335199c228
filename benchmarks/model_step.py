"""Forward+backward step of the `small` MoE model: c2jax (JAX) against transformers' DeepseekV3
(PyTorch), measured fairly.

    python benchmarks/model_step.py                          # batch 8 x 512, 5 repeats, all rows
    python benchmarks/model_step.py --batch 2 --seq 256 --repeats 5 --rows jax-dropless,torch
    python benchmarks/model_step.py --profile --modes none   # parity gate + where the JAX time goes

Fairness, by construction:
* Same weights, same tokens: the `small` preset (mtp_depth 0) is initialised once, written with
  `c2jax.model.hf.io.save_pretrained` (float32) and read back by both sides: `hf_io.from_pretrained`
  for JAX, `DeepseekV3ForCausalLM.from_pretrained` for PyTorch, with transformers' defaults
  (SDPA attention, its default experts implementation; both printed).
* Parity gate before any timing: the next-token cross-entropy and the gradient norm of every row
  that computes the same thing must agree with PyTorch eager (loss to --loss-rtol, default 1e-6
  relative; grad norm to 1e-4); the benchmark stops otherwise. Workers re-check their own loss.
* `torch-compile` (the model under `torch.compile`, inductor) is first compiled in a subprocess
  bounded by --compile-timeout (default 900 s) and gated like the other rows; when it does not
  compile in time or fails, its row still prints, as ``not compiled: REASON``, in every table.
  The probe fills an inductor cache private to the run, so the timed compiles reuse it.
* Rows compute the same thing only where labelled so: `jax-dropless` and `torch` /
  `torch-compile` are dropless MoE; `jax-capacity` drops tokens over a fixed capacity
  (capacity_factor 1.25) and is labelled with its dropped fraction, never compared as "same".
* PyTorch's OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, set before torch is
  imported; ``--omp-default`` keeps the busy-wait) so they do not spin against XLA's threads.
* Two timing modes: ``alone`` runs every row in its own subprocess, one after another (nothing
  else of ours in the process), and ``interleaved`` alternates the rows step by step in one
  process (a noisy neighbour then hits all rows alike). Each reports the median of --repeats
  (at least 5) timed steps after --warmup untimed ones, with min/max and IQR.
* What is timed: one jitted `value_and_grad` of the mean next-token cross-entropy (JAX) against
  `zero_grad(); model(input_ids, labels=input_ids).loss.backward()` (PyTorch); no optimizer update
  on either side.

MFU = `perf.train_step_flops` / median step seconds / matmul peak (benchmarks/perf.py: matmul
FLOPs only, the causal attention blocks c2jax executes counted, useful expert rows only; for the
capacity row the kept assignments). The peak is the best f32 2048^3 `jnp.dot` measured in this
run. Every row of one computation has the same numerator, so MFU ratios are speed ratios.

``--profile`` traces each jax-dropless row's step (variants too) with `jax.profiler` and prints where its time goes
(benchmarks/xla_profile.py): the share of executed HLO time per model component (attention
projections, attention scores+softmax, MoE routed / shared experts, router, norms, embed+LM
head, loss, XLA-inserted copies) x kind of work (matmul, elementwise, data movement, reduce),
each component's matmul GFLOP/s against the measured peak, and the top instructions, beside the
FLOPs per model component. All figures are printed by this script; wall-clock figures from a shared
(contended) machine must be re-measured on an idle one before they are quoted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if "--omp-default" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede the torch import

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import numpy as np  # noqa: E402

import perf  # noqa: E402

ROWS = {  # name -> (side, description, computes the same as torch eager)
    "jax-dropless": ("jax", "c2jax, dropless MoE (sort + tiled/ragged grouped matmul)", True),
    "jax-capacity": ("jax", "c2jax, capacity MoE cf 1.25: DROPS TOKENS, not the same computation", False),
    "torch": ("torch", "transformers eager (defaults: sdpa, default experts impl)", True),
    "torch-compile": ("torch", "transformers + torch.compile (inductor)", True),
}
# Same-process A/B of model code paths: row "jax-dropless@NAME" traces the step with the module
# attribute set to the value (restored after compiling). Each is the same computation.
VARIANTS = {
    "gather-autodiff": ("c2jax.model.moe_impls", "TILED_CUSTOM_VJP", False),  # before the tile custom VJP
    "ragged": ("c2jax.model.moe_impls", "DROPLESS_LOWERING", "ragged"),  # jax.lax.ragged_dot lowering
    # Issue 15 profile A/B (same result; compare step times: MFU's numerator stays the default
    # count, while these execute more padding rows / masked attention pairs than it counts).
    # `python benchmarks/model_step.py --batch 2 --seq 512 --modes interleaved --rows
    # jax-dropless,jax-dropless@tile-256,jax-dropless@causal-block-256,torch` on a contended machine
    # (load ~13 on 2 cores): medians 13.8 s default, 14.6 s tile-256, 14.6 s causal-block-256 (mins
    # 2.0 / 3.7 / 5.9 s): neither faster, so neither is the default; re-measure on an idle machine.
    "tile-256": ("c2jax.model.moe_impls", "TILE_ROWS", 256),  # fewer, larger expert tiles
    "causal-block-256": ("c2jax.model.mla", "CAUSAL_BLOCK", 256),  # fewer, larger attention blocks
    # No causal block skipping (one masked [S, S] score block per head, what PyTorch's SDPA math path
    # does), and smaller blocks (64: 9/16 of the square instead of 128's 5/8). `--rows
    # jax-dropless,jax-dropless@causal-block-off,torch --modes interleaved --repeats 5` on an idle AMD EPYC
    # family 25 model 1 (2026-12-06): 2.673 s against the default's 2.190 s (torch 1.995 s); with
    # @causal-block-64 instead: 2.336 s against 2.279 s (torch 2.044 s). Blocks of 128 stay the default.
    "causal-block-off": ("c2jax.model.mla", "CAUSAL_BLOCK", 1 << 30),
    "causal-block-64": ("c2jax.model.mla", "CAUSAL_BLOCK", 64),
    # `--rows jax-dropless,jax-dropless@unroll,jax-dropless@split-rope --modes interleaved --repeats 7`
    # on an idle machine (2026-12-05; batch 8 x 512): medians 1.863 s default, 1.826 s unroll (-2%, inside
    # the default's IQR 1.831-1.934), 1.909 s split-rope (+2.5%): neither is the default.
    "unroll": ("c2jax.model.transformer", "SCAN_UNROLL", True),  # layer loops as straight-line code
    "split-rope": ("c2jax.model.mla", "SPLIT_ROPE_SCORES", True),  # no per-head copy of the rotary key
    # attention's scores/softmax for 1 or 2 batch rows at a time (lax.map): a cache-sized working set.
    # `--rows jax-dropless,jax-dropless@batch-chunk-1,jax-dropless@batch-chunk-2,torch --modes interleaved
    # --repeats 7` on an idle machine (2026-12-06): medians 2.140 s default, 2.247 s chunk-1, 2.157 s
    # chunk-2 (torch 1.914 s): not faster, so not the default.
    "batch-chunk-1": ("c2jax.model.mla", "ATTN_BATCH_CHUNK", 1),
    "batch-chunk-2": ("c2jax.model.mla", "ATTN_BATCH_CHUNK", 2),
    # the routed experts' tiles as one batched matmul over per-tile gathered weights (the default
    # before 2026-12-06) instead of a scan over tiles (moe_impls.TILE_LOOP, c2jax/model/moe_tile_scan.py).
    # `--rows jax-dropless,jax-dropless@tile-batched,jax-dropless@unroll,torch --modes interleaved --repeats 7`
    # on an idle machine (2026-12-06): medians 1.856 s scan (default), 2.058 s tile-batched, 1.849 s unroll,
    # torch eager 1.866 s: the scan is the default.
    "tile-batched": ("c2jax.model.moe_impls", "TILE_LOOP", "batched"),
    # attention's backward by autodiff, keeping every causal block's probabilities (the default before
    # 2026-12-07) instead of recomputing the transposed probabilities from saved row statistics
    # (mla.ATTN_BACKWARD = "recompute", c2jax/model/attention_recompute.py). `--rows jax-dropless,
    # jax-dropless@attn-recompute,torch --modes alone,interleaved --repeats 5` while it was a variant
    # (2026-12-07, idle AMD EPYC family 25 model 1): interleaved 2.433 s autodiff, 1.800 s recompute,
    # torch 1.847 s; alone 2.130 s, 1.935 s, torch 2.286 s: recompute is the default.
    "attn-autodiff": ("c2jax.model.mla", "ATTN_BACKWARD", "autodiff"),
    # attention's heads in N independent calls (XLA:CPU runs one batched attention product on one
    # thread but overlaps independent chains), and the layer loops as Python code; rows may combine
    # them, "@head-groups-4+python-loops". `--rows jax-dropless,jax-dropless@head-groups-4+python-loops,
    # torch,torch-compile --modes alone --repeats 7` on an idle AMD EPYC family 25 model 17 (2026-12-07):
    # 1.617 s against the default's 1.757 s, torch eager 1.622 s, compiled 1.446 s. Not the default
    # (README, "Correction ...: those products run on one core").
    "head-groups-2": ("c2jax.model.mla", "ATTN_HEAD_GROUPS", 2),
    "head-groups-4": ("c2jax.model.mla", "ATTN_HEAD_GROUPS", 4),
    "head-groups-8": ("c2jax.model.mla", "ATTN_HEAD_GROUPS", 8),
    "python-loops": ("c2jax.model.transformer", "SCAN_UNROLL", "python"),  # layer loops as Python code
}


def row_spec(row: str) -> tuple:
    """(side, description, same computation as torch eager) of a row name, variants included."""
    base, _, variant = row.partition("@")
    names = variant.split("+") if variant else []
    if base not in ROWS or (names and (not base.startswith("jax") or any(n not in VARIANTS for n in names))):
        raise KeyError(row)
    side, desc, same = ROWS[base]
    sets = ", ".join(f"{VARIANTS[n][1]}={VARIANTS[n][2]!r}" for n in names)
    return side, desc + (f" [variant {variant}: {sets}]" if variant else ""), same


GRAD_RTOL = 1e-4


# ---- steppers: one object per row, .step() -> loss, .grad_norm() after a step ----------------------

class JaxStep:
    def __init__(self, ckpt: str, impl: str, tokens: np.ndarray, variant: str = ""):
        import importlib

        import jax
        import jax.numpy as jnp

        from c2jax.model.hf.io import from_pretrained
        from c2jax.model.transformer import apply

        params, cfg = from_pretrained(ckpt, load_mtp=False, **{"moe.impl": impl})
        self.cfg = cfg
        self.params = jax.tree.map(jnp.asarray, params)
        self.tokens = jnp.asarray(tokens, jnp.int32)

        def loss(p, tok):
            out = apply(p, tok, cfg)
            logits, tgt = out["logits"][:, :-1], tok[:, 1:]  # [B, S-1, V], [B, S-1]
            nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0]
            return jnp.mean(nll), jnp.mean(out["dropped_fraction"])
        lowered = jax.jit(jax.value_and_grad(loss, has_aux=True))
        saved = []  # (module, attribute, value before) of each switch this row sets; "a+b" sets both
        try:
            for name in variant.split("+") if variant else []:
                mod, attr, value = VARIANTS[name]
                mod = importlib.import_module(mod)
                saved.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value)
            self.fn = lowered.lower(self.params, self.tokens).compile()
        finally:
            for mod, attr, value in reversed(saved):
                setattr(mod, attr, value)
        self.grads = None
        self.dropped = 0.0

    def step(self) -> float:
        import jax

        (loss, dropped), self.grads = jax.block_until_ready(self.fn(self.params, self.tokens))
        self.dropped = float(dropped)
        return float(loss)

    def grad_norm(self) -> float:
        import jax

        return float(np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in jax.tree.leaves(self.grads))))

    def info(self) -> dict:
        return {"dropped_fraction": self.dropped}


class TorchStep:
    def __init__(self, ckpt: str, tokens: np.ndarray, compile_model: bool):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        self.model = transformers.DeepseekV3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).train()
        self.run = torch.compile(self.model) if compile_model else self.model
        self.ids = torch.as_tensor(np.asarray(tokens, np.int64))

    def step(self) -> float:
        self.model.zero_grad(set_to_none=True)
        out = self.run(input_ids=self.ids, labels=self.ids)
        out.loss.backward()
        return float(out.loss.detach())

    def grad_norm(self) -> float:
        return float(np.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in self.model.parameters()
                                 if p.grad is not None)))

    def info(self) -> dict:
        import torch

        c = self.model.config
        return {"attn_implementation": c._attn_implementation, "experts_implementation":
                getattr(c, "_experts_implementation", None), "torch": torch.__version__,
                "threads": torch.get_num_threads(), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")}


def make_step(row: str, ckpt: str, tokens: np.ndarray):
    base, _, variant = row.partition("@")
    if base == "jax-dropless":
        return JaxStep(ckpt, "dropless", tokens, variant)
    if base == "jax-capacity":
        return JaxStep(ckpt, "capacity", tokens, variant)
    return TorchStep(ckpt, tokens, compile_model=(base == "torch-compile"))


# ---- setup, parity gate, timing modes -----------------------------------------------------------

def write_inputs(d: str, batch: int, seq: int) -> None:
    """The shared weights (HF directory) and tokens every row and worker reads."""
    import jax

    from c2jax.model import init, preset
    from c2jax.model.hf.io import save_pretrained

    cfg = preset("small").replace(mtp_depth=0, **{"moe.impl": "dropless"})
    if seq > cfg.max_position_embeddings:
        raise SystemExit(f"--seq {seq} exceeds max_position_embeddings {cfg.max_position_embeddings}")
    params = jax.tree.map(np.asarray, init(cfg, jax.random.key(0)))
    save_pretrained(params, cfg, os.path.join(d, "ckpt"), dtype="float32", layout="fused")
    np.save(os.path.join(d, "tokens.npy"), np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq)))


def check_parity(rows: list[str], steps: dict, loss_rtol: float) -> dict:
    """Loss and grad norm of every row (`rows` includes 'torch') after one step; raises SystemExit
    when a same-computation row disagrees with torch eager. Returns {row: (loss, grad_norm)}."""
    got = {}
    for r in rows:
        loss = steps[r].step()
        got[r] = (loss, steps[r].grad_norm())
    ref_loss, ref_gn = got["torch"]
    bad = []
    for r, (loss, gn) in got.items():
        dl, dg = abs(loss - ref_loss) / abs(ref_loss), abs(gn - ref_gn) / ref_gn
        same = row_spec(r)[2]
        print(f"parity {r:28s} loss {loss:.7f} (rel diff {dl:.1e})  grad norm {gn:.6f} (rel diff {dg:.1e})"
              f"{'' if same else '  [different computation: not gated]'}")
        if same and (dl > loss_rtol or dg > GRAD_RTOL):
            bad.append(r)
    if bad:
        raise SystemExit(f"parity gate FAILED for {bad}: losses/grads differ from torch eager beyond "
                         f"loss rtol {loss_rtol:g} / grad rtol {GRAD_RTOL:g}; nothing was timed")
    return got


def run_worker(row: str, d: str, repeats: int, warmup: int, probe: bool = False) -> dict:
    """Body of `--worker ROW`: this row alone in this process. With `probe`, only build and run the
    first (compiling) step and report its loss, grad norm and seconds."""
    tokens = np.load(os.path.join(d, "tokens.npy"))
    t0 = time.perf_counter()
    st = make_step(row, os.path.join(d, "ckpt"), tokens)
    loss = st.step()  # compile / first step
    first_s = time.perf_counter() - t0
    if probe:
        return {"row": row, "loss": loss, "grad_norm": st.grad_norm(), "first_step_s": first_s}
    stats = perf.time_repeats(st.step, repeats=repeats, warmup=max(0, warmup - 1))
    return {"row": row, "loss": loss, "grad_norm": st.grad_norm(), "first_step_s": first_s,
            "times": list(stats.samples), "info": st.info()}


def _worker_cmd(row: str, d: str, args, probe: bool = False) -> list[str]:
    return ([sys.executable, os.path.abspath(__file__), "--worker", row, "--dir", d, "--repeats", str(args.repeats),
             "--warmup", str(args.warmup)] + (["--omp-default"] if args.omp_default else [])
            + (["--probe"] if probe else []))


def _last_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (p.stderr or p.stdout or "").strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else f"exit code {p.returncode}"


def probe_compile(d: str, args, ref: tuple[float, float]) -> dict:
    """Compile the torch-compile row in a subprocess bounded by --compile-timeout and gate its loss
    and grad norm against torch eager `ref` = (loss, grad norm). Returns {'first_step_s': ...} when
    it compiled and agrees, else {'error': 'not compiled: REASON'}. The inductor cache (in `d`)
    it fills makes the timed modes' compiles quick."""
    try:
        p = subprocess.run(_worker_cmd("torch-compile", d, args, probe=True), capture_output=True, text=True,
                           timeout=args.compile_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"not compiled: compile + first step exceeded --compile-timeout {args.compile_timeout:.0f} s"}
    res = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not res:
        return {"error": f"not compiled: {_last_line(p)}"}
    v = json.loads(res[-1][len("RESULT "):])
    dl, dg = abs(v["loss"] - ref[0]) / abs(ref[0]), abs(v["grad_norm"] - ref[1]) / ref[1]
    print(f"parity {'torch-compile':28s} loss {v['loss']:.7f} (rel diff {dl:.1e})  grad norm {v['grad_norm']:.6f} "
          f"(rel diff {dg:.1e})  [compile + first step {v['first_step_s']:.0f} s, subprocess]")
    if dl > args.loss_rtol or dg > GRAD_RTOL:
        raise SystemExit(f"parity gate FAILED for ['torch-compile']: loss/grad norm differ from torch eager beyond "
                         f"loss rtol {args.loss_rtol:g} / grad rtol {GRAD_RTOL:g}; nothing was timed")
    return {"first_step_s": v["first_step_s"]}


def compile_in_process(d: str, timeout_s: float):
    """The torch-compile row's stepper, compiled (first step run) in this process within
    `timeout_s` seconds (SIGALRM); raises TimeoutError past it."""
    import signal

    def _alarm(signum, frame):
        raise TimeoutError(f"in-process compile exceeded {timeout_s:.0f} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(timeout_s)))
    try:
        st = make_step("torch-compile", os.path.join(d, "ckpt"), np.load(os.path.join(d, "tokens.npy")))
        loss = st.step()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return st, loss


def time_alone(rows: list[str], d: str, args) -> dict:
    """Each row in its own subprocess, one after another. {row: result dict or {'error': ...}}."""
    out = {}
    for r in rows:
        if r in args.not_compiled:
            out[r] = args.not_compiled[r]
            continue
        try:
            p = subprocess.run(_worker_cmd(r, d, args), capture_output=True, text=True, timeout=args.worker_timeout)
        except subprocess.TimeoutExpired:
            out[r] = {"error": f"worker timed out after {args.worker_timeout:.0f} s"}
            continue
        res = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not res:
            out[r] = {"error": ("not compiled: " if r == "torch-compile" else "") + _last_line(p)}
        else:
            out[r] = json.loads(res[-1][len("RESULT "):])
        print(f"  alone: {r} done", flush=True)
    return out


def time_interleaved(rows: list[str], steps: dict, repeats: int, warmup: int) -> dict:
    for _ in range(warmup):
        for r in rows:
            steps[r].step()
    times = {r: [] for r in rows}
    for _ in range(repeats):
        for r in rows:
            t = time.perf_counter()
            steps[r].step()
            times[r].append(time.perf_counter() - t)
    return {r: {"times": times[r], "info": steps[r].info()} for r in rows}


def report(mode: str, results: dict, cfg, batch: int, seq: int, peak: float) -> None:
    n_tok = batch * seq
    ok = {r: v for r, v in results.items() if "times" in v}
    base = perf.Stats(tuple(ok["torch"]["times"])).median if "torch" in ok else None
    print(f"\n== {mode}: step seconds (median [min, max; IQR] of n), tokens/s, MFU, torch eager / row ==")
    for r, v in results.items():
        if "times" not in v:
            err = str(v.get("error"))
            print(f"{r:28s} {err if err.startswith('not compiled') else 'FAILED: ' + err}")
            continue
        st = perf.Stats(tuple(v["times"]))
        dropped = v.get("info", {}).get("dropped_fraction", 0.0)
        rows_kept = batch * seq * cfg.moe.top_k * (1.0 - dropped)
        flops = perf.train_step_flops(cfg, batch, seq, expert_rows=rows_kept)
        ratio = f"{base / st.median:5.2f}x" if base else "  -  "
        label = "" if row_spec(r)[2] else f"  [drops {dropped:.1%} of assignments: not the same computation]"
        print(f"{r:28s} {st.spread()}  {n_tok / st.median:8.0f} tok/s  MFU {perf.mfu(flops, st.median, peak):6.1%}"
              f"  {ratio}{label}")


def print_profile(step: JaxStep, batch: int, seq: int, peak: float, row: str = "jax-dropless") -> None:
    """Where a jax-dropless row's fwd+bwd time goes (benchmarks/xla_profile.py): by model component x
    kind of work with shares, each component's matmul GFLOP/s against the peak, top instructions."""
    from xla_profile import print_step_profile, profile_compiled

    f = perf.forward_flops(step.cfg, batch, seq)
    print(f"\n== profile: {row} fwd+bwd (jax.profiler trace, executed HLO thunks) ==")
    print("model FLOPs per component (x3 for fwd+bwd): " + ", ".join(
        f"{k} {v / f['total']:.1%}" for k, v in f.items() if k != "total" and v))
    prof = profile_compiled(step.fn, (step.params, step.tokens), calls=3)
    print_step_profile(prof, f, peak)
    print("by kind of work: " + ", ".join(f"{kind} {share:.1%}" for share, _, kind in prof["by_kind"]))
    print("top instructions:")
    for share, ms, name, kind, shape, op in prof["top"][:15]:
        print(f"  {share:6.1%} {ms:8.1f} ms  {name:22s} {kind:14s} {shape[:40]:40s} {op[-60:]}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rows", default="jax-dropless,jax-capacity,torch,torch-compile",
                    help=f"comma list of {list(ROWS)}; a jax row may add @VARIANT ({list(VARIANTS)}), or "
                         "@VARIANT+VARIANT for several at once, for a same-process A/B of a model code path")
    ap.add_argument("--modes", default="alone,interleaved", help="comma list of alone, interleaved (or none)")
    ap.add_argument("--profile", action="store_true", help="trace each jax-dropless row's step (variants included) and print where time goes")
    ap.add_argument("--loss-rtol", type=float, default=1e-6)
    ap.add_argument("--omp-default", action="store_true", help="keep PyTorch's default (busy-wait) OpenMP policy")
    ap.add_argument("--worker-timeout", type=float, default=1800.0)
    ap.add_argument("--compile-timeout", type=float, default=900.0,
                    help="seconds torch.compile's first step may take (subprocess probe, then in-process)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = []
    for r in rows:
        try:
            row_spec(r)
        except KeyError:
            unknown.append(r)
    modes = [m for m in args.modes.split(",") if m and m != "none"]
    if unknown:
        ap.error(f"--rows: unknown {unknown}; choose from {list(ROWS)}, jax rows may add @VARIANT "
                 f"with VARIANT in {list(VARIANTS)}")
    if any(m not in ("alone", "interleaved") for m in modes):
        ap.error(f"--modes must list alone and/or interleaved (or none), got {args.modes!r}")
    if args.batch < 1 or args.seq < 2:
        ap.error(f"--batch must be >= 1 and --seq >= 2, got {args.batch}, {args.seq}")
    if args.repeats < perf.MIN_REPEATS:
        ap.error(f"--repeats must be >= {perf.MIN_REPEATS} (a median needs a spread), got {args.repeats}")
    if args.compile_timeout <= 0 or args.worker_timeout <= 0:
        ap.error("--compile-timeout and --worker-timeout must be > 0")
    if args.warmup < 1:
        ap.error(f"--warmup must be >= 1 (the first step compiles), got {args.warmup}")
    args.row_list, args.mode_list = rows, modes
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows up when piped to a file
    if args.worker:
        print("RESULT " + json.dumps(run_worker(args.worker, args.dir, args.repeats, args.warmup, args.probe)),
              flush=True)
        return 0
    import jax

    with tempfile.TemporaryDirectory(prefix="model_step_") as d:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(d, "inductor")  # this run's workers share it
        write_inputs(d, args.batch, args.seq)
        gate_rows = list(dict.fromkeys(["torch"] + [r for r in args.row_list if r != "torch-compile"]))
        steps = {r: make_step(r, os.path.join(d, "ckpt"), np.load(os.path.join(d, "tokens.npy"))) for r in gate_rows}
        cfg = next((s.cfg for s in steps.values() if isinstance(s, JaxStep)), None)
        if cfg is None:
            from c2jax.model.hf.io import from_pretrained
            cfg = from_pretrained(os.path.join(d, "ckpt"), load_mtp=False)[1]
        print(f"small preset (mtp off), batch {args.batch} x {args.seq}; jax {jax.__version__} on "
              f"{jax.devices()[0].device_kind}; torch {steps['torch'].info()}")
        ref = check_parity(gate_rows, steps, args.loss_rtol)["torch"]
        ref_loss = ref[0]
        args.not_compiled = {}
        if "torch-compile" in args.row_list:
            probe = probe_compile(d, args, ref)
            if "error" in probe:
                args.not_compiled["torch-compile"] = probe
                print(f"torch-compile: {probe['error']}")
        peak = perf.matmul_peak_gflops()
        for row in [r for r in args.row_list if args.profile and r.startswith("jax-dropless") and r in steps]:
            print_profile(steps[row], args.batch, args.seq, peak, row)
        fl = perf.train_step_flops(cfg, args.batch, args.seq)
        print(f"\nmatmul peak (best f32 2048^3 jnp.dot, this run, on {perf.cores()} cores): {peak:.1f} GFLOP/s; dropless step "
              f"{fl / 1e9:.2f} GFLOP (perf.train_step_flops)")
        if "interleaved" in args.mode_list:
            inter_rows = [r for r in args.row_list if r in steps]
            failed = {}
            if "torch-compile" in args.not_compiled:
                failed["torch-compile"] = args.not_compiled["torch-compile"]
            elif "torch-compile" in args.row_list:
                try:  # the probe compiled it within the bound; the inductor cache makes this quick
                    steps["torch-compile"], loss = compile_in_process(d, args.compile_timeout)
                except Exception as e:  # noqa: BLE001 - any compile failure is reported, not fatal
                    failed["torch-compile"] = {"error": f"not compiled: {type(e).__name__}: {str(e)[:200]}"}
                else:
                    gn = steps["torch-compile"].grad_norm()
                    if abs(loss - ref_loss) > args.loss_rtol * abs(ref_loss) or abs(gn - ref[1]) > GRAD_RTOL * ref[1]:
                        raise SystemExit(f"parity gate FAILED for torch-compile: loss {loss}, grad norm {gn} vs "
                                         f"torch {ref_loss}, {ref[1]}")
                    inter_rows.append("torch-compile")
            res = {**time_interleaved(inter_rows, steps, args.repeats, args.warmup), **failed}
            report("interleaved (one process)", res, cfg, args.batch, args.seq, peak)
        steps.clear()
        jax.clear_caches()
        if "alone" in args.mode_list:
            res = time_alone(args.row_list, d, args)
            for r, v in res.items():  # each worker's own loss against the gate's torch eager loss
                if "loss" in v and row_spec(r)[2] and abs(v["loss"] - ref_loss) > args.loss_rtol * abs(ref_loss):
                    v["error"] = f"parity: loss {v['loss']} disagrees with torch eager {ref_loss}"
                    v.pop("times")
            report("alone (one subprocess per row)", res, cfg, args.batch, args.seq, peak)
    print("\n(wall-clock figures: re-measure on an idle machine before quoting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
