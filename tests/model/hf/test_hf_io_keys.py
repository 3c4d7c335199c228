"""HF DeepSeek-V3 config/state_dict <-> c2jax config/param tree, against real transformers 5 models."""
from __future__ import annotations

import numpy as np
import pytest

from _reference_imports import import_references, require_reference  # noqa: F401

from c2jax.model.config import ModelConfig, RopeScaling, preset
from c2jax.model.hf.config import (
    CheckpointError, UnsupportedArchitectureError, hf_config_from_model_config, model_config_from_hf)
from c2jax.model.hf.keys import hf_state_dict_from_params, params_from_hf_state_dict
from c2jax.model.params_spec import map_specs, param_specs

(torch, transformers), pytestmark = import_references("torch", "transformers")


def _configs() -> dict[str, ModelConfig]:
    tiny = preset("tiny").replace(mtp_depth=0)
    return {
        "tiny": tiny,
        "direct_q_yarn_nodense": tiny.replace(
            first_k_dense_replace=0, **{
                "attention.q_lora_rank": None, "attention.rope_interleave": False,
                "attention.rope_scaling": RopeScaling(factor=4.0, original_max_position_embeddings=256,
                                                      beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                                      mscale_all_dim=1.0),
                "moe.n_group": 4, "moe.topk_group": 2, "moe.n_shared_experts": 0}),
    }


def _torch_sd(cfg: ModelConfig, seed: int = 0) -> tuple[dict, object]:
    hc = transformers.DeepseekV3Config(**hf_config_from_model_config(cfg))
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(hc).eval()
    with torch.no_grad():  # the router bias is zero-initialised in transformers: make it non-trivial
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn_like(buf))
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, hc


def _per_expert(sd: dict, cfg: ModelConfig) -> dict:
    """Independent re-layout of transformers-5 fused experts into the public per-expert keys."""
    F = cfg.moe.intermediate_size
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            for i in range(v.shape[0]):
                out[f"{pre}{i}.gate_proj.weight"] = v[i, :F].copy()
                out[f"{pre}{i}.up_proj.weight"] = v[i, F:].copy()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for i in range(v.shape[0]):
                out[f"{pre}{i}.down_proj.weight"] = v[i].copy()
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name", list(_configs()))
def test_config_roundtrip_through_transformers(name):
    cfg = _configs()[name]
    hc = transformers.DeepseekV3Config(**hf_config_from_model_config(cfg))
    assert hc.num_mtp_layers == cfg.mtp_depth
    assert hc.q_lora_rank == cfg.attention.q_lora_rank
    assert hc.rope_interleave == cfg.attention.rope_interleave
    rs = cfg.attention.rope_scaling
    assert hc.rope_parameters["rope_type"] == ("default" if rs is None else "yarn")
    if rs is not None:
        assert hc.rope_parameters["factor"] == rs.factor
        assert hc.rope_parameters["mscale_all_dim"] == rs.mscale_all_dim
    # transformers' own serialisation reads back to the same config
    assert model_config_from_hf(hc.to_dict()) == cfg


@pytest.mark.parametrize("name", list(_configs()))
def test_state_dict_roundtrip_both_layouts(name):
    cfg = _configs()[name]
    sd, _ = _torch_sd(cfg)
    assert any(k.endswith("experts.gate_up_proj") for k in sd)  # transformers 5 fuses experts
    params = params_from_hf_state_dict(sd, cfg)
    shapes = {"/".join(p): a.shape for p, a in _flat(params)}
    spec = {"/".join(p): s for p, s in _flat(map_specs(lambda s: s.shape, param_specs(cfg)))}
    assert shapes == spec
    # fused -> params -> fused, bit exact
    back = hf_state_dict_from_params(params, cfg, layout="fused")
    sd = {k: v for k, v in sd.items() if v.size}  # transformers keeps zero-sized shared experts when n_shared=0
    assert set(back) == set(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and np.array_equal(back[k], sd[k]), k
    # the public per-expert layout gives the same tree, and exports back to itself
    pe = _per_expert(sd, cfg)
    params2 = params_from_hf_state_dict(pe, cfg)
    for (p, a), (_, b) in zip(_flat(params), _flat(params2)):
        assert np.array_equal(a, b), p
    back2 = hf_state_dict_from_params(params2, cfg, layout="per_expert")
    assert set(back2) == set(pe) and all(np.array_equal(back2[k], pe[k]) for k in pe)


def test_mapping_semantics_spot_checks():
    """Independent index arithmetic for the reshaped projections (not via the key plan)."""
    cfg = _configs()["tiny"]
    sd, _ = _torch_sd(cfg, seed=1)
    p = params_from_hf_state_dict(sd, cfg)
    a, H = cfg.attention, cfg.num_heads
    l = 1  # first MoE layer -> moe_layers[0]
    qb = sd[f"model.layers.{l}.self_attn.q_b_proj.weight"]  # [H*qk, q_lora]
    h, j, r = 2, a.qk_nope_head_dim + 3, 5
    assert p["moe_layers"]["attn"]["q_b_proj"]["kernel"][0, r, h, j] == qb[h * a.qk_head_dim + j, r]
    kvb = sd[f"model.layers.{l}.self_attn.kv_b_proj.weight"]  # [H*(nope+v), kv_lora]
    assert p["moe_layers"]["attn"]["kv_b_proj"]["kernel"][0, r, h, 7] == kvb[h * (a.qk_nope_head_dim + a.v_head_dim) + 7, r]
    o = sd[f"model.layers.{l}.self_attn.o_proj.weight"]  # [D, H*v]
    assert p["moe_layers"]["attn"]["o_proj"]["kernel"][0, h, 4, 9] == o[9, h * a.v_head_dim + 4]
    gu = sd[f"model.layers.{l}.mlp.experts.gate_up_proj"]  # [E, 2F, D]
    F = cfg.moe.intermediate_size
    assert p["moe_layers"]["moe"]["experts"]["up_proj"][0, 3, 10, 6] == gu[3, F + 6, 10]
    assert p["moe_layers"]["moe"]["experts"]["gate_proj"][0, 3, 10, 6] == gu[3, 6, 10]
    dn = sd[f"model.layers.{l}.mlp.experts.down_proj"]  # [E, D, F]
    assert p["moe_layers"]["moe"]["experts"]["down_proj"][0, 3, 6, 10] == dn[3, 10, 6]
    np.testing.assert_array_equal(p["moe_layers"]["moe"]["router"]["bias"][0],
                                  sd[f"model.layers.{l}.mlp.gate.e_score_correction_bias"])
    np.testing.assert_array_equal(p["lm_head"]["kernel"], sd["lm_head.weight"].T)
    np.testing.assert_array_equal(p["dense_layers"]["mlp"]["gate_proj"]["kernel"][0],
                                  sd["model.layers.0.mlp.gate_proj.weight"].T)


def test_bad_state_dicts_fail_loudly():
    cfg = _configs()["tiny"]
    sd, _ = _torch_sd(cfg)
    bad = dict(sd)
    del bad["model.layers.1.self_attn.o_proj.weight"]
    bad["model.layers.9.bogus.weight"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointError) as ei:
        params_from_hf_state_dict(bad, cfg)
    msg = str(ei.value)
    assert "missing 1" in msg and "model.layers.1.self_attn.o_proj.weight" in msg
    assert "unexpected 1" in msg and "model.layers.9.bogus.weight" in msg
    bad = dict(sd)
    bad["model.norm.weight"] = np.ones(cfg.hidden_size + 1, np.float32)
    with pytest.raises(CheckpointError, match=r"'model.norm.weight'.*\(65,\).*\(64,\)"):
        params_from_hf_state_dict(bad, cfg)


def test_unsupported_architecture_is_named():
    d = hf_config_from_model_config(_configs()["tiny"])
    d.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])
    with pytest.raises(UnsupportedArchitectureError, match="qwen3_moe.*Qwen3MoeForCausalLM"):
        model_config_from_hf(d)
    d = hf_config_from_model_config(_configs()["tiny"])
    d["scoring_func"] = "softmax"
    with pytest.raises(UnsupportedArchitectureError, match="scoring_func"):
        model_config_from_hf(d)


def test_kimi_configs():
    """Kimi-K2 config.json (legacy rope keys) and Kimi-K2.5's nested text_config read to the preset shapes."""
    k2 = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "vocab_size": 163840,
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
        "n_shared_experts": 1, "n_routed_experts": 384, "routed_scaling_factor": 2.827,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
        "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-06, "rope_theta": 50000.0, "num_nextn_predict_layers": 0,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
    }
    want = preset("kimi_k2")
    assert model_config_from_hf(k2) == want
    # yarn without original_max_position_embeddings in the rope dict: transformers' default
    k2_omp = dict(k2, rope_scaling={"type": "yarn", "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "beta_fast": 1.0, "beta_slow": 1.0})
    assert model_config_from_hf(k2_omp).attention.rope_scaling.original_max_position_embeddings == 131072
    k25 = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
           "text_config": k2, "vision_config": {"model_type": "moonvit"}}
    assert model_config_from_hf(k25) == want
    assert model_config_from_hf(k2, param_dtype="float32").param_dtype == "float32"


def _flat(tree, prefix=()):
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from _flat(tree[k], prefix + (k,))
    else:
        yield prefix, tree
