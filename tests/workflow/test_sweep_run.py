"""`experiments/sweep.py` end to end: real `run.py` cells (the tiny smoke stage, shrunk) in subprocesses.

Default: a good cell and a crashing cell (lr=1e30 -> non-finite loss at run time, past validation)
side by side: the crash is named with its log, the good cell's row and plot are kept, exit status 1;
a rerun finds the good cell finished and runs nothing. Slow: SIGKILL the sweep after its first cell
finishes, rerun, only the missing cells run. Ray (``-m ray``): the same sweep as Ray tasks.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from c2jax.workflow import results
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT
# The smallest smoke run: 2 layers (1 dense + 1 MoE), no MTP, 16 tokens x 1 row, 2 steps.
SMALL = ["--config.model.num_layers=2", "--config.model.mtp_depth=0", "--config.smoke.seq_len=16",
         "--config.smoke.batch_size=1", "--config.smoke.steps=2"]


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env["XLA_FLAGS"] = ""  # one CPU device per cell
    return env


def _sweep_cmd(workdir, *args) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--config",
            os.path.join(ROOT, "experiments", "configs", "tiny.py"), "--workdir", str(workdir), *SMALL, *args]


def _sweep(workdir, *args, timeout=900):
    return subprocess.run(_sweep_cmd(workdir, *args), capture_output=True, text=True, timeout=timeout, env=_env(),
                          cwd=ROOT)


def _attempts(log_path) -> int:
    return open(log_path).read().count("\n=== exit status")


def test_crashing_cell_is_named_others_kept_and_rerun_skips_finished(tmp_path):
    work = tmp_path / "sw"
    r = _sweep(work, "--grid", "smoke.learning_rate=[1e-3,1e30]", "--max-parallel", "2", "--metric", "smoke.final_loss")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    bad_log = work / "cells" / "smoke.learning_rate=1e30__seed=0" / "run.log"
    assert f"FAILED smoke.learning_rate=1e30__seed=0: exit status 1; log: {bad_log}" in r.stdout
    assert "non-finite loss" in bad_log.read_text()
    rows = results.read_csv(str(work / "results.csv"))
    assert [row["cell"] for row in rows] == ["smoke.learning_rate=1e-3__seed=0"]
    assert float(rows[0]["smoke.final_loss"]) < float(rows[0]["smoke.initial_loss"])
    assert (work / "smoke.final_loss.png").stat().st_size > 1000
    good = work / "cells" / "smoke.learning_rate=1e-3__seed=0"
    assert (good / "DONE.json").exists() and not (bad_log.parent / "DONE.json").exists()
    before = (good / "run.log").read_text()
    r2 = _sweep(work, "--grid", "smoke.learning_rate=[1e-3]", "--metric", "smoke.final_loss")
    assert r2.returncode == 0, r2.stdout + r2.stderr[-3000:]
    assert "1 already finished, 0 to run" in r2.stdout
    assert (good / "run.log").read_text() == before  # not rerun


@pytest.mark.slow
def test_sigkill_halfway_then_rerun_runs_only_missing_cells(tmp_path):
    work = tmp_path / "sw"
    args = ("--grid", "smoke.learning_rate=[1e-3,2e-3,3e-3]", "--max-parallel", "1", "--metric", "smoke.final_loss")
    p = subprocess.Popen(_sweep_cmd(work, *args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                         cwd=ROOT)
    deadline = time.time() + 600
    while time.time() < deadline and not list(work.glob("cells/*/DONE.json")):
        assert p.poll() is None, "sweep ended before it was killed"
        time.sleep(0.5)
    time.sleep(2.0)  # the second cell is now running
    p.send_signal(signal.SIGKILL)
    p.wait()
    first = list(work.glob("cells/*/DONE.json"))
    assert len(first) == 1
    first_cell = first[0].parent
    time.sleep(1.0)  # the killed sweep's running cell died with it (PR_SET_PDEATHSIG)
    others = [c for c in work.glob("cells/*") if c != first_cell]
    assert all(not (c / "DONE.json").exists() for c in others)
    r = _sweep(work, *args)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "1 already finished, 2 to run" in r.stdout
    assert _attempts(first_cell / "run.log") == 1
    assert len(results.read_csv(str(work / "results.csv"))) == 3


@pytest.mark.ray
@pytest.mark.timeout(1800)
def test_ray_backend_same_results_path(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="ray not installed (pip install -e '.[ray]')")
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "300")  # a loaded CI machine starts the raylet slowly
    work = tmp_path / "sw"
    r = _sweep(work, "--grid", "smoke.learning_rate=[1e-3,1e30]", "--backend", "ray", "--max-parallel", "2",
               "--metric", "smoke.final_loss")
    if r.returncode == 2 and "could not start or reach Ray" in r.stderr:
        assert not list(work.glob("cells/*/run.log"))  # nothing ran
        pytest.skip("the local Ray node did not come up on this machine (ray-project/ray#65983 under load)")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "(ray, max 2 at a time)" in r.stdout and "FAILED smoke.learning_rate=1e30__seed=0" in r.stdout
    rows = results.read_csv(str(work / "results.csv"))
    assert [row["cell"] for row in rows] == ["smoke.learning_rate=1e-3__seed=0"]
    r2 = _sweep(work, "--grid", "smoke.learning_rate=[1e-3]", "--backend", "ray")
    assert r2.returncode == 0 and "1 already finished, 0 to run" in r2.stdout
