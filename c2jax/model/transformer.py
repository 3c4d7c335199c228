"""The DeepSeek-V3 / Kimi-K2 decoder as two pure functions over the params_spec tree.

    params = init(cfg, rng)                       # jit-compiled; normal(initializer_range) kernels,
                                                  # ones for norm scales, zeros for router biases;
                                                  # cfg.param_dtype, router kernel/bias float32
    out = apply(params, tokens, cfg, *, segment_ids=None, positions=None, cache=None, routes=None)

`apply` returns a dict:
    logits          [B, S, V] float32
    mtp_logits      [mtp_depth, B, S, V] float32 (see mtp.py), or None (mtp_depth 0 or a cache)
    hidden          [B, S, D] final-normed hidden states
    router_scores   [n_moe_layers, B, S, E] float32 sigmoid scores (unbiased)
    routes          [B, S, n_moe_layers, top_k] int32 experts used by every token (sorted by
                    biased score when routed; as given, or after the plausibility check, when replayed)
    expert_counts   [n_moe_layers, E] int32 assignments of valid tokens (before capacity drops)
    mtp_expert_counts [mtp_depth, E] int32 or None
    dropped_fraction [n_moe_layers] float32 (capacity impl; 0 for dropless)
    replaced_fraction [n_moe_layers] float32 (router replay plausibility replacements)
    balance_loss    scalar: seq_aux_loss_coef * mean over MoE layers (main + MTP) of the
                    sequence-wise balance loss (0 when the coefficient is 0)
    cache           the updated cache (see cache.py) or None

Arguments:
* tokens [B, S] int.
* segment_ids [B, S] int: packed sequences; a token attends only to earlier tokens with the same
  id; id 0 marks padding (excluded from expert counts and the balance loss). Without a cache,
  default positions restart at 0 at every segment start. With a cache see cache.py.
* positions [B, S] int: RoPE positions (override the defaults).
* cache: from `init_cache`; see cache.py for prefill/decode semantics.
* routes [B, S, n_moe_layers, top_k] int: router replay (moe_router.replay_routes).

Layers of each kind are stacked and run with `lax.scan` (compile time independent of depth);
`SCAN_UNROLL` is the scan's `unroll` (1: a loop; True: straight-line code, for shallow models).
Compute dtype is cfg.dtype (params are cast at use); norms statistics, router, softmax and
logits are float32.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig
from c2jax.model.mla import mla
from c2jax.model.moe import moe_block
from c2jax.model.mtp import mtp_forward
from c2jax.model.norms import dense, rms_norm, swiglu_mlp
from c2jax.model.params_spec import ParamSpec, param_specs
from c2jax.model.rope import rope_cos_sin

# ---- init ----------------------------------------------------------------------------------

SCAN_UNROLL: Union[int, bool, str] = 1  # lax.scan unroll of the layer loops (benchmarks/model_step.py A/B);
# "python": a Python loop over the layers (no scan, so no stacked buffers for the backward's residuals)


def _layer_loop(step: Callable, h: jax.Array, xs, n: int):
    """`jax.lax.scan(step, h, xs, unroll=SCAN_UNROLL)`, or with SCAN_UNROLL == "python" the same
    loop written out in Python (per-layer slices of xs, outputs stacked on a leading axis)."""
    if SCAN_UNROLL != "python":
        return jax.lax.scan(step, h, xs, unroll=SCAN_UNROLL)
    ys = []
    for i in range(n):
        h, y = step(h, jax.tree.map(lambda x: x[i], xs))
        ys.append(y)
    return h, jax.tree.map(lambda *a: jnp.stack(a), *ys)


# Kept in float32 whatever param_dtype is (as transformers' `_keep_in_fp32_modules_strict` and our
# HF loader do): router scores decide routing, and the bias moves by tiny aux-loss-free steps.
FP32_LEAVES = (("router", "kernel"), ("router", "bias"))


def _leaf_dtype(path: tuple, cfg: ModelConfig):
    return jnp.dtype(jnp.float32) if tuple(path[-2:]) in FP32_LEAVES else jnp.dtype(cfg.param_dtype)


_FLAT_INIT_MAX = 1 << 28  # below this many normal-initialised numbers, draw them in one call


def _init_impl(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Draw every leaf of param_specs(cfg). Small models draw all normal leaves from one flat
    `jax.random.normal` call and slice it (XLA CPU compiles one sampler instead of one per leaf:
    seconds saved per config); large ones (e.g. kimi_k2) draw per leaf, which shards cleanly."""
    specs = param_specs(cfg)
    with_path, treedef = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, ParamSpec))
    leaves = [s for _, s in with_path]
    dtypes = [_leaf_dtype(tuple(k.key for k in path), cfg) for path, _ in with_path]
    sizes = [math.prod(s.shape) for s in leaves]
    n_normal = sum(n for s, n in zip(leaves, sizes) if s.init == "normal")
    flat = None
    if n_normal <= _FLAT_INIT_MAX:
        flat = jax.random.normal(rng, (n_normal,), jnp.float32)
    keys = jax.random.split(rng, len(leaves))
    out, offset = [], 0
    for spec, n, key, dt in zip(leaves, sizes, keys, dtypes):
        if spec.init == "ones":
            out.append(jnp.ones(spec.shape, dt))
        elif spec.init == "zeros":
            out.append(jnp.zeros(spec.shape, dt))
        else:
            z = (flat[offset:offset + n].reshape(spec.shape) if flat is not None
                 else jax.random.normal(key, spec.shape, jnp.float32))
            offset += n
            out.append((z * cfg.initializer_range).astype(dt))
    return jax.tree_util.tree_unflatten(treedef, out)


@functools.lru_cache(maxsize=16)
def _init_jit(cfg: ModelConfig):
    return jax.jit(functools.partial(_init_impl, cfg))


def init(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Random parameters for `cfg` (tree = params_spec.param_specs(cfg)); jit-compiled."""
    return _init_jit(cfg)(rng)


# ---- apply ---------------------------------------------------------------------------------


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of each token within its segment. [B, S] -> [B, S] int32."""
    s = segment_ids.shape[1]
    idx = jnp.arange(s, dtype=jnp.int32)[None]
    start = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                             segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    seg_start = jax.lax.cummax(jnp.where(start, idx, 0), axis=1)
    return idx - seg_start


def transformer_block(p: dict, h: jax.Array, cos, sin, mask, cfg: ModelConfig, layer_cache, slots, valid, routes,
                      moe: bool, attend_fn=None, experts_fn=None):
    """One pre-norm decoder block. Returns (h, new_layer_cache, moe stats or None)."""
    a, new_cache = mla(p["attn"], rms_norm(h, p["attn_norm"]["scale"], cfg.rms_norm_eps), cos, sin, mask,
                       cfg, layer_cache, slots, attend_fn)
    h = h + a
    x = rms_norm(h, p["mlp_norm"]["scale"], cfg.rms_norm_eps)
    if moe:
        y, stats = moe_block(p["moe"], x, cfg, valid, routes, experts_fn)
    else:
        y, stats = swiglu_mlp(p["mlp"], x), None
    return h + y, new_cache, stats


def lm_head_logits(params: dict, hidden: jax.Array) -> jax.Array:
    """f32 logits of final-normed hidden states: [..., D] -> [..., V]. `apply` computes its logits
    with this; the RL learner calls it on the positions it needs only (an unused full `logits`
    output of a jitted `apply` is then removed by XLA)."""
    return dense(hidden, params["lm_head"]["kernel"]).astype(jnp.float32)


def apply(params: dict, tokens: jax.Array, cfg: ModelConfig, *, segment_ids: Optional[jax.Array] = None,
          positions: Optional[jax.Array] = None, cache: Optional[dict] = None,
          routes: Optional[jax.Array] = None, attend_fn: Optional[Callable] = None,
          experts_fn: Optional[Callable] = None) -> dict:
    """Forward pass (see module docstring for arguments and outputs). Pure; jit it with cfg static.

    `attend_fn` / `experts_fn` swap the attention (cache-free path) and the routed-expert
    computation for implementations with the same signatures (`mla.attend_expanded`,
    `moe_impls.MOE_IMPLS` entries); `c2jax.model.parallel.sharding` passes the context-parallel attention
    and the expert-parallel dispatch here. None = the single-device defaults."""
    b, s = tokens.shape
    dt = jnp.dtype(cfg.dtype)
    valid = jnp.ones((b, s), bool) if segment_ids is None else segment_ids != 0
    if cache is None:
        slots = None
        causal = jnp.tril(jnp.ones((s, s), bool))[None]
        if segment_ids is not None:
            mask = causal & (segment_ids[:, :, None] == segment_ids[:, None, :])
            default_pos = segment_positions(segment_ids)
        else:
            mask = jnp.broadcast_to(causal, (b, s, s))
            default_pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None], (b, s))
    else:
        lengths = cache["lengths"]
        slots = lengths[:, None] + jnp.arange(s, dtype=jnp.int32)[None]  # [B, S]
        t = next(cache[k]["c_kv"].shape[2] for k in ("dense_layers", "moe_layers") if k in cache)
        mask = jnp.arange(t, dtype=jnp.int32)[None, None, :] <= slots[:, :, None]  # [B, S, T]
        default_pos = slots
    positions = default_pos if positions is None else positions
    cos, sin = rope_cos_sin(cfg.attention, positions)

    h = params["embed"]["embedding"][tokens].astype(dt)  # [B, S, D]
    new_cache = None if cache is None else {"lengths": cache["lengths"] + valid.sum(-1).astype(jnp.int32)}

    if cfg.n_dense_layers:
        def dense_step(h, xs):
            lp, lc = xs
            h, nc, _ = transformer_block(lp, h, cos, sin, mask, cfg, lc, slots, valid, None, moe=False,
                              attend_fn=attend_fn)
            return h, nc
        h, nc = _layer_loop(dense_step, h, (params["dense_layers"],
                                            None if cache is None else cache["dense_layers"]), cfg.n_dense_layers)
        if cache is not None:
            new_cache["dense_layers"] = nc

    n_moe = cfg.n_moe_layers
    moe_out = {}
    if n_moe:
        layer_routes = None if routes is None else jnp.moveaxis(routes, 2, 0)  # [L, B, S, k]

        def moe_step(h, xs):
            lp, lc, lr = xs
            h, nc, st = transformer_block(lp, h, cos, sin, mask, cfg, lc, slots, valid, lr, moe=True,
                               attend_fn=attend_fn, experts_fn=experts_fn)
            return h, (nc, st)
        h, (nc, st) = _layer_loop(moe_step, h, (params["moe_layers"],
                                                None if cache is None else cache["moe_layers"],
                                                layer_routes), n_moe)
        if cache is not None:
            new_cache["moe_layers"] = nc
        moe_out = st

    hidden = rms_norm(h, params["final_norm"]["scale"], cfg.rms_norm_eps)
    logits = lm_head_logits(params, hidden)  # [B, S, V]

    e, k = cfg.moe.n_routed_experts, cfg.moe.top_k
    out = {
        "logits": logits,
        "hidden": hidden,
        "router_scores": moe_out.get("scores", jnp.zeros((0, b, s, e), jnp.float32)),
        "routes": (jnp.moveaxis(moe_out["routes"], 0, 2) if n_moe else jnp.zeros((b, s, 0, k), jnp.int32)),
        "expert_counts": moe_out.get("counts", jnp.zeros((0, e), jnp.int32)),
        "dropped_fraction": moe_out.get("dropped", jnp.zeros((0,), jnp.float32)),
        "replaced_fraction": moe_out.get("replaced", jnp.zeros((0,), jnp.float32)),
        "mtp_logits": None,
        "mtp_expert_counts": None,
        "cache": new_cache,
    }
    balance_terms = [moe_out["balance_loss"]] if n_moe else []
    if cfg.mtp_depth and cache is None:
        def block_fn(lp, x):
            x, _, st = transformer_block(lp, x, cos, sin, mask, cfg, None, None, valid, None, moe=True,
                              attend_fn=attend_fn, experts_fn=experts_fn)
            return x, st
        mtp_logits, mtp_counts, mtp_bal = mtp_forward(params, hidden, tokens, cfg, block_fn)
        out["mtp_logits"], out["mtp_expert_counts"] = mtp_logits, mtp_counts
        balance_terms.append(mtp_bal)
    if cfg.moe.seq_aux_loss_coef > 0 and balance_terms:
        out["balance_loss"] = cfg.moe.seq_aux_loss_coef * jnp.concatenate(balance_terms).mean()
    else:
        out["balance_loss"] = jnp.zeros((), jnp.float32)
    return out
