"""Model configuration: the DeepSeek-V3 / Kimi-K2 architecture as a frozen (hashable) dataclass.

`ModelConfig` is what `init`/`apply` take (it is static under jit). Experiment configs carry the
same fields as an `ml_collections.ConfigDict` under ``config.model``; `ModelConfig.from_config`
converts, and `validate_model` (registered as the ``model`` section validator) rejects bad values
with the key and the allowed range before any compute.

Layout of ``config.model`` (HF DeepSeek-V3 names in brackets where they differ):

    vocab_size, hidden_size, num_layers [num_hidden_layers], num_heads [num_attention_heads],
    intermediate_size (dense MLP), first_k_dense_replace, rms_norm_eps, max_position_embeddings,
    initializer_range, mtp_depth [num_nextn_predict_layers], dtype, param_dtype
    attention: q_lora_rank (None = direct query projection), kv_lora_rank, qk_nope_head_dim,
               qk_rope_head_dim, v_head_dim, rope_theta, rope_interleave,
               rope_scaling: None or {type: 'yarn', factor, original_max_position_embeddings,
                                      beta_fast, beta_slow, mscale, mscale_all_dim}
    moe: n_routed_experts, n_shared_experts, top_k [num_experts_per_tok], n_group, topk_group,
         intermediate_size [moe_intermediate_size], routed_scaling_factor, norm_topk_prob,
         impl (a name of `moe_impls.MOE_IMPLS`: 'dropless' | 'capacity' | 'pallas' | 'sampler_dense'), capacity_factor,
         precision (a recipe of `kernels_pallas.gmm.ops.RECIPES`: 'f32' | 'bf16' | 'fp8_blockwise' | 'mxfp8' | 'nvfp4_fwd_mxfp8_bwd'),
         bias_update_rate (aux-loss-free balancing), seq_aux_loss_coef,
         replay_margin (None = replay routes as given; else plausibility check margin)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import ml_collections

from c2jax.config import Checker, ConfigError, register_validator

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class RopeScaling:
    """YaRN rope scaling (the only scaling DeepSeek-V3/Kimi-K2 use)."""

    type: str = "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclass(frozen=True)
class AttentionConfig:
    """Multi-head latent attention (MLA)."""

    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    rope_scaling: Optional[RopeScaling] = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEConfig:
    """Routed + shared experts with a sigmoid router and a selection-only correction bias."""

    n_routed_experts: int = 8
    n_shared_experts: int = 1
    top_k: int = 2
    n_group: int = 1
    topk_group: int = 1
    intermediate_size: int = 128
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    impl: str = "dropless"
    capacity_factor: float = 1.25
    precision: str = "f32"
    bias_update_rate: float = 1e-3
    seq_aux_loss_coef: float = 0.0
    replay_margin: Optional[float] = None


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    first_k_dense_replace: int = 1
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    mtp_depth: int = 0
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)

    # ---- derived -------------------------------------------------------------------------
    @property
    def n_dense_layers(self) -> int:
        return min(self.first_k_dense_replace, self.num_layers)

    @property
    def n_moe_layers(self) -> int:
        return self.num_layers - self.n_dense_layers

    def replace(self, **kw: Any) -> "ModelConfig":
        """`dataclasses.replace` that also accepts dotted keys, e.g. replace(**{'moe.impl': 'capacity'})."""
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for k, v in kw.items():
            if "." in k:
                sec, sub = k.split(".", 1)
                nested.setdefault(sec, {})[sub] = v
            else:
                top[k] = v
        for sec, sub in nested.items():
            top[sec] = dataclasses.replace(top.get(sec, getattr(self, sec)), **sub)
        return dataclasses.replace(self, **top)

    # ---- conversion ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_config_dict(self) -> ml_collections.ConfigDict:
        d = self.to_dict()
        return ml_collections.ConfigDict(d, type_safe=False)

    @classmethod
    def from_config(cls, cfg: Any) -> "ModelConfig":
        """Build from a ConfigDict / dict with the layout in the module docstring (validates)."""
        if isinstance(cfg, ModelConfig):
            return cfg
        d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        check = Checker("model")
        validate_model(check, d, None)
        if check.problems:
            raise ConfigError(check.problems)
        return _from_dict(d)


def _from_dict(d: dict[str, Any]) -> ModelConfig:
    d = dict(d)
    att = dict(d.pop("attention", {}) or {})
    rs = att.pop("rope_scaling", None)
    if rs:
        rs = RopeScaling(**{k: v for k, v in dict(rs).items()})
    moe = dict(d.pop("moe", {}) or {})
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError([(f"model.{k}", "unknown key") for k in sorted(unknown)])
    return ModelConfig(attention=AttentionConfig(rope_scaling=rs or None, **att), moe=MoEConfig(**moe), **d)


@register_validator("model")
def validate_model(check: Checker, m: Any, full: Any) -> None:
    """Range and consistency checks for ``config.model`` (see module docstring for keys)."""
    if hasattr(m, "to_dict"):
        m = m.to_dict()
    if dataclasses.is_dataclass(m):
        m = dataclasses.asdict(m)
    known = {f.name for f in dataclasses.fields(ModelConfig)} | {"preset"}
    for k in m:
        if k not in known:
            check.error(k, f"unknown key; known: {sorted(known)}")
    check.int_range(m, "vocab_size", 2)
    d = check.int_range(m, "hidden_size", 1)
    nl = check.int_range(m, "num_layers", 1)
    check.int_range(m, "num_heads", 1)
    check.int_range(m, "intermediate_size", 1)
    fk = check.int_range(m, "first_k_dense_replace", 0)
    if nl is not None and fk is not None:
        check.require(fk <= nl, "first_k_dense_replace", f"must be in [0, num_layers={nl}], got {fk}")
    check.float_range(m, "rms_norm_eps", 0.0, lo_open=True)
    check.int_range(m, "max_position_embeddings", 1)
    check.float_range(m, "initializer_range", 0.0, lo_open=True)
    check.int_range(m, "mtp_depth", 0)
    check.choice(m, "dtype", DTYPES)
    check.choice(m, "param_dtype", DTYPES)

    a = check.value(m, "attention")
    if a is not None:
        check.int_range(a, "q_lora_rank", 1, optional=True) if a.get("q_lora_rank") is not None else None
        if "q_lora_rank" in a and a["q_lora_rank"] is not None:
            check.int_range(a, "q_lora_rank", 1)
        _sub(check, "attention", lambda c: (
            c.int_range(a, "kv_lora_rank", 1),
            c.int_range(a, "qk_nope_head_dim", 1),
            c.int_range(a, "qk_rope_head_dim", 2),
            c.int_range(a, "v_head_dim", 1),
            c.float_range(a, "rope_theta", 0.0, lo_open=True),
        ))
        rr = a.get("qk_rope_head_dim")
        if isinstance(rr, int) and rr % 2:
            check.error("attention.qk_rope_head_dim", f"must be even (rotary pairs), got {rr}")
        rs = a.get("rope_scaling")
        if rs:
            rs = dict(rs)
            if rs.get("type", "yarn") != "yarn":
                check.error("attention.rope_scaling.type", f"must be 'yarn', got {rs.get('type')!r}")
            f = rs.get("factor", 1.0)
            if not isinstance(f, (int, float)) or f < 1.0:
                check.error("attention.rope_scaling.factor", f"must be a number >= 1, got {f!r}")
            omp = rs.get("original_max_position_embeddings", 4096)
            if not isinstance(omp, int) or omp < 1:
                check.error("attention.rope_scaling.original_max_position_embeddings",
                            f"must be an integer >= 1, got {omp!r}")

    e = check.value(m, "moe")
    if e is not None:
        c = Checker(f"{check.prefix}.moe")
        ne = c.int_range(e, "n_routed_experts", 1)
        c.int_range(e, "n_shared_experts", 0)
        k = c.int_range(e, "top_k", 1)
        ng = c.int_range(e, "n_group", 1)
        tg = c.int_range(e, "topk_group", 1)
        c.int_range(e, "intermediate_size", 1)
        c.float_range(e, "routed_scaling_factor", 0.0, lo_open=True)
        from c2jax.model.moe_impls import MOE_IMPLS  # the registries are the lists (imports jax)
        from kernels_pallas.gmm.ops import PRECISIONS as MOE_PRECISIONS

        c.choice(e, "impl", MOE_IMPLS.names())
        c.float_range(e, "capacity_factor", 0.0, lo_open=True)
        c.choice(e, "precision", MOE_PRECISIONS)
        c.float_range(e, "bias_update_rate", 0.0)
        c.float_range(e, "seq_aux_loss_coef", 0.0)
        if e.get("replay_margin") is not None:
            c.float_range(e, "replay_margin", 0.0)
        if ne is not None and k is not None and k > ne:
            c.error("top_k", f"must be in [1, n_routed_experts={ne}], got {k}")
        if ne is not None and ng is not None:
            if ne % ng:
                c.error("n_group", f"must divide n_routed_experts={ne}, got {ng}")
            elif tg is not None and tg > ng:
                c.error("topk_group", f"must be in [1, n_group={ng}], got {tg}")
            elif tg is not None and k is not None and tg * (ne // ng) < k:
                c.error("topk_group", f"topk_group * experts per group = {tg * (ne // ng)} must be >= top_k={k}")
        check.problems.extend(c.problems)
        check.warnings.extend(c.warnings)


def _sub(check: Checker, name: str, fn) -> None:
    c = Checker(f"{check.prefix}.{name}")
    fn(c)
    check.problems.extend(c.problems)


# ---- presets -----------------------------------------------------------------------------------

def preset(name: str) -> ModelConfig:
    """Named model shapes: 'tiny' (tests), 'small' (CPU research), 'kimi_k2', 'deepseek_v3'."""
    try:
        return _PRESETS[name]()
    except KeyError:
        raise ConfigError([("model.preset", f"must be one of {sorted(_PRESETS)}, got {name!r}")]) from None


def _tiny() -> ModelConfig:
    return ModelConfig(
        vocab_size=512, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=192,
        first_k_dense_replace=1, max_position_embeddings=1024, mtp_depth=1,
        attention=AttentionConfig(q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
                                  qk_rope_head_dim=8, v_head_dim=16),
        moe=MoEConfig(n_routed_experts=8, n_shared_experts=1, top_k=2, n_group=2, topk_group=1,
                      intermediate_size=64, routed_scaling_factor=2.5),
    )


def _small() -> ModelConfig:
    # ~14-17M parameters: the config of the feasibility probe (4 layers, d 256, 8 experts top-2).
    return ModelConfig(
        vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, intermediate_size=512,
        first_k_dense_replace=1, max_position_embeddings=4096, mtp_depth=1,
        attention=AttentionConfig(q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
                                  qk_rope_head_dim=16, v_head_dim=32),
        moe=MoEConfig(n_routed_experts=8, n_shared_experts=1, top_k=2, n_group=1, topk_group=1,
                      intermediate_size=512, routed_scaling_factor=1.0, impl="capacity"),
    )


def _kimi_k2() -> ModelConfig:
    return ModelConfig(
        vocab_size=163840, hidden_size=7168, num_layers=61, num_heads=64, intermediate_size=18432,
        first_k_dense_replace=1, max_position_embeddings=131072, mtp_depth=0,
        rms_norm_eps=1e-6, dtype="bfloat16", param_dtype="bfloat16",
        attention=AttentionConfig(
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, rope_theta=50000.0, rope_interleave=True,
            rope_scaling=RopeScaling(factor=32.0, original_max_position_embeddings=4096,
                                     beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
        moe=MoEConfig(n_routed_experts=384, n_shared_experts=1, top_k=8, n_group=1, topk_group=1,
                      intermediate_size=2048, routed_scaling_factor=2.827, norm_topk_prob=True),
    )


def _deepseek_v3() -> ModelConfig:
    return ModelConfig(
        vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, intermediate_size=18432,
        first_k_dense_replace=3, max_position_embeddings=163840, mtp_depth=1,
        dtype="bfloat16", param_dtype="bfloat16",
        attention=AttentionConfig(
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, rope_theta=10000.0, rope_interleave=True,
            rope_scaling=RopeScaling(factor=40.0, original_max_position_embeddings=4096,
                                     beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)),
        moe=MoEConfig(n_routed_experts=256, n_shared_experts=1, top_k=8, n_group=8, topk_group=4,
                      intermediate_size=2048, routed_scaling_factor=2.5, norm_topk_prob=True),
    )


_PRESETS = {"tiny": _tiny, "small": _small, "kimi_k2": _kimi_k2, "deepseek_v3": _deepseek_v3}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def model_config_dict(name: str, **overrides: Any) -> ml_collections.ConfigDict:
    """A ``config.model`` ConfigDict for an experiment file, from a preset plus dotted overrides."""
    cfg = preset(name).replace(**overrides)
    cd = cfg.to_config_dict()
    return cd


# ---- closed-form parameter counts -------------------------------------------------------------

def count_params(cfg: ModelConfig, include_mtp: bool = False, include_router_bias: bool = False) -> int:
    """Total parameters, HF `transformers` convention: untied embedding and LM head counted, the
    router's `e_score_correction_bias` not counted (it is a buffer there, not a parameter)."""
    D, a, e = cfg.hidden_size, cfg.attention, cfg.moe
    H = cfg.num_heads
    attn = 2 * D  # input_layernorm + post_attention_layernorm
    if a.q_lora_rank is None:
        attn += D * H * a.qk_head_dim
    else:
        attn += D * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * H * a.qk_head_dim
    attn += D * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
    attn += a.kv_lora_rank * H * (a.qk_nope_head_dim + a.v_head_dim)
    attn += H * a.v_head_dim * D
    dense_mlp = 3 * D * cfg.intermediate_size
    moe = e.n_routed_experts * D + (e.n_routed_experts if include_router_bias else 0)  # router
    moe += e.n_routed_experts * 3 * D * e.intermediate_size
    moe += 3 * D * e.intermediate_size * e.n_shared_experts
    total = 2 * cfg.vocab_size * D + D
    total += cfg.n_dense_layers * (attn + dense_mlp) + cfg.n_moe_layers * (attn + moe)
    if include_mtp and cfg.mtp_depth:
        # enorm, hnorm, eh_proj, one MoE decoder layer, final norm; embedding and head shared.
        per = 2 * D + 2 * D * D + (attn + moe) + D
        total += cfg.mtp_depth * per
    return total


def count_active_params(cfg: ModelConfig, include_embedding: bool = False) -> int:
    """Parameters touched per token: all dense weights + top_k routed + shared experts.

    Definition: the input embedding lookup is excluded by default (a gather, no FLOPs); the LM
    head is included; the router bias is excluded (selection only). MTP excluded.
    """
    D, e = cfg.hidden_size, cfg.moe
    inactive = (e.n_routed_experts - e.top_k) * 3 * D * e.intermediate_size * cfg.n_moe_layers
    total = count_params(cfg) - inactive
    if not include_embedding:
        total -= cfg.vocab_size * D
    return total
