"""benchmarks/rl_step.py runs end to end in its tiny --dry-run mode and writes the documented JSON keys
(nothing is timed or compared here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _envs_common import needs_bwrap
from _paths import REPO_ROOT  # noqa: E402

pytestmark = [needs_bwrap, pytest.mark.slow]  # ~50 s of compiling: run with -m slow

ROOT = REPO_ROOT


def test_rl_step_benchmark_dry_run_writes_json(tmp_path):
    out = tmp_path / "rl_step.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "rl_step.py"), "--dry-run", "--out", str(out),
           "--tasks-dir", str(tmp_path / "tasks")]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, as the benchmark runs (conftest simulates 8)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "== RL step" in r.stdout and "== scaling ==" in r.stdout
    res = json.loads(out.read_text())
    for k in ("command", "model", "tasks", "setup", "compile_total_s", "cells", "scaling"):
        assert k in res, k
    (cell,) = res["cells"]
    assert (cell["group_size"], cell["tasks_per_step"]) == (2, 1)
    assert cell["warmup"]["step"] == 0 and len(cell["timed_steps"]) == 1
    for k in ("rollouts_per_s", "sampled_tok_per_s", "learner_tok_per_s"):
        assert k in cell["median"]["rates"]
    for k in ("rollout", "grading", "diag", "learner", "publish", "other", "step"):
        assert k in cell["median"]["time"]
    assert cell["timed_steps"][0]["rollouts"] == 2
    seen = [t for r in [cell["warmup"]] + cell["timed_steps"] for t in r["tasks"]]
    assert len(seen) == len(set(seen)) == 2  # fresh task every step
    assert set(res["scaling"]) == {"group_size", "tasks_per_step"}
