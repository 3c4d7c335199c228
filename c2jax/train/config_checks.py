"""Validators for the experiment-level config keys: `stages`, `seed`, `workdir`."""
from __future__ import annotations

from typing import Any

from c2jax.config import Checker, register_validator


@register_validator("stages")
def validate_stages(check: Checker, stages: Any, full: Any) -> None:
    from c2jax.train.stages import known_stages

    if isinstance(stages, str) or not hasattr(stages, "__iter__"):
        check.error("", f"must be a list of stage names from {known_stages()}, got {stages!r}")
        return
    stages = list(stages)
    if not stages:
        check.error("", "must name at least one stage")
    for s in stages:
        if s not in known_stages():
            check.error("", f"unknown stage {s!r}; known: {known_stages()}")


@register_validator("seed")
def validate_seed(check: Checker, seed: Any, full: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        check.error("", f"must be an integer >= 0, got {seed!r}")
