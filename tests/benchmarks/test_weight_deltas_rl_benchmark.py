"""benchmarks/weight_deltas_rl.py: bad arguments are refused before any run; (slow) on the smoke
preset's real RL stage the study reports bit-identical shares and delta sizes for Adam and Muon, and
the publish A/B's two arms roll out the same samples (so their step times differ only by publishing)."""
from __future__ import annotations

import functools
import importlib.util
import os

import pytest
from _envs_common import needs_bwrap
from _paths import REPO_ROOT  # noqa: E402

_PATH = os.path.join(REPO_ROOT, "benchmarks", "weight_deltas_rl.py")


@functools.lru_cache(maxsize=1)
def _bench():
    spec = importlib.util.spec_from_file_location("bench_weight_deltas_rl", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv", [["--optimizers", "sgd"], ["--lrs", "0"], ["--lrs", "x"], ["--ab-steps", "1"],
                                  ["--steps", "-1"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        _bench().parse_args(argv)
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
@needs_bwrap
def test_smoke_study_and_ab_on_the_real_rl_stage(tmp_path):
    cache = tmp_path / "cache"
    res = _bench().main(["--config", os.path.join(REPO_ROOT, "experiments", "configs", "rl_quickstart.py:smoke"),
                         "--lrs", "1e-3", "--steps", "3", "--ab-steps", "2", "--workdir", str(tmp_path / "w"),
                         "--out", str(tmp_path / "r.json"), f"--extra=--config.build.dir={cache}",
                         f"--extra=--config.data.dir={cache / 'data'}",
                         "--extra=--config.rl.tasks.n_train=6"])  # 3 steps x 2 tasks: step 3 is the first delta
    assert [c["optimizer"] for c in res["study"]] == ["adamw", "muon"]
    for cell in res["study"]:
        assert cell["delta_steps"] >= 1
        assert 0.0 <= cell["identical_share_bf16"] < 1.0 and 0.0 < cell["delta_over_raw"] < 1.0
    assert res["ab"]["same_rollouts"] is True and res["ab"]["step_s_on"] > 0 and (tmp_path / "r.json").exists()
