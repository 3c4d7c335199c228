"""Imports of the third-party reference implementations (the `torch` extra: torch, transformers,
accelerate, compressed-tensors) for parity tests. Not collected (no test_ prefix).

A missing reference FAILS the tests that need it, naming the package and the install command: CI
installs the extra, so a skip there would hide that parity was never checked. A machine without the
extra opts out explicitly with C2JAX_ALLOW_NO_TORCH=1 (the tests are then skipped, saying why).
The failure is per test (a mark enforced by tests/conftest.py), not a collection error that would
stop the rest of the suite.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

OPT_OUT_VAR = "C2JAX_ALLOW_NO_TORCH"
INSTALL = "pip install -e '.[test,torch]'"


def _problem(name: str, err: ImportError) -> str:
    return f"reference package {name!r} is missing ({err}); install the torch extra: {INSTALL}"


def import_references(*names: str) -> tuple[list[ModuleType | None], pytest.MarkDecorator]:
    """([module or None per name], a mark for the module's tests: fail/skip if any is missing)."""
    mods, problems = [], []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ImportError as e:
            mods.append(None)
            problems.append(_problem(name, e))
    return mods, pytest.mark.reference_required("; ".join(problems) or None)


def require_reference(name: str) -> ModuleType:
    """Import `name` inside a test: fails the test if it is missing (skips with the opt-out)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        check_reference_requirement(_problem(name, e))
        raise  # unreachable: the check fails or skips


def check_reference_requirement(problem: str | None, environ=os.environ) -> None:
    """Fail (or, with C2JAX_ALLOW_NO_TORCH=1, skip) a test whose reference package is missing."""
    if problem is None:
        return
    if environ.get(OPT_OUT_VAR) == "1":
        pytest.skip(f"{problem} ({OPT_OUT_VAR}=1)")
    pytest.fail(f"{problem}. To skip reference-parity tests on purpose set {OPT_OUT_VAR}=1.", pytrace=False)
