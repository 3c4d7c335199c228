"""The full c2bench build and oracle/null runs (slow; needs the PyPI cache filled by
`python -m c2jax.bench prefetch`). Run: python -m pytest -q -m slow tests/bench/test_bench_full.py

Same as the commands
    python -m c2jax.bench build --suite c2bench --out DIR
    python -m c2jax.bench run --suite DIR --policy oracle      (and --policy null)
"""
from __future__ import annotations

import os
import tempfile

import pytest

from _bench_common import needs_bwrap, using_state
from c2jax.envs.synth import pypi

pytestmark = [pytest.mark.slow, needs_bwrap]


@pytest.fixture(scope="module")
def full_suite():
    missing = [p.name for p in pypi.PACKAGES if pypi.cached_path(p) is None]
    if missing:
        pytest.skip(f"PyPI cache incomplete ({missing}); run `python -m c2jax.bench prefetch`")
    from c2jax.bench.build import build_suite

    out = tempfile.mkdtemp(prefix="c2bench_full_")
    with using_state():
        tasks, stats, report = build_suite("c2bench", out, workers=2, seed=0)
    return out, tasks, stats, report


def test_full_build_meets_the_mix(full_suite):
    _, tasks, stats, report = full_suite
    assert not report["problems"], report["problems"]
    n = len(tasks)
    assert n >= 200 and stats["n_codebases"] >= 8
    assert max(stats["codebases"].values()) <= 0.25 * n
    big = [t for t in tasks if t.category == "feature_deletion" and t.stats["lines_changed"] >= 50
           and t.stats["files_changed"] >= 2]
    assert len(big) >= 0.30 * n
    assert {t.split for t in tasks} == {"train", "eval"}
    by_split = {}
    for t in tasks:
        by_split.setdefault(t.codebase, set()).add(t.split)
    assert all(len(s) == 1 for s in by_split.values())  # split by codebase


def test_full_oracle_and_null(full_suite, tmp_path):
    from c2jax.bench.policies import make_policy
    from c2jax.bench.run import run_suite

    _, tasks, _, _ = full_suite
    with using_state():
        oracle = run_suite(tasks, make_policy("oracle"), str(tmp_path / "oracle"))
        null = run_suite(tasks, make_policy("null"), str(tmp_path / "null"))
    assert oracle["overall"]["pass@1"] == 1.0 and oracle["overall"]["masked_tasks"] == 0
    assert null["overall"]["pass@1"] == 0.0
    assert os.path.exists(tmp_path / "oracle" / "results.png")
