"""The DeepSeek-V3 / Kimi-K2 MoE model as pure JAX functions.

    from c2jax.model import init, apply, init_cache, preset
    cfg = preset("tiny"); params = init(cfg, jax.random.key(0))
    out = apply(params, tokens, cfg)          # logits, mtp_logits, router_scores, routes, ...

Parameter tree and logical axes: params_spec.py. Cache API: cache.py. MoE settings: moe.py.
Imports are lazy so `import c2jax.model.config` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelConfig": "c2jax.model.config",
    "preset": "c2jax.model.config",
    "count_params": "c2jax.model.config",
    "count_active_params": "c2jax.model.config",
    "param_specs": "c2jax.model.params_spec",
    "logical_axes": "c2jax.model.params_spec",
    "trainable_mask": "c2jax.model.params_spec",
    "init": "c2jax.model.transformer",
    "apply": "c2jax.model.transformer",
    "init_cache": "c2jax.model.cache",
    "reset_rows": "c2jax.model.cache",
    "update_router_bias": "c2jax.model.moe_router",
    "MOE_IMPLS": "c2jax.model.moe_impls",
    "from_pretrained": "c2jax.model.hf.io",
    "save_pretrained": "c2jax.model.hf.io",
    "CheckpointError": "c2jax.model.hf.config",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'c2jax.model' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
