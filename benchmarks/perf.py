"""One definition of every performance figure the benchmark scripts print: model FLOPs, matmul
peak, MFU and timing statistics. Every script under benchmarks/ that reports FLOP/s or MFU imports
it (``sys.path`` holds this folder when a script runs as ``python benchmarks/NAME.py``).

FLOPs (what is counted, and why)
--------------------------------
Only matrix products are counted, 2 FLOPs per multiply-add; elementwise work (norms, RoPE,
softmax, SiLU, the loss) is left out, as in every MFU convention, because it is small and not
what the matmul peak measures. Per sequence of S tokens (N = B x S tokens per step), forward:

* attention projections, every layer (D hidden, H heads, qk = nope + rope, r_q = q_lora_rank,
  r_kv = kv_lora_rank):
      q      2 N (D r_q + r_q H qk)      (2 N D H qk without a q LoRA)
      kv_a   2 N D (r_kv + rope)
      kv_b   2 N r_kv H (nope + v)       (keys/values expanded once per position)
      o      2 N H v D
* attention scores and values, every layer: 2 B P H qk (QK^T) + 2 B P H v (PV), where P is the
  number of (query, key) pairs the attention *executes*. `c2jax.model.mla` splits the queries into
  n = S / CAUSAL_BLOCK blocks (when S is a multiple of the block and S >= 2 blocks; else n = 1) and
  block i scores only keys up to its own end, so P = S^2 (n + 1) / (2n): the full square S^2 for
  n = 1, tending to the causal triangle S^2 / 2 for large n. Masked pairs inside the computed
  blocks are executed and therefore counted; the skipped blocks are not.
* dense MLP layers (first_k_dense_replace): 2 N 3 D I.
* MoE layers: router 2 N D E; shared experts 2 N n_shared 3 D F; routed experts
  2 R 3 D F with R the expert rows doing useful work: N top_k for a dropless implementation
  (tile padding is overhead, not model work), the kept assignments for a capacity (dropping)
  implementation (callers pass ``expert_rows``).
* LM head 2 N D V (the input embedding is a gather: 0 FLOPs).
* MTP (optional, depth d): per depth eh_proj 2 N 2D D + one MoE layer (as above) + the LM head.

A training step (forward + backward) executes each product three times (forward, input gradient,
weight gradient): train FLOPs = 3 x forward FLOPs. The tests check `forward_flops` against a hand
count for a tiny config and against the dot FLOPs XLA reports for the compiled step.

MFU = train FLOPs per step / step seconds / matmul peak FLOP/s. On CPU the peak is measured in
the same run (`matmul_peak_gflops`: best of a few jitted square f32 matmuls); on a GPU the
datasheet dense peak of the tensor-core format the arithmetic runs in (`datasheet_peak_tflops`).

Timing statistics
-----------------
`time_repeats` runs a callable after warm-up calls and `Stats` summarises the seconds: median
(the figure quoted), min/max and the interquartile range (the spread), and the repeat count.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import statistics
import time
from typing import Callable, Optional

import numpy as np

# ---- FLOPs ------------------------------------------------------------------------------------


def causal_blocks(seq: int, block: Optional[int] = None) -> int:
    """Number of query blocks the cache-free attention of `c2jax.model.mla` runs for length `seq`."""
    if block is None:
        from c2jax.model.mla import CAUSAL_BLOCK

        block = CAUSAL_BLOCK
    return seq // block if seq % block == 0 and seq >= 2 * block else 1


def attention_pairs(seq: int, block: Optional[int] = None) -> int:
    """(query, key) pairs one sequence's causal self-attention executes: S^2 (n + 1) / (2n)."""
    n = causal_blocks(seq, block)
    blk = seq // n
    return blk * blk * n * (n + 1) // 2


def _attention_layer(cfg, n_tok: int, n_seq: int, seq: int) -> dict[str, float]:
    a, d, h = cfg.attention, cfg.hidden_size, cfg.num_heads
    if a.q_lora_rank is None:
        q = 2 * n_tok * d * h * a.qk_head_dim
    else:
        q = 2 * n_tok * (d * a.q_lora_rank + a.q_lora_rank * h * a.qk_head_dim)
    proj = (q + 2 * n_tok * d * (a.kv_lora_rank + a.qk_rope_head_dim)
            + 2 * n_tok * a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
            + 2 * n_tok * h * a.v_head_dim * d)
    pairs = n_seq * attention_pairs(seq)
    return {"attn_proj": float(proj), "attn_scores": float(2 * pairs * h * (a.qk_head_dim + a.v_head_dim))}


def _moe_layer(cfg, n_tok: int, expert_rows: float) -> dict[str, float]:
    d, e = cfg.hidden_size, cfg.moe
    return {"router": float(2 * n_tok * d * e.n_routed_experts),
            "routed_experts": float(2 * expert_rows * 3 * d * e.intermediate_size),
            "shared_experts": float(2 * n_tok * e.n_shared_experts * 3 * d * e.intermediate_size)}


def forward_flops(cfg, batch: int, seq: int, *, expert_rows: Optional[float] = None,
                  include_mtp: bool = False) -> dict[str, float]:
    """Forward matmul FLOPs of `cfg` on `batch` sequences of `seq` tokens, by component
    (keys: attn_proj, attn_scores, dense_mlp, router, routed_experts, shared_experts, lm_head,
    mtp, total). `expert_rows` = useful routed-expert rows per MoE layer (default
    batch * seq * top_k: dropless). MTP counted only when `include_mtp` (and cfg.mtp_depth > 0)."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got {batch}, {seq}")
    n = batch * seq
    rows = float(n * cfg.moe.top_k if expert_rows is None else expert_rows)
    out = dict.fromkeys(("attn_proj", "attn_scores", "dense_mlp", "router", "routed_experts",
                         "shared_experts", "lm_head", "mtp"), 0.0)
    att = _attention_layer(cfg, n, batch, seq)
    moe = _moe_layer(cfg, n, rows)
    for k, v in att.items():
        out[k] += cfg.num_layers * v
    out["dense_mlp"] = float(cfg.n_dense_layers * 2 * n * 3 * cfg.hidden_size * cfg.intermediate_size)
    for k, v in moe.items():
        out[k] += cfg.n_moe_layers * v
    out["lm_head"] = float(2 * n * cfg.hidden_size * cfg.vocab_size)
    if include_mtp and cfg.mtp_depth:
        d = cfg.hidden_size
        per = 2 * n * 2 * d * d + sum(att.values()) + sum(moe.values()) + out["lm_head"]
        out["mtp"] = float(cfg.mtp_depth * per)
    out["total"] = sum(out.values())
    return out


def train_step_flops(cfg, batch: int, seq: int, **kw) -> float:
    """Matmul FLOPs of one forward + backward step: 3 x `forward_flops(...)['total']`."""
    return 3.0 * forward_flops(cfg, batch, seq, **kw)["total"]


# ---- peaks and MFU ----------------------------------------------------------------------------

# Dense (no sparsity) tensor-core TFLOP/s and HBM TB/s from the vendor datasheets (SXM parts).
DATASHEET = {  # device_kind substring -> {format: TFLOP/s, "hbm_tbs": TB/s}
    "H200": {"tf32": 494.7, "bf16": 989.4, "fp8": 1978.9, "hbm_tbs": 4.8},
    "H100": {"tf32": 494.7, "bf16": 989.4, "fp8": 1978.9, "hbm_tbs": 3.35},
    "B200": {"tf32": 1100.0, "bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0, "hbm_tbs": 8.0},
}

# The tensor-core input format each grouped-matmul precision's forward runs in, per architecture
# (kernels_pallas: FP8 recipes run E4M3 MMAs; on Hopper the NVFP4 forward dequantises to BF16,
# Blackwell has FP4 MMAs; 'f32' runs TF32 under XLA's default GPU precision).
MMA_FORMAT = {
    "hopper": {"f32": "tf32", "bf16": "bf16", "fp8_blockwise": "fp8", "mxfp8": "fp8", "nvfp4_fwd_mxfp8_bwd": "bf16"},
    "blackwell": {"f32": "tf32", "bf16": "bf16", "fp8_blockwise": "fp8", "mxfp8": "fp8", "nvfp4_fwd_mxfp8_bwd": "fp4"},
}


def _device_entry(device_kind: str) -> tuple[Optional[str], Optional[dict]]:
    for k, v in DATASHEET.items():
        if k in device_kind:
            return k, v
    return None, None


def datasheet_peak_tflops(device_kind: str, precision: str) -> Optional[float]:
    """Dense peak TFLOP/s of the format `precision` runs in on `device_kind` (None when unknown:
    a CPU, or a device missing from DATASHEET)."""
    name, entry = _device_entry(device_kind)
    if entry is None:
        return None
    arch = "blackwell" if name.startswith("B") else "hopper"
    if precision not in MMA_FORMAT[arch]:
        raise ValueError(f"precision must be one of {sorted(MMA_FORMAT[arch])}, got {precision!r}")
    return entry.get(MMA_FORMAT[arch][precision])


def datasheet_hbm_tbs(device_kind: str) -> Optional[float]:
    """HBM bandwidth TB/s of `device_kind` (None when unknown)."""
    return (_device_entry(device_kind)[1] or {}).get("hbm_tbs")


def matmul_peak_gflops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """Best GFLOP/s of a jitted n x n x n matmul on the default JAX device (the CPU 'peak')."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(jnp.dot)
    st = time_repeats(lambda: f(a, b).block_until_ready(), repeats=repeats, warmup=1)
    return 2 * n ** 3 / st.min / 1e9


def cores() -> int:
    """CPU cores this process may run on (its affinity mask: `taskset -c 0 python ...` gives 1). The
    peak and every timing depend on it, so the scripts print it beside the peak."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def mfu(flops: float, seconds: float, peak_gflops: float) -> float:
    """Model FLOPs utilisation: flops / seconds / peak (peak in GFLOP/s)."""
    return flops / seconds / (peak_gflops * 1e9)


# ---- timing statistics ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of repeated timings (seconds)."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("Stats needs at least one sample")

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def min(self) -> float:
        return float(min(self.samples))

    @property
    def max(self) -> float:
        return float(max(self.samples))

    @property
    def q1(self) -> float:
        return float(np.percentile(self.samples, 25))

    @property
    def q3(self) -> float:
        return float(np.percentile(self.samples, 75))

    def spread(self, scale: float = 1.0, unit: str = "s", digits: int = 3) -> str:
        """'median [min, max] IQR q1-q3 (n=...)' with values multiplied by `scale`."""
        f = lambda x: f"{x * scale:.{digits}f}"  # noqa: E731
        return (f"{f(self.median)}{unit} [min {f(self.min)}, max {f(self.max)}; IQR {f(self.q1)}-{f(self.q3)}]"
                f" n={self.n}")

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3,
                "n": self.n, "samples": list(self.samples)}


MIN_REPEATS = 5


@contextlib.contextmanager
def switched(variant):
    """Set a `parse_variants` entry's module attribute for the block (None: the default, nothing
    set); the previous value is restored on exit."""
    if variant is None:
        yield
        return
    _, mod, attr, value = variant
    module = importlib.import_module(mod)
    old = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, old)


def parse_variants(text: str, variants: dict) -> list:
    """'name=value,...' -> [(label, module, attr, value)] for same-process A/B variants that set a
    module attribute (`variants`: name -> (module, attribute)); 'true'/'false' become bools and
    digit strings ints. An unknown name or a missing '=' exits before any compute."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, raw = item.partition("=")
        if not sep or name not in variants:
            raise SystemExit(f"--variants: {item!r} is not NAME=VALUE with NAME in {sorted(variants)}")
        value = {"true": True, "false": False}.get(raw.lower(), raw)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        out.append((item, *variants[name], value))
    return out


def time_repeats(fn: Callable[[], object], repeats: int = MIN_REPEATS, warmup: int = 1) -> Stats:
    """Call `fn` `warmup` times untimed, then `repeats` times timed (wall clock, perf_counter).
    `fn` must block until its work is done (e.g. `jax.block_until_ready`)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return Stats(tuple(out))
