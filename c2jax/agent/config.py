"""The ``config.agent`` section: harness budgets, self-summarisation and tools, validated before compute.

    config.agent = agent_config_dict(max_turns=30, summary_trigger_tokens=40000,
                                     tools={"bash_only": True})
    harness_cfg = harness_config_from(config.agent)        # -> HarnessConfig

Keys are the fields of `HarnessConfig` (harness.py); ``tools`` holds the fields of `ToolConfig`
(tools.py): enabled / disabled tool names, bash_only, strict, caps.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from c2jax.config import Checker, ConfigError, register_validator, to_plain


def _harness_fields() -> dict[str, Any]:
    from c2jax.agent.harness import HarnessConfig

    return {f.name: f.default for f in dataclasses.fields(HarnessConfig)}


def agent_config_dict(**overrides: Any) -> ml_collections.ConfigDict:
    """A ``config.agent`` ConfigDict: HarnessConfig defaults plus `overrides` (tools as a dict)."""
    d = _harness_fields()
    d["tools"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(d["tools"]).items()}
    unknown = set(overrides) - set(d)
    if unknown:
        raise ConfigError([(f"agent.{k}", f"unknown key; known: {sorted(d)}") for k in sorted(unknown)])
    tools = dict(d["tools"], **dict(overrides.pop("tools", {}) or {}))
    d.update(overrides, tools=tools)
    return ml_collections.ConfigDict(d, type_safe=False)


@register_validator("agent")
def validate_agent(check: Checker, section: Any, full: Any) -> None:
    d = dict(to_plain(section) or {})
    known = _harness_fields()
    for k in d:
        if k not in known:
            check.error(k, f"unknown key; known: {sorted(known)}")
    try:
        harness_config_from(d)
    except ConfigError as e:
        for _, msg in e.problems:
            check.error("agent", msg)


def harness_config_from(section: Any):
    """`HarnessConfig` from a ``config.agent`` ConfigDict/dict; bad values raise ConfigError."""
    from c2jax.agent.harness import HarnessConfig
    from c2jax.agent.tools import ToolConfig

    d = dict(to_plain(section) or {})
    known = _harness_fields()
    d = {k: v for k, v in d.items() if k in known}
    try:
        d["tools"] = ToolConfig.from_dict(d.get("tools"))
        return HarnessConfig(**d)
    except (ValueError, TypeError) as e:
        raise ConfigError([("agent", str(e))]) from None
