"""The ``config.sampling`` section: engine shape and options, validated before any compute.

    config.sampling = sampling_config_dict(max_slots=8, max_len=2048)
    engine = engine_from_config(config, params, tokenizer=tok)

Keys are the fields of `EngineConfig` (engine.py): max_slots, max_len, prefill_chunk,
prefix_reuse, min_prefix_reuse, continuous, recompute_cache_on_update, moe_impl, cache_dtype,
spec_decode, seed. The sampler's numerics come from ``config.model`` (``dtype``,
``moe.precision``), so it runs in the same precision as the trainer's forward.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from c2jax.config import Checker, ConfigError, register_validator

def _fields() -> dict[str, Any]:
    from c2jax.sampling.engine import EngineConfig

    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def sampling_config_dict(**overrides: Any) -> ml_collections.ConfigDict:
    """A ``config.sampling`` ConfigDict: EngineConfig defaults plus `overrides`."""
    d = _fields()
    unknown = set(overrides) - set(d)
    if unknown:
        raise ConfigError([(f"sampling.{k}", f"unknown key; known: {sorted(d)}") for k in sorted(unknown)])
    d.update(overrides)
    return ml_collections.ConfigDict(d, type_safe=False)


@register_validator("sampling")
def validate_sampling(check: Checker, s: Any, full: Any) -> None:
    d = s.to_dict() if hasattr(s, "to_dict") else dict(s)
    known = _fields()
    for k in d:
        if k not in known:
            check.error(k, f"unknown key; known: {sorted(known)}")
    check.int_range(d, "max_slots", 1, optional=True)
    check.int_range(d, "max_len", 2, optional=True)
    check.int_range(d, "min_prefix_reuse", 1, optional=True)
    pc = check.int_range(d, "prefill_chunk", 16, optional=True)
    if pc is not None and pc & (pc - 1):
        check.error("prefill_chunk", f"must be a power of two >= 16, got {pc}")
    from c2jax.model.moe_impls import exact_moe_impls  # the registry decides; 'auto' picks one

    check.choice(d, "moe_impl", ["auto", *exact_moe_impls()], optional=True)
    if d.get("cache_dtype") is not None:
        check.choice(d, "cache_dtype", ("float32", "bfloat16"))
    for b in ("prefix_reuse", "continuous", "recompute_cache_on_update", "spec_decode"):
        if b in d and not isinstance(d[b], bool):
            check.error(b, f"must be a bool, got {d[b]!r}")
    model = None
    try:
        model = full["model"] if full is not None and "model" in full else None
    except (KeyError, TypeError):
        model = None
    if model is not None and d.get("spec_decode"):
        depth = model.get("mtp_depth", 0) if hasattr(model, "get") else getattr(model, "mtp_depth", 0)
        if not depth:
            check.error("spec_decode", "needs model.mtp_depth >= 1 (speculative decoding drafts with the MTP head)")
    if model is not None and isinstance(d.get("max_len"), int):
        mpe = model.get("max_position_embeddings") if hasattr(model, "get") else None
        if isinstance(mpe, int) and d["max_len"] > mpe:
            check.warn("max_len", f"{d['max_len']} exceeds model.max_position_embeddings={mpe}")


def engine_config_from(section: Any):
    """`EngineConfig` from a ``config.sampling`` ConfigDict/dict (validated)."""
    from c2jax.sampling.engine import EngineConfig

    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    check = Checker("sampling")
    validate_sampling(check, d, None)
    if check.problems:
        raise ConfigError(check.problems)
    return EngineConfig(**d)


def engine_from_config(config: Any, params: dict, *, tokenizer: Any = None, version: int = 0):
    """An `Engine` for ``config.model`` and ``config.sampling`` (defaults if the section is absent)."""
    from c2jax.model.config import ModelConfig
    from c2jax.sampling.engine import Engine, EngineConfig

    mc = ModelConfig.from_config(config["model"])
    ec = engine_config_from(config["sampling"]) if "sampling" in config else EngineConfig()
    return Engine(params, mc, ec, tokenizer=tokenizer, version=version)
