"""The shared train loop: logging, summary, and exact resume after SIGKILL / SIGTERM in a real
subprocess (toy model: tests/train_toy_run.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from c2jax.train.metrics import read_jsonl
from _paths import TESTS_DIR  # noqa: E402

HERE = TESTS_DIR  # the helper scripts live in tests/
RUN = [sys.executable, os.path.join(HERE, "train_toy_run.py")]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "C2JAX_PROGRESS": "0"}


def _losses(d):
    return {r["step"]: r["loss"] for r in read_jsonl(os.path.join(d, "train.jsonl"))}


def _wait_for_step(d, step, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if max(_losses(d), default=0) >= step:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_killed_run_resumes_with_bit_identical_losses(tmp_path, sig):
    steps = 14
    ref, cut = str(tmp_path / "ref"), str(tmp_path / "cut")
    subprocess.run(RUN + [ref, str(steps)], env=ENV, check=True, capture_output=True, timeout=300)
    p = subprocess.Popen(RUN + [cut, str(steps), "0.15"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_step(cut, 7, p)
    p.send_signal(sig)
    p.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert p.returncode == 143  # saved and stopped cleanly
        assert os.path.isdir(os.path.join(cut, "checkpoints", str(max(_losses(cut)))))
    else:
        assert p.returncode == -signal.SIGKILL
    before = _losses(cut)
    assert max(before) < steps
    r = subprocess.run(RUN + [cut, str(steps)], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from checkpoint step" in r.stderr
    want, got = _losses(ref), _losses(cut)
    assert sorted(got) == list(range(1, steps + 1))
    for s in range(1, steps + 1):
        assert got[s] == want[s], (s, got[s], want[s])  # bit for bit (JSON floats round-trip exactly)
    for s, v in before.items():  # the killed run's own records agree too
        assert v == want[s]
    evs = read_jsonl(os.path.join(cut, "eval.jsonl"))
    assert evs[0]["step"] == 0 and evs[-1]["step"] == steps
    assert os.path.isdir(os.path.join(cut, "tb"))
