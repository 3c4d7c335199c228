"""`experiments/run.py` with the smoke stage, end to end in a subprocess: a tiny config trains
(loss falls, summary written), and bad configs exit with status 2 naming the key before compute."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT


def _run(args, tmp_path, timeout=300):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env["XLA_FLAGS"] = ""  # one CPU device is enough here
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"),
                           "--config", os.path.join(ROOT, "experiments", "configs", "tiny.py"),
                           "--workdir", str(tmp_path / "w"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_tiny_smoke_run_end_to_end(tmp_path):
    r = _run(["--config.smoke.steps=3", "--config.smoke.seq_len=32"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.load(open(tmp_path / "w" / "summary.json"))["smoke"]
    assert len(summary["losses"]) == 3
    assert summary["loss_decreased"] and summary["final_loss"] < summary["initial_loss"]
    assert abs(summary["initial_loss"] - summary["log_vocab"]) < 0.5  # starts near ln V


@pytest.mark.parametrize("override,key", [
    ("--config.model.moe.top_k=100", "model.moe.top_k"),
    ("--config.model.attention.kv_lora_rank=0", "model.attention.kv_lora_rank"),
    ("--config.model.moe.impl=magic", "model.moe.impl"),
    ("--config.smoke.seq_len=1", "smoke.seq_len"),
    ("--config.smoke.learning_rate=-1.0", "smoke.learning_rate"),
])
def test_bad_config_exits_with_clear_message(tmp_path, override, key):
    r = _run([override], tmp_path, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert key in r.stderr and "invalid config" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "w" / "summary.json").exists()  # failed before any compute
