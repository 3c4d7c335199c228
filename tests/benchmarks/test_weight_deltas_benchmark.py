"""benchmarks/weight_deltas.py: bad arguments are refused before any compute; the dry run (slow: it
compiles the tiny model's train step) prints every section and rebuilds sha256-identical weights."""
from __future__ import annotations

import functools
import importlib.util
import os

import pytest
from _paths import REPO_ROOT  # noqa: E402

_PATH = os.path.join(REPO_ROOT, "benchmarks", "weight_deltas.py")


@functools.lru_cache(maxsize=1)
def _bench():
    spec = importlib.util.spec_from_file_location("bench_weight_deltas", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv", [["--ab-repeats", "4"], ["--lrs", "0"], ["--optimizers", "sgd"], ["--steps", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        _bench().parse_args(argv)
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_dry_run_prints_every_section(tmp_path, capsys):
    res = _bench().main(["--dry-run", "--out", str(tmp_path / "r.json"), "--compile-cache", ""])
    out = capsys.readouterr().out
    assert "per-step deltas" in out and "publish off vs on" in out and (tmp_path / "r.json").exists()
    (stats,) = res["stats"]
    assert stats["rebuild_sha256_identical"] and len(stats["rows"]) == 2
    assert all(0.0 <= r["identical_bf16"] <= 1.0 and r["delta_bytes"] > 0 for r in stats["rows"])
    assert res["ab"]["repeats"] >= 5 and res["ab"]["off_median_s"] > 0
