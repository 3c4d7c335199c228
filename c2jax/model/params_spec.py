"""The parameter tree of the model: names, shapes, logical axes and initialisers, from the config.

This is the single source of truth other floors build on: `init` draws parameters from it, the
HF checkpoint importer checks shapes against it, and the sharding layer maps its logical axis
names to mesh axes. Layers are stacked (leading axis ``layers``) per kind so a `lax.scan` runs
them and compile time does not grow with depth:

    embed/embedding                        [vocab, embed]
    dense_layers/ (first_k_dense_replace layers; absent when 0)      leading [layers]
        attn_norm/scale                    [embed]
        attn/q_a_proj/kernel               [embed, q_lora]          (q_lora_rank set)
        attn/q_a_norm/scale                [q_lora]                 (q_lora_rank set)
        attn/q_b_proj/kernel               [q_lora, heads, qk_head] (q_lora_rank set)
        attn/q_proj/kernel                 [embed, heads, qk_head]  (q_lora_rank None)
        attn/kv_a_proj/kernel              [embed, kv_a]            kv_a = kv_lora + rope (c_kv first)
        attn/kv_a_norm/scale               [kv_lora]
        attn/kv_b_proj/kernel              [kv_lora, heads, kv_head]  kv_head = nope + v (nope first)
        attn/o_proj/kernel                 [heads, v_head, embed]
        mlp_norm/scale                     [embed]
        mlp/{gate_proj,up_proj}/kernel     [embed, mlp];  mlp/down_proj/kernel [mlp, embed]
    moe_layers/ (the remaining layers; absent when 0)                leading [layers]
        attn_norm, attn, mlp_norm          as above
        moe/router/kernel                  [embed, experts]
        moe/router/bias                    [experts]   selection-only correction bias (NOT trained
                                                      by gradient; updated by the aux-loss-free rule)
        moe/experts/{gate_proj,up_proj}    [experts, embed, expert_mlp]
        moe/experts/down_proj              [experts, expert_mlp, embed]
        moe/shared/{gate_proj,up_proj}/kernel [embed, shared_mlp]; moe/shared/down_proj/kernel
                                           [shared_mlp, embed]  (absent when n_shared_experts == 0)
    final_norm/scale                       [embed]
    lm_head/kernel                         [embed, vocab]
    mtp/ (mtp_depth > 0)                   leading [mtp_layers]
        enorm/scale, hnorm/scale           [embed]
        eh_proj/kernel                     [embed2, embed]   input = concat(enorm(emb), hnorm(h))
        layer/{attn_norm, attn, mlp_norm, moe}   one MoE decoder block, as in moe_layers
        final_norm/scale                   [embed]           (HF: shared_head.norm)

Kernels are stored input-major (x @ kernel), i.e. transposed relative to torch `nn.Linear`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from c2jax.model.config import ModelConfig

# Logical axis names used by parameters (sharding maps these to mesh axes).
LOGICAL_AXES = (
    "layers", "mtp_layers", "vocab", "embed", "embed2", "q_lora", "kv_lora", "kv_a", "heads",
    "qk_head", "kv_head", "v_head", "mlp", "experts", "expert_mlp", "shared_mlp",
)


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str = "normal"  # normal(initializer_range) | ones | zeros
    trainable: bool = True

    def stacked(self, n: int, axis: str) -> "ParamSpec":
        return ParamSpec((n,) + self.shape, (axis,) + self.axes, self.init, self.trainable)


def _linear(*shape_axes: tuple[int, str]) -> dict:
    return {"kernel": ParamSpec(tuple(s for s, _ in shape_axes), tuple(a for _, a in shape_axes))}


def _norm(n: int, axis: str) -> dict:
    return {"scale": ParamSpec((n,), (axis,), "ones")}


def attention_spec(cfg: ModelConfig) -> dict:
    a, D, H = cfg.attention, cfg.hidden_size, cfg.num_heads
    out: dict[str, Any] = {}
    if a.q_lora_rank is None:
        out["q_proj"] = _linear((D, "embed"), (H, "heads"), (a.qk_head_dim, "qk_head"))
    else:
        out["q_a_proj"] = _linear((D, "embed"), (a.q_lora_rank, "q_lora"))
        out["q_a_norm"] = _norm(a.q_lora_rank, "q_lora")
        out["q_b_proj"] = _linear((a.q_lora_rank, "q_lora"), (H, "heads"), (a.qk_head_dim, "qk_head"))
    out["kv_a_proj"] = _linear((D, "embed"), (a.kv_lora_rank + a.qk_rope_head_dim, "kv_a"))
    out["kv_a_norm"] = _norm(a.kv_lora_rank, "kv_lora")
    out["kv_b_proj"] = _linear((a.kv_lora_rank, "kv_lora"), (H, "heads"),
                               (a.qk_nope_head_dim + a.v_head_dim, "kv_head"))
    out["o_proj"] = _linear((H, "heads"), (a.v_head_dim, "v_head"), (D, "embed"))
    return out


def dense_mlp_spec(cfg: ModelConfig) -> dict:
    D, F = cfg.hidden_size, cfg.intermediate_size
    return {"gate_proj": _linear((D, "embed"), (F, "mlp")), "up_proj": _linear((D, "embed"), (F, "mlp")),
            "down_proj": _linear((F, "mlp"), (D, "embed"))}


def moe_spec(cfg: ModelConfig) -> dict:
    D, e = cfg.hidden_size, cfg.moe
    E, F = e.n_routed_experts, e.intermediate_size
    out: dict[str, Any] = {
        "router": {"kernel": ParamSpec((D, E), ("embed", "experts")),
                   "bias": ParamSpec((E,), ("experts",), "zeros", trainable=False)},
        "experts": {
            "gate_proj": ParamSpec((E, D, F), ("experts", "embed", "expert_mlp")),
            "up_proj": ParamSpec((E, D, F), ("experts", "embed", "expert_mlp")),
            "down_proj": ParamSpec((E, F, D), ("experts", "expert_mlp", "embed")),
        },
    }
    if e.n_shared_experts:
        S = F * e.n_shared_experts
        out["shared"] = {"gate_proj": _linear((D, "embed"), (S, "shared_mlp")),
                         "up_proj": _linear((D, "embed"), (S, "shared_mlp")),
                         "down_proj": _linear((S, "shared_mlp"), (D, "embed"))}
    return out


def block_spec(cfg: ModelConfig, moe: bool) -> dict:
    D = cfg.hidden_size
    out = {"attn_norm": _norm(D, "embed"), "attn": attention_spec(cfg), "mlp_norm": _norm(D, "embed")}
    if moe:
        out["moe"] = moe_spec(cfg)
    else:
        out["mlp"] = dense_mlp_spec(cfg)
    return out


def _stack(tree: Any, n: int, axis: str) -> Any:
    if isinstance(tree, ParamSpec):
        return tree.stacked(n, axis)
    return {k: _stack(v, n, axis) for k, v in tree.items()}


def param_specs(cfg: ModelConfig) -> dict:
    """The full parameter tree of `cfg` as nested dicts of `ParamSpec` (see module docstring)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    out: dict[str, Any] = {"embed": {"embedding": ParamSpec((V, D), ("vocab", "embed"))}}
    if cfg.n_dense_layers:
        out["dense_layers"] = _stack(block_spec(cfg, moe=False), cfg.n_dense_layers, "layers")
    if cfg.n_moe_layers:
        out["moe_layers"] = _stack(block_spec(cfg, moe=True), cfg.n_moe_layers, "layers")
    out["final_norm"] = _norm(D, "embed")
    out["lm_head"] = _linear((D, "embed"), (V, "vocab"))
    if cfg.mtp_depth:
        mtp = {"enorm": _norm(D, "embed"), "hnorm": _norm(D, "embed"),
               "eh_proj": _linear((2 * D, "embed2"), (D, "embed")),
               "layer": block_spec(cfg, moe=True), "final_norm": _norm(D, "embed")}
        out["mtp"] = _stack(mtp, cfg.mtp_depth, "mtp_layers")
    return out


def map_specs(fn: Callable[[ParamSpec], Any], specs: Any) -> Any:
    """Map `fn` over the ParamSpec leaves of a spec tree, keeping the dict structure."""
    if isinstance(specs, ParamSpec):
        return fn(specs)
    return {k: map_specs(fn, v) for k, v in specs.items()}


def logical_axes(cfg: ModelConfig) -> dict:
    """Tree of logical-axis tuples matching the parameter tree."""
    return map_specs(lambda s: s.axes, param_specs(cfg))


def trainable_mask(cfg: ModelConfig) -> dict:
    """Tree of bools: False for parameters not trained by gradient (the router correction bias).

    Use with `optax.masked` so weight decay does not touch them either.
    """
    return map_specs(lambda s: s.trainable, param_specs(cfg))
