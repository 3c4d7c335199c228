"""`ModelConfig` <-> Hugging Face ``config.json`` (DeepSeek-V3, Kimi-K2, Kimi-K2.5).

What transformers 5.x `DeepseekV3Config` reads (checked against the installed source,
``transformers/models/deepseek_v3/configuration_deepseek_v3.py`` and ``modeling_rope_utils.py``):
the MoE/MLA fields listed in `_FIELD_MAP`, rope as ``rope_parameters`` {rope_type, rope_theta,
factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim} (the legacy
top-level ``rope_theta`` + ``rope_scaling`` {type: yarn, ...} of the public DeepSeek/Kimi configs is
still converted by transformers), ``rope_interleave``, ``num_mtp_layers`` (an alias of the public
checkpoints' ``num_nextn_predict_layers``). We write both the legacy and the new rope keys so the
file also works with DeepSeek's remote code, vLLM and SGLang.

Reading accepts: a DeepSeek-V3 config (``model_type`` ``deepseek_v3``), Kimi-K2 (``kimi_k2``,
architecture ``DeepseekV3ForCausalLM``), and Kimi-K2.5 (``kimi_k25``: a multimodal wrapper whose
language model config is nested under ``text_config``). Anything else raises
`UnsupportedArchitectureError` naming the architecture.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from c2jax.model.config import AttentionConfig, ModelConfig, MoEConfig, RopeScaling


class CheckpointError(ValueError):
    """A checkpoint (config or tensors) does not match what c2jax expects."""


class UnsupportedArchitectureError(CheckpointError):
    """The config.json describes a model architecture c2jax cannot load."""


# Language-model architectures/model types with the DeepSeek-V3 layout.
SUPPORTED_MODEL_TYPES = ("deepseek_v3", "kimi_k2")
SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
# Multimodal wrappers whose ``text_config`` is a supported language model.
WRAPPER_MODEL_TYPES = ("kimi_k25",)
WRAPPER_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)

# ModelConfig attribute path -> HF key (plain copies).
_FIELD_MAP: tuple[tuple[str, str], ...] = (
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("first_k_dense_replace", "first_k_dense_replace"),
    ("rms_norm_eps", "rms_norm_eps"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("initializer_range", "initializer_range"),
    ("attention.q_lora_rank", "q_lora_rank"),
    ("attention.kv_lora_rank", "kv_lora_rank"),
    ("attention.qk_nope_head_dim", "qk_nope_head_dim"),
    ("attention.qk_rope_head_dim", "qk_rope_head_dim"),
    ("attention.v_head_dim", "v_head_dim"),
    ("attention.rope_interleave", "rope_interleave"),
    ("moe.n_routed_experts", "n_routed_experts"),
    ("moe.n_shared_experts", "n_shared_experts"),
    ("moe.top_k", "num_experts_per_tok"),
    ("moe.n_group", "n_group"),
    ("moe.topk_group", "topk_group"),
    ("moe.intermediate_size", "moe_intermediate_size"),
    ("moe.routed_scaling_factor", "routed_scaling_factor"),
    ("moe.norm_topk_prob", "norm_topk_prob"),
)

# HF keys every supported config must carry (no safe default exists for them).
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
             "num_experts_per_tok", "moe_intermediate_size")


def _get(cfg: ModelConfig, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def hf_config_from_model_config(cfg: ModelConfig) -> dict[str, Any]:
    """A DeepSeek-V3 ``config.json`` dict describing `cfg` (accepted by transformers 5 `DeepseekV3Config`)."""
    a = cfg.attention
    d: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
    }
    for ours, theirs in _FIELD_MAP:
        d[theirs] = _get(cfg, ours)
    d.update(
        num_key_value_heads=cfg.num_heads,  # MLA: every head has its own K/V (from the shared latent)
        num_nextn_predict_layers=cfg.mtp_depth,
        num_mtp_layers=cfg.mtp_depth,
        tie_word_embeddings=False,
        attention_bias=False,
        hidden_act="silu",
        # DeepSeek remote-code / vLLM router description: sigmoid scores, bias for selection only.
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        moe_layer_freq=1,
        rope_theta=a.rope_theta,
        dtype=cfg.param_dtype,
    )
    rs = a.rope_scaling
    if rs is None:
        d["rope_scaling"] = None
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": a.rope_theta}
    else:
        yarn = {"factor": rs.factor, "original_max_position_embeddings": rs.original_max_position_embeddings,
                "beta_fast": rs.beta_fast, "beta_slow": rs.beta_slow, "mscale": rs.mscale,
                "mscale_all_dim": rs.mscale_all_dim}
        d["rope_scaling"] = {"type": "yarn", **yarn}
        d["rope_parameters"] = {"rope_type": "yarn", "rope_theta": a.rope_theta, **yarn}
    return d


def text_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config.json (unwraps Kimi-K2.5's ``text_config``); checks the architecture."""
    d = dict(d)
    mt = d.get("model_type")
    archs = list(d.get("architectures") or [])
    if "text_config" in d and (mt in WRAPPER_MODEL_TYPES or any(x in WRAPPER_ARCHITECTURES for x in archs)):
        inner = dict(d["text_config"])
        # Settings a wrapper may keep at top level only.
        for k in ("quantization_config", "dtype", "torch_dtype"):
            if k in d and k not in inner:
                inner[k] = d[k]
        d = inner
        mt = d.get("model_type")
        archs = list(d.get("architectures") or [])
    ok = mt in SUPPORTED_MODEL_TYPES or (mt is None and any(x in SUPPORTED_ARCHITECTURES for x in archs))
    if mt is not None and mt not in SUPPORTED_MODEL_TYPES and any(x in SUPPORTED_ARCHITECTURES for x in archs):
        ok = True  # e.g. a fine-tune that renamed model_type but kept the DeepSeek-V3 architecture
    if not ok:
        raise UnsupportedArchitectureError(
            f"unsupported architecture: model_type={mt!r}, architectures={archs}; c2jax loads "
            f"model types {list(SUPPORTED_MODEL_TYPES + WRAPPER_MODEL_TYPES)} / architectures "
            f"{list(SUPPORTED_ARCHITECTURES + WRAPPER_ARCHITECTURES)}")
    return d


def _rope_from_hf(d: Mapping[str, Any]) -> tuple[float, Optional[RopeScaling]]:
    rp = d.get("rope_parameters")
    rs = d.get("rope_scaling")
    params = dict(rs) if rs else (dict(rp) if rp else {})
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return float(theta), None
    if kind != "yarn":
        raise UnsupportedArchitectureError(f"unsupported rope scaling type {kind!r} (c2jax implements 'yarn' only)")
    if params.get("attention_factor") is not None:
        raise UnsupportedArchitectureError("yarn 'attention_factor' override is not supported (use mscale/mscale_all_dim)")
    factor = params.get("factor")
    # transformers' rule: a top-level original_max_position_embeddings wins, else the rope dict's,
    # else max_position_embeddings.
    omp = d.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") \
        or d.get("max_position_embeddings", 4096)
    if factor is None:
        factor = d["max_position_embeddings"] / omp
    if params.get("truncate", True) is not True:
        raise UnsupportedArchitectureError("yarn 'truncate': false is not supported")
    return float(theta), RopeScaling(
        type="yarn", factor=float(factor), original_max_position_embeddings=int(omp),
        beta_fast=float(params.get("beta_fast") or 32.0), beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(params.get("mscale") if params.get("mscale") is not None else 1.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0))


def model_config_from_hf(d: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """`ModelConfig` from a DeepSeek-V3 / Kimi-K2 / Kimi-K2.5 config.json dict.

    `overrides` are dotted `ModelConfig.replace` keys (e.g. ``param_dtype='float32'``,
    ``**{'moe.impl': 'capacity'}``) for the settings a checkpoint does not carry.
    """
    t = text_config(d)
    missing = [k for k in _REQUIRED if k not in t]
    if missing:
        raise CheckpointError(f"config.json lacks required keys {missing}")
    H = t["num_attention_heads"]
    kvh = t.get("num_key_value_heads") or H
    if kvh != H:
        raise UnsupportedArchitectureError(f"num_key_value_heads={kvh} != num_attention_heads={H}: not MLA as in DeepSeek-V3")
    if t.get("attention_bias"):
        raise UnsupportedArchitectureError("attention_bias=True is not supported (DeepSeek-V3 has no attention biases)")
    if t.get("tie_word_embeddings"):
        raise UnsupportedArchitectureError("tie_word_embeddings=True is not supported (DeepSeek-V3 unties them)")
    for key, want in (("hidden_act", "silu"), ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if t.get(key, want) != want:
            raise UnsupportedArchitectureError(f"{key}={t[key]!r} is not supported (c2jax implements {want!r})")
    if t.get("moe_layer_freq", 1) != 1:
        raise UnsupportedArchitectureError(f"moe_layer_freq={t['moe_layer_freq']} is not supported (must be 1)")
    theta, rope_scaling = _rope_from_hf(t)
    mtp = t.get("num_nextn_predict_layers", t.get("num_mtp_layers", 0)) or 0
    dt = str(t.get("dtype") or t.get("torch_dtype") or "float32").replace("torch.", "")
    # bfloat16 checkpoints (FP8/INT4 ones declare bfloat16 too) load as bfloat16; anything else as
    # float32, which holds float16 exactly.
    param_dtype = "bfloat16" if dt == "bfloat16" else "float32"
    v = {theirs: t.get(theirs) for _, theirs in _FIELD_MAP}
    cfg = ModelConfig(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], num_layers=v["num_hidden_layers"],
        num_heads=H, intermediate_size=v["intermediate_size"],
        first_k_dense_replace=t.get("first_k_dense_replace", 0) or 0,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
        initializer_range=float(t.get("initializer_range", 0.02)),
        mtp_depth=int(mtp), dtype=param_dtype, param_dtype=param_dtype,
        attention=AttentionConfig(
            q_lora_rank=t.get("q_lora_rank"), kv_lora_rank=v["kv_lora_rank"],
            qk_nope_head_dim=v["qk_nope_head_dim"], qk_rope_head_dim=v["qk_rope_head_dim"],
            v_head_dim=v["v_head_dim"], rope_theta=theta,
            rope_interleave=bool(t.get("rope_interleave", True)), rope_scaling=rope_scaling),
        moe=MoEConfig(
            n_routed_experts=v["n_routed_experts"], n_shared_experts=t.get("n_shared_experts", 0) or 0,
            top_k=v["num_experts_per_tok"], n_group=t.get("n_group") or 1, topk_group=t.get("topk_group") or 1,
            intermediate_size=v["moe_intermediate_size"],
            routed_scaling_factor=float(t.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(t.get("norm_topk_prob", True))),
    )
    if overrides:
        cfg = cfg.replace(**overrides)
    return ModelConfig.from_config(cfg.to_dict())  # runs the model validator
