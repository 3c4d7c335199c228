"""Shared fixtures for tests/test_{tasks,bench,grading}_*.py (not collected: no test_ prefix).

One private environments state directory and one c2bench-mini build per test session, shared by
every module that imports these fixtures (module-level cache: an imported session fixture may be
instantiated once per importing module, the build must not be).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

import pytest


_STATE: dict = {}


@atexit.register
def _cleanup() -> None:  # the state directory holds environment images (~100 MB): never leave them
    from c2jax.envs.sandbox import flush_cleanup

    flush_cleanup(30.0)  # closed sandboxes' mounts and files first (the janitor thread)
    for key in ("state", "mini"):
        path = _STATE.get(key)
        path = path[0] if isinstance(path, tuple) else path
        if path:
            shutil.rmtree(path, ignore_errors=True)


from _envs_common import BWRAP_PROBLEM, needs_bwrap  # noqa: E402,F401  (one bwrap probe for all areas)
DATA = os.path.join(os.path.dirname(__file__), "data", "bench")


def state_dir() -> str:
    """The session's private environments state directory."""
    if "state" not in _STATE:  # the session-wide dir from tests/conftest.py when there is one
        _STATE["state"] = os.environ.get("C2JAX_ENVS_DIR") or tempfile.mkdtemp(prefix="c2jax_bench_state_")
    return _STATE["state"]


@contextlib.contextmanager
def using_state():
    """C2JAX_ENVS_DIR points at our state directory inside the block (other test areas set theirs)."""
    old = os.environ.get("C2JAX_ENVS_DIR")
    os.environ["C2JAX_ENVS_DIR"] = state_dir()
    try:
        yield state_dir()
    finally:
        if old is None:
            os.environ.pop("C2JAX_ENVS_DIR", None)
        else:
            os.environ["C2JAX_ENVS_DIR"] = old


@pytest.fixture
def bench_state():
    """Function-scoped: every test of these modules runs with our state directory."""
    with using_state() as d:
        yield d


def mini() -> tuple:
    """(out_dir, tasks, stats, report) of c2bench-mini, built once per session."""
    if "mini" not in _STATE:
        from c2jax.bench.build import build_suite

        out = tempfile.mkdtemp(prefix="c2bench_mini_")
        with using_state():
            tasks, stats, report = build_suite("c2bench-mini", out, workers=2, seed=0)
        _STATE["mini"] = (out, tasks, stats, report)
    return _STATE["mini"]


@pytest.fixture
def mini_suite(bench_state):
    return mini()
