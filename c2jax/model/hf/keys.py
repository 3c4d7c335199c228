"""The mapping between HF DeepSeek-V3 state_dict keys and the c2jax parameter tree (`params_spec`).

One table (`key_plan`) drives both directions, so import and export cannot drift apart. Each
`Entry` is one HF tensor: its key, its HF shape, the parameter slots it fills (a path in the tree
plus an index into the stacked leading axes) and the two pure numpy transforms between them.

HF conventions (transformers 5 `DeepseekV3ForCausalLM.state_dict()` and the public checkpoints):
torch `nn.Linear` weights are ``[out, in]`` (ours are input-major), ``q_b_proj`` is
``[heads*qk_head, q_lora]``, ``kv_b_proj`` ``[heads*(nope+v), kv_lora]`` (nope first per head),
``o_proj`` ``[embed, heads*v]``; routed experts either per expert
``mlp.experts.{i}.{gate,up,down}_proj.weight`` (public checkpoints, layout ``per_expert``) or fused
``mlp.experts.gate_up_proj`` ``[E, 2*moe_ff, embed]`` (gate = first half) and
``mlp.experts.down_proj`` ``[E, embed, moe_ff]`` (transformers 5 in memory, layout ``fused``);
router ``mlp.gate.weight`` ``[E, embed]`` + ``mlp.gate.e_score_correction_bias`` ``[E]``.
MTP module k is stored as decoder layer ``model.layers.{num_layers + k}`` with extra
``enorm``, ``hnorm``, ``eh_proj`` ``[embed, 2*embed]``, ``shared_head.norm``, and copies of the
shared ``embed_tokens`` and ``shared_head.head`` (= lm_head) that we skip on load and rewrite on save.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from c2jax.model.config import ModelConfig
from c2jax.model.hf.config import CheckpointError
from c2jax.model.params_spec import ParamSpec, param_specs

LAYOUTS = ("per_expert", "fused")
Path = tuple[str, ...]
Slot = tuple[Path, tuple[int, ...]]  # (path in the tree, index into the stacked leading axes)


@dataclass(frozen=True)
class Entry:
    """One HF tensor <-> one or more parameter slots."""

    key: str
    shape: tuple[int, ...]
    slots: tuple[Slot, ...]
    to_ours: Callable[[np.ndarray], Sequence[np.ndarray]]  # HF tensor -> one array per slot
    to_hf: Callable[[Sequence[np.ndarray]], np.ndarray]    # one array per slot -> HF tensor


def _t(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _linear(key: str, slot: Slot, n_in: int, n_out: int) -> Entry:
    """torch Linear [out, in] <-> kernel [in, out]."""
    return Entry(key, (n_out, n_in), (slot,), lambda x: (_t(x),), lambda ys: _t(ys[0]))


def _split_out(key: str, slot: Slot, n_in: int, heads: int, per_head: int) -> Entry:
    """torch Linear [heads*per_head, in] <-> kernel [in, heads, per_head] (q_b_proj, q_proj, kv_b_proj)."""
    return Entry(key, (heads * per_head, n_in), (slot,),
                 lambda x: (_t(x).reshape(n_in, heads, per_head),),
                 lambda ys: _t(ys[0].reshape(n_in, heads * per_head)))


def _o_proj(key: str, slot: Slot, heads: int, v: int, d: int) -> Entry:
    """torch Linear [embed, heads*v] <-> kernel [heads, v, embed]."""
    return Entry(key, (d, heads * v), (slot,),
                 lambda x: (_t(x).reshape(heads, v, d),),
                 lambda ys: _t(ys[0].reshape(heads * v, d)))


def _same(key: str, slot: Slot, shape: tuple[int, ...]) -> Entry:
    return Entry(key, shape, (slot,), lambda x: (x,), lambda ys: ys[0])


def _attention(cfg: ModelConfig, pre: str, base: Path, idx: tuple[int, ...]) -> Iterator[Entry]:
    a, D, H = cfg.attention, cfg.hidden_size, cfg.num_heads
    s = lambda *p: (base + p, idx)  # noqa: E731
    if a.q_lora_rank is None:
        yield _split_out(f"{pre}self_attn.q_proj.weight", s("attn", "q_proj", "kernel"), D, H, a.qk_head_dim)
    else:
        yield _linear(f"{pre}self_attn.q_a_proj.weight", s("attn", "q_a_proj", "kernel"), D, a.q_lora_rank)
        yield _same(f"{pre}self_attn.q_a_layernorm.weight", s("attn", "q_a_norm", "scale"), (a.q_lora_rank,))
        yield _split_out(f"{pre}self_attn.q_b_proj.weight", s("attn", "q_b_proj", "kernel"),
                         a.q_lora_rank, H, a.qk_head_dim)
    yield _linear(f"{pre}self_attn.kv_a_proj_with_mqa.weight", s("attn", "kv_a_proj", "kernel"),
                  D, a.kv_lora_rank + a.qk_rope_head_dim)
    yield _same(f"{pre}self_attn.kv_a_layernorm.weight", s("attn", "kv_a_norm", "scale"), (a.kv_lora_rank,))
    yield _split_out(f"{pre}self_attn.kv_b_proj.weight", s("attn", "kv_b_proj", "kernel"),
                     a.kv_lora_rank, H, a.qk_nope_head_dim + a.v_head_dim)
    yield _o_proj(f"{pre}self_attn.o_proj.weight", s("attn", "o_proj", "kernel"), H, a.v_head_dim, D)
    yield _same(f"{pre}input_layernorm.weight", s("attn_norm", "scale"), (D,))
    yield _same(f"{pre}post_attention_layernorm.weight", s("mlp_norm", "scale"), (D,))


def _mlp(pre: str, base: Path, idx: tuple[int, ...], D: int, F: int) -> Iterator[Entry]:
    for name in ("gate_proj", "up_proj"):
        yield _linear(f"{pre}{name}.weight", (base + (name, "kernel"), idx), D, F)
    yield _linear(f"{pre}down_proj.weight", (base + ("down_proj", "kernel"), idx), F, D)


def _moe(cfg: ModelConfig, pre: str, base: Path, idx: tuple[int, ...], layout: str) -> Iterator[Entry]:
    D, e = cfg.hidden_size, cfg.moe
    E, F = e.n_routed_experts, e.intermediate_size
    m = base + ("moe",)
    yield _linear(f"{pre}mlp.gate.weight", (m + ("router", "kernel"), idx), D, E)
    yield _same(f"{pre}mlp.gate.e_score_correction_bias", (m + ("router", "bias"), idx), (E,))
    ex = m + ("experts",)
    if layout == "per_expert":
        for i in range(E):
            for name in ("gate_proj", "up_proj"):
                yield _linear(f"{pre}mlp.experts.{i}.{name}.weight", (ex + (name,), idx + (i,)), D, F)
            yield _linear(f"{pre}mlp.experts.{i}.down_proj.weight", (ex + ("down_proj",), idx + (i,)), F, D)
    elif layout == "fused":
        yield Entry(f"{pre}mlp.experts.gate_up_proj", (E, 2 * F, D),
                    ((ex + ("gate_proj",), idx), (ex + ("up_proj",), idx)),
                    lambda x: (_t(x[:, :F]), _t(x[:, F:])),  # [E,2F,D] -> 2x [E,D,F]
                    lambda ys: np.concatenate([_t(ys[0]), _t(ys[1])], axis=1))
        yield Entry(f"{pre}mlp.experts.down_proj", (E, D, F), ((ex + ("down_proj",), idx),),
                    lambda x: (_t(x),), lambda ys: _t(ys[0]))  # [E,D,F] <-> [E,F,D]
    else:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if e.n_shared_experts:
        yield from _mlp(f"{pre}mlp.shared_experts.", m + ("shared",), idx, D, F * e.n_shared_experts)


def mtp_shared_keys(cfg: ModelConfig) -> list[str]:
    """Keys of the MTP layers' copies of the shared embedding and LM head (skipped on load)."""
    out = []
    for k in range(cfg.mtp_depth):
        pre = f"model.layers.{cfg.num_layers + k}."
        out += [f"{pre}embed_tokens.weight", f"{pre}shared_head.head.weight"]
    return out


def key_plan(cfg: ModelConfig, layout: str = "per_expert") -> list[Entry]:
    """Every HF tensor of a `cfg` checkpoint (without the MTP shared copies), in checkpoint order."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    D, V = cfg.hidden_size, cfg.vocab_size
    out: list[Entry] = [_same("model.embed_tokens.weight", (("embed", "embedding"), ()), (V, D))]
    for l in range(cfg.num_layers):
        pre = f"model.layers.{l}."
        if l < cfg.n_dense_layers:
            base, idx = ("dense_layers",), (l,)
            out += _attention(cfg, pre, base, idx)
            out += _mlp(f"{pre}mlp.", base + ("mlp",), idx, D, cfg.intermediate_size)
        else:
            base, idx = ("moe_layers",), (l - cfg.n_dense_layers,)
            out += _attention(cfg, pre, base, idx)
            out += _moe(cfg, pre, base, idx, layout)
    out.append(_same("model.norm.weight", (("final_norm", "scale"), ()), (D,)))
    out.append(_linear("lm_head.weight", (("lm_head", "kernel"), ()), D, V))
    for k in range(cfg.mtp_depth):
        pre, base, idx = f"model.layers.{cfg.num_layers + k}.", ("mtp",), (k,)
        out.append(_same(f"{pre}enorm.weight", (base + ("enorm", "scale"), idx), (D,)))
        out.append(_same(f"{pre}hnorm.weight", (base + ("hnorm", "scale"), idx), (D,)))
        out.append(_linear(f"{pre}eh_proj.weight", (base + ("eh_proj", "kernel"), idx), 2 * D, D))
        out += _attention(cfg, pre, base + ("layer",), idx)
        out += _moe(cfg, pre, base + ("layer",), idx, layout)
        out.append(_same(f"{pre}shared_head.norm.weight", (base + ("final_norm", "scale"), idx), (D,)))
    return out


def ignorable_keys(cfg: ModelConfig, shapes: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Present tensors that carry nothing c2jax needs, with the reason: the MTP layers' copies of the
    shared embedding/head, RoPE ``inv_freq`` buffers, and the zero-sized ``shared_experts``
    transformers creates when ``n_shared_experts == 0``."""
    out = {k: "MTP copy of the shared embedding / LM head" for k in mtp_shared_keys(cfg) if k in shapes}
    for k in shapes:
        if k.endswith(".rotary_emb.inv_freq"):  # stored by some older HF exports
            out[k] = "RoPE frequency buffer (recomputed from the config)"
    if not cfg.moe.n_shared_experts:
        for k, shp in shapes.items():
            if ".mlp.shared_experts." in k and int(np.prod(shp)) == 0:
                out[k] = "zero-sized shared expert (n_shared_experts == 0)"
    return out


def detect_layout(keys: Any) -> str:
    """'fused' if any key is a transformers-5 fused expert tensor, else 'per_expert'."""
    return "fused" if any(k.endswith("mlp.experts.gate_up_proj") for k in keys) else "per_expert"


# ---- tree helpers -----------------------------------------------------------------------------

def _leaf(tree: Mapping[str, Any], path: Path) -> Any:
    for p in path:
        tree = tree[p]
    return tree


# Leaves kept in float32 whatever the parameter dtype, as transformers does
# (`_keep_in_fp32_modules_strict = ["e_score_correction_bias", "gate.weight"]`): the router's
# selection-only bias holds small corrections that bfloat16 would round away.
FP32_LEAVES = (("router", "kernel"), ("router", "bias"))


def leaf_dtype(path: Path, cfg: ModelConfig, dtype: Any = None) -> np.dtype:
    """dtype of a loaded parameter: float32 for `FP32_LEAVES`, else `dtype` or `cfg.param_dtype`."""
    if tuple(path[-2:]) in FP32_LEAVES:
        return np.dtype(np.float32)
    return np_dtype(dtype) if dtype is not None else np_dtype(cfg.param_dtype)


def empty_params(cfg: ModelConfig, dtype: Any = None) -> dict:
    """Uninitialised numpy arrays shaped like `param_specs(cfg)` (filled slot by slot when loading)."""

    def build(t: Any, path: Path) -> Any:
        if isinstance(t, ParamSpec):
            return np.empty(t.shape, leaf_dtype(path, cfg, dtype))
        return {k: build(v, path + (k,)) for k, v in t.items()}

    return build(param_specs(cfg), ())


def np_dtype(name: Any) -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if str(name) == "bfloat16" else np.dtype(name)


def _fmt_list(names: Sequence[str], limit: int = 30) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_keys(expected: Sequence[str], present: Any, ignored: Any = ()) -> None:
    """Raise `CheckpointError` listing missing and unexpected tensor names (unexpected = not expected, not ignored)."""
    exp, pres = set(expected), set(present)
    missing = exp - pres
    unexpected = pres - exp - set(ignored)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s): {_fmt_list(list(missing))}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensor(s): {_fmt_list(list(unexpected))}")
        raise CheckpointError("checkpoint does not match the config; " + "; ".join(parts))


def fill_params(cfg: ModelConfig, plan: Sequence[Entry], get: Callable[[str], np.ndarray],
                dtype: Any = None) -> dict:
    """Build the parameter tree by fetching each HF tensor once with `get(key)` (streaming: one tensor live)."""
    params = empty_params(cfg, dtype)
    filled = 0
    for ent in plan:
        x = get(ent.key)
        if tuple(x.shape) != ent.shape:
            raise CheckpointError(f"tensor {ent.key!r} has shape {tuple(x.shape)}, expected {ent.shape} from the config")
        for (path, idx), y in zip(ent.slots, ent.to_ours(x)):
            dst = _leaf(params, path)
            if dst[idx].shape != y.shape:  # a plan bug, not a checkpoint problem
                raise AssertionError(f"{ent.key}: slot {path}{idx} shape {dst[idx].shape} != {y.shape}")
            dst[idx] = y
            filled += y.size
        del x
    total = sum(int(np.prod(s.shape)) for s in _spec_leaves(param_specs(cfg)))
    if filled != total:  # every element written exactly once, or the plan is wrong
        raise AssertionError(f"key plan filled {filled} of {total} parameter elements")
    return params


def _spec_leaves(t: Any) -> Iterator[ParamSpec]:
    if isinstance(t, ParamSpec):
        yield t
    else:
        for v in t.values():
            yield from _spec_leaves(v)


def params_from_hf_state_dict(sd: Mapping[str, np.ndarray], cfg: ModelConfig, *,
                              layout: Optional[str] = None, dtype: Any = None,
                              strict: bool = True) -> dict:
    """Parameter tree (numpy arrays, `cfg.param_dtype` unless `dtype`; router float32, see `FP32_LEAVES`)
    from an HF DeepSeek-V3 state dict.

    `layout` defaults to the one the keys use. With `strict`, missing or unexpected tensors raise
    `CheckpointError` listing them (tensors in `ignorable_keys` are allowed and skipped).
    """
    layout = layout or detect_layout(sd.keys())
    plan = key_plan(cfg, layout)
    if strict:
        shapes = {k: np.shape(v) for k, v in sd.items()}
        check_keys([e.key for e in plan], sd.keys(), ignored=ignorable_keys(cfg, shapes))

    def get(k: str) -> np.ndarray:
        if k not in sd:
            raise CheckpointError(f"missing tensor {k!r}")
        return np.asarray(sd[k])

    return fill_params(cfg, plan, get, dtype)


def hf_state_dict_from_params(params: Mapping[str, Any], cfg: ModelConfig, layout: str = "per_expert",
                              dtype: Any = None, mtp_shared_copies: bool = True) -> dict[str, np.ndarray]:
    """HF DeepSeek-V3 state dict (numpy, params' dtype unless `dtype`; `FP32_LEAVES` stay float32) from a tree.

    With `mtp_shared_copies` the MTP layers also get ``embed_tokens`` and ``shared_head.head``
    copies, as in the public DeepSeek-V3 checkpoint (vLLM/SGLang MTP loaders read them).
    """
    return dict(iter_hf_tensors(params, cfg, layout, dtype, mtp_shared_copies))


def iter_hf_tensors(params: Mapping[str, Any], cfg: ModelConfig, layout: str = "per_expert",
                    dtype: Any = None, mtp_shared_copies: bool = True) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(hf_key, array)` one at a time (what `save_pretrained` streams into shards)."""
    dt = np_dtype(dtype) if dtype is not None else None
    for ent in key_plan(cfg, layout):
        ys = [np.asarray(_leaf(params, path)[idx]) for path, idx in ent.slots]
        x = np.ascontiguousarray(ent.to_hf(ys))
        if x.shape != ent.shape:
            raise CheckpointError(f"parameter for {ent.key!r} has shape {x.shape}, expected {ent.shape}")
        keep32 = any(tuple(path[-2:]) in FP32_LEAVES for path, _ in ent.slots)
        want = np.dtype(np.float32) if keep32 and dt is not None else dt
        yield ent.key, (x.astype(want) if want is not None and x.dtype != want else x)
    if mtp_shared_copies:
        for k in range(cfg.mtp_depth):
            pre = f"model.layers.{cfg.num_layers + k}."
            emb = np.asarray(params["embed"]["embedding"])
            head = _t(np.asarray(params["lm_head"]["kernel"]))
            for key, x in ((f"{pre}embed_tokens.weight", emb), (f"{pre}shared_head.head.weight", head)):
                yield key, (x.astype(dt) if dt is not None and x.dtype != dt else np.ascontiguousarray(x))
