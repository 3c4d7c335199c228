"""The ``rl`` stage on the asynchronous services, end to end (`experiments/run.py`, rl_quickstart
smoke preset, ``--config.rl.services.enabled=True``), slow: with ``max_staleness = 0`` the final
parameters equal the synchronous stage's bit for bit, the ledger is complete, and kill -9 mid-RL +
rerun resumes from the checkpoint (reconciler, ledger, group checkpoints) to the same parameters."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from _envs_common import needs_bwrap
from _rl_smoke_common import _cmd, _env, _param_hash, kill9_after_first_step_checkpoint

pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.timeout(3600)]

EXTRA = ("--config.rl.steps=3", "--config.rl.eval.enabled=False", "--config.rl.tasks.n_train=6", "--config.seed=3")
SERVICES = ("--config.rl.services.enabled=True",)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("rl_async_cache")


def _run(workdir, cache, *extra):
    r = subprocess.run(_cmd(workdir, cache, *EXTRA, *extra), capture_output=True, text=True, timeout=2400, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return json.load(open(os.path.join(workdir, "summary.json")))


def test_services_stage_equals_synchronous_stage_and_survives_kill9(tmp_path, cache):
    _run(tmp_path / "sync", cache)
    summary = _run(tmp_path / "async", cache, *SERVICES)
    assert _param_hash(tmp_path / "async") == _param_hash(tmp_path / "sync")
    sv = summary["rl"]["services"]
    assert sv["ledger"]["open"] == {} and sv["ledger"]["trained"] + sum(sv["ledger"]["dropped"].values()) == 3 * 2 * 2
    assert set(sv["staleness_hist"]) <= {"0", 0}
    # kill -9 right after the first step checkpoint, rerun: the services resume from it
    ck = tmp_path / "b" / "rl" / "checkpoints"
    steps = kill9_after_first_step_checkpoint(_cmd(tmp_path / "b", cache, *EXTRA, *SERVICES), ck)
    assert steps and max(int(s) for s in steps) < 3, steps
    again = _run(tmp_path / "b", cache, *SERVICES)
    assert _param_hash(tmp_path / "b") == _param_hash(tmp_path / "async")
    assert again["rl"]["services"]["ledger"]["open"] == {}
