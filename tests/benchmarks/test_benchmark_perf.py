"""benchmarks/perf.py: the one FLOP count / MFU / timing-statistics definition of the benchmarks.

The FLOP count is checked against a hand count for a tiny config and against the FLOPs XLA's cost
analysis reports for the compiled forward and forward+backward of the real model (which also
counts elementwise work, so it must lie a few percent above the matmul-only count, and below the
count that would pretend the whole S x S attention square is computed)."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

import perf  # noqa: E402
from c2jax.model.config import AttentionConfig, ModelConfig, MoEConfig, preset  # noqa: E402
from c2jax.model.transformer import apply, init  # noqa: E402


def _hand_cfg() -> ModelConfig:
    return ModelConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=2, intermediate_size=6,
                       first_k_dense_replace=1, mtp_depth=1,
                       attention=AttentionConfig(q_lora_rank=3, kv_lora_rank=2, qk_nope_head_dim=2,
                                                 qk_rope_head_dim=2, v_head_dim=3),
                       moe=MoEConfig(n_routed_experts=4, n_shared_experts=1, top_k=2, intermediate_size=5))


def test_forward_flops_matches_hand_count():
    cfg = _hand_cfg()  # batch 1 x seq 4: N = 4 tokens, one query block (4 < 2 x 128): 16 pairs
    f = perf.forward_flops(cfg, 1, 4)
    # per layer: q 2*4*(4*3 + 3*2*4) = 288, kv_a 2*4*4*(2+2) = 128, kv_b 2*4*2*2*(2+3) = 160,
    # o 2*4*2*3*4 = 192 -> 768; two layers
    assert f["attn_proj"] == 2 * 768
    assert f["attn_scores"] == 2 * (2 * 16 * 2 * (4 + 3))  # QK^T + PV on 16 pairs, 2 heads
    assert f["dense_mlp"] == 2 * 4 * 3 * 4 * 6
    assert f["router"] == 2 * 4 * 4 * 4
    assert f["routed_experts"] == 2 * (4 * 2) * 3 * 4 * 5
    assert f["shared_experts"] == 2 * 4 * 3 * 4 * 5
    assert f["lm_head"] == 2 * 4 * 4 * 10
    assert f["mtp"] == 0.0
    assert f["total"] == 1536 + 896 + 576 + 128 + 960 + 480 + 320 == 4896
    # MTP depth 1: eh_proj 2*4*8*4 = 256 + one MoE layer (768 + 448 + 128 + 960 + 480) + head 320
    assert perf.forward_flops(cfg, 1, 4, include_mtp=True)["mtp"] == 256 + 2784 + 320
    # a capacity (dropping) row counts only the kept expert rows
    assert perf.forward_flops(cfg, 1, 4, expert_rows=5)["routed_experts"] == 2 * 5 * 3 * 4 * 5
    assert perf.train_step_flops(cfg, 1, 4) == 3 * 4896


def test_attention_pairs_count_the_executed_causal_blocks():
    assert perf.causal_blocks(100, block=128) == 1 and perf.attention_pairs(100, block=128) == 100 * 100
    assert perf.causal_blocks(128, block=128) == 1  # one block: the full square
    assert perf.attention_pairs(512, block=128) == 128 * 128 * (1 + 2 + 3 + 4) == 512 * 512 * 5 // 8
    assert perf.attention_pairs(384, block=128) == 128 * 128 * 6
    assert perf.causal_blocks(300, block=128) == 1  # not a multiple of the block: unsplit


def test_bad_shapes_and_precisions_are_rejected():
    with pytest.raises(ValueError, match="batch and seq"):
        perf.forward_flops(_hand_cfg(), 0, 4)
    with pytest.raises(ValueError, match="precision must be one of"):
        perf.datasheet_peak_tflops("NVIDIA H200", "fp16")
    with pytest.raises(ValueError, match="at least one sample"):
        perf.Stats(())


def test_fp8_recipes_use_the_fp8_peak():
    assert perf.datasheet_peak_tflops("NVIDIA H200", "fp8_blockwise") == 1978.9
    assert perf.datasheet_peak_tflops("NVIDIA H100 80GB HBM3", "mxfp8") == 1978.9
    assert perf.datasheet_peak_tflops("NVIDIA H200", "bf16") == 989.4
    assert perf.datasheet_peak_tflops("NVIDIA H200", "nvfp4_fwd_mxfp8_bwd") == 989.4  # BF16 MMAs on Hopper
    assert perf.datasheet_peak_tflops("NVIDIA B200", "nvfp4_fwd_mxfp8_bwd") == 9000.0
    assert perf.datasheet_peak_tflops("cpu", "fp8_blockwise") is None


def test_stats_median_and_spread():
    s = perf.Stats((5.0, 1.0, 3.0, 2.0, 4.0))
    assert (s.median, s.min, s.max, s.q1, s.q3, s.n) == (3.0, 1.0, 5.0, 2.0, 4.0, 5)
    assert "3.000s [min 1.000, max 5.000; IQR 2.000-4.000] n=5" == s.spread()
    calls = []
    st = perf.time_repeats(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and st.n == 5


def _xla_flops(fn, params) -> float:
    cost = jax.jit(fn).lower(params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    if not cost or "flops" not in cost:
        pytest.skip("this backend reports no cost analysis flops")
    return float(cost["flops"])


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=pytest.mark.slow)])  # fwd+bwd: ~25 s compile
def test_flops_agree_with_xla_cost_analysis(train):
    """One layer of each kind (a `lax.scan` body is costed once whatever its trip count), MTP on,
    capacity MoE with capacity_factor 1 (exactly N x top_k expert rows are computed), S = 512:
    four causal query blocks, so 5/8 of the attention square is executed."""
    cfg = preset("tiny").replace(num_layers=2, mtp_depth=1, **{"moe.impl": "capacity", "moe.capacity_factor": 1.0})
    b, s = 1, 512
    params = init(cfg, jax.random.key(0))
    tokens = jnp.zeros((b, s), jnp.int32)

    def loss(p):
        out = apply(p, tokens, cfg)
        return jax.nn.logsumexp(out["logits"], -1).mean() + jax.nn.logsumexp(out["mtp_logits"], -1).mean()

    xla = _xla_flops(jax.value_and_grad(loss) if train else loss, params)
    ours = (perf.train_step_flops if train else lambda *a, **k: perf.forward_flops(*a, **k)["total"])(
        cfg, b, s, include_mtp=True)
    attn_layers = cfg.num_layers + cfg.mtp_depth
    full_square = ours + (3 if train else 1) * 2 * attn_layers * b * cfg.num_heads * (
        cfg.attention.qk_head_dim + cfg.attention.v_head_dim) * (s * s - perf.attention_pairs(s))
    assert ours <= xla <= 1.06 * ours, (ours, xla)  # the rest is elementwise (norms, softmax, ...)
    assert xla < full_square, (xla, full_square)  # the skipped causal blocks are really skipped


def test_cores_is_the_affinity_mask():
    """perf.cores() counts the cores the process may run on, so a `taskset -c 0` run prints 1: the
    figure that says whether a timing had one core or two."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity on this platform")
    mask = os.sched_getaffinity(0)
    assert perf.cores() == len(mask) >= 1
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert perf.cores() == 1
    finally:
        os.sched_setaffinity(0, mask)
    assert perf.cores() == len(mask)
