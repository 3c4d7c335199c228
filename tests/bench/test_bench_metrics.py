"""pass@k against brute-force enumeration and the closed form; bootstrap CIs; held-out export."""
from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from c2jax.bench.metrics import bootstrap_ci, mean_pass_at_k, median, pass_at_k, pass_at_k_bruteforce


def test_pass_at_k_equals_bruteforce_over_every_small_case():
    for n in range(1, 9):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                brute = pass_at_k_bruteforce(outcomes, k)
                closed = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)
                assert brute == pytest.approx(closed, abs=1e-12)


def test_pass_at_k_brute_force_is_order_independent_and_large_n_stable():
    rng = random.Random(0)
    outs = [rng.random() < 0.3 for _ in range(10)]
    for perm in itertools.islice(itertools.permutations(outs), 5):
        assert pass_at_k_bruteforce(list(perm), 3) == pytest.approx(pass_at_k(10, sum(outs), 3))
    # the product form stays finite where binomials overflow floats
    v = pass_at_k(2000, 3, 100)
    assert 0 < v < 1 and v == pytest.approx(1 - math.comb(1997, 100) / math.comb(2000, 100), rel=1e-9)
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2) and pass_at_k(5, 4, 2) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    assert mean_pass_at_k([(4, 1), (4, 4)], 1) == pytest.approx(0.625)


def test_bootstrap_ci_brackets_the_mean_and_shrinks_with_n():
    rng = random.Random(1)
    small = [float(rng.random() < 0.5) for _ in range(20)]
    big = [float(rng.random() < 0.5) for _ in range(2000)]
    lo_s, hi_s = bootstrap_ci(small, seed=0)
    lo_b, hi_b = bootstrap_ci(big, n_boot=500, seed=0)
    assert lo_s <= sum(small) / 20 <= hi_s and lo_b <= sum(big) / 2000 <= hi_b
    assert (hi_b - lo_b) < (hi_s - lo_s)
    # binomial standard error check: the 95% width is ~ 2 * 1.96 * sqrt(p(1-p)/n)
    p = sum(big) / len(big)
    assert (hi_b - lo_b) == pytest.approx(2 * 1.96 * math.sqrt(p * (1 - p) / len(big)), rel=0.2)
    assert bootstrap_ci([1.0] * 5) == (1.0, 1.0)
    assert bootstrap_ci(small, seed=3) == bootstrap_ci(small, seed=3)
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5


def test_held_out_export_feeds_the_corpus_hook(tmp_path):
    from c2jax.data.corpus import read_held_out_file
    from c2jax.envs.synth import heldout
    from c2jax.bench.suites import SUITES

    path = heldout.write(str(tmp_path / "heldout.json"))
    names = read_held_out_file(path)
    assert names == heldout.held_out_packages() and "markdown" in names
    assert set(SUITES["c2bench"].eval_codebases) == set(heldout.EVAL_PACKAGES)
    assert json.load(open(path))["packages"] == names


def test_unbuildable_packages_are_skipped_with_the_reason_in_the_build_report(tmp_path):
    from c2jax.bench.build import build_suite
    from c2jax.envs.synth import pypi
    from c2jax.envs.synth.sources import sdist_codebase

    cache = tmp_path / "cache"
    cache.mkdir()
    toolz = pypi.by_name("toolz")
    (cache / toolz.filename).write_bytes(b"not the pinned sdist")  # a corrupted download
    tasks, stats, report = build_suite("c2bench", str(tmp_path / "out"), pypi_cache=str(cache),
                                       codebases=["toolz", "idna"])
    assert tasks == [] and stats["n_codebases"] == 0
    for name in ("toolz", "idna"):
        assert "not in the PyPI cache" in report["codebases"][name]["error"]
    assert json.load(open(tmp_path / "out" / "build_report.json"))["problems"] == report["problems"] != []
    with pytest.raises(ValueError, match="sha256"):
        sdist_codebase("toolz", toolz.version, str(cache / toolz.filename), toolz.sha256, "BSD-3-Clause",
                       str(tmp_path / "cb"))
