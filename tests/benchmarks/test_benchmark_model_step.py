"""benchmarks/model_step.py: the parity gate stops a run whose rows do not compute the same thing,
bad arguments fail before any compute, and (slow) the whole fair harness runs end to end on a tiny
batch with both timing modes. Nothing here is timed or compared for speed."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
_omp = os.environ.get("OMP_WAIT_POLICY")
import model_step  # noqa: E402  (sets OMP_WAIT_POLICY for the benchmark's own process: undo it here)

if _omp is None:
    os.environ.pop("OMP_WAIT_POLICY", None)


class _Fake:
    def __init__(self, loss: float, grad_norm: float):
        self.loss, self.gn = loss, grad_norm

    def step(self) -> float:
        return self.loss

    def grad_norm(self) -> float:
        return self.gn


def test_parity_gate_passes_equal_rows_and_ignores_the_dropping_row():
    steps = {"torch": _Fake(8.0, 2.0), "jax-dropless": _Fake(8.0 * (1 + 5e-7), 2.0 * (1 + 5e-5)),
             "jax-capacity": _Fake(9.0, 3.0)}  # different computation: reported, not gated
    got = model_step.check_parity(list(steps), steps, loss_rtol=1e-6)
    assert got["jax-capacity"] == (9.0, 3.0)


@pytest.mark.parametrize("loss,gn", [(8.0 * (1 + 3e-6), 2.0), (8.0, 2.0 * (1 + 1e-3))])
def test_parity_gate_stops_when_a_same_computation_row_differs(loss, gn):
    steps = {"torch": _Fake(8.0, 2.0), "jax-dropless": _Fake(loss, gn)}
    with pytest.raises(SystemExit, match="parity gate FAILED for \\['jax-dropless'\\]"):
        model_step.check_parity(list(steps), steps, loss_rtol=1e-6)


@pytest.mark.parametrize("argv,msg", [
    (["--rows", "jax-dropless,tf"], "unknown"),
    (["--rows", "jax-dropless@head-groups-4+nope"], "unknown"),
    (["--rows", "torch@head-groups-4"], "unknown"),
    (["--repeats", "3"], "must be >= 5"),
    (["--modes", "alone,both"], "--modes"),
    (["--batch", "0"], "--batch"),
    (["--warmup", "0"], "--warmup"),
    (["--compile-timeout", "0"], "--compile-timeout"),
])
def test_bad_arguments_fail_before_compute(argv, msg, capsys):
    with pytest.raises(SystemExit):
        model_step.parse_args(argv)
    assert msg in capsys.readouterr().err


def test_combined_variant_sets_every_switch_and_restores_them(monkeypatch):
    """A row "jax-dropless@a+b" compiles its step with both switches set and leaves both modules as
    they were, so the next row compiles the default."""
    import c2jax.model.mla as mla
    import c2jax.model.transformer as transformer

    _, desc, same = model_step.row_spec("jax-dropless@head-groups-4+python-loops")
    assert "ATTN_HEAD_GROUPS=4" in desc and "SCAN_UNROLL='python'" in desc and same
    seen = {}

    class Lowered:  # stands in for jax's lowered step: records the switches when compile() runs
        def compile(self):
            seen.update(groups=mla.ATTN_HEAD_GROUPS, loop=transformer.SCAN_UNROLL)
            return lambda *a: None

    class Jitted:
        def lower(self, *a):
            return Lowered()

    import jax
    import numpy as np

    before = (mla.ATTN_HEAD_GROUPS, transformer.SCAN_UNROLL)
    monkeypatch.setattr(jax, "jit", lambda f, **kw: Jitted())
    monkeypatch.setattr("c2jax.model.hf.io.from_pretrained", lambda *a, **k: ({}, None))
    model_step.JaxStep("unused", "dropless", np.zeros((1, 8), np.int64), "head-groups-4+python-loops")
    assert seen == {"groups": 4, "loop": "python"}
    assert (mla.ATTN_HEAD_GROUPS, transformer.SCAN_UNROLL) == before


@pytest.mark.slow  # compiles the small model twice and starts 3 workers: ~2-4 min on 2 cores
def test_model_step_runs_fair_end_to_end():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "model_step.py"), "--batch", "1", "--seq", "64",
           "--rows", "jax-dropless,jax-capacity,torch", "--repeats", "5", "--profile"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "'attn_implementation': 'sdpa'" in out and "'OMP_WAIT_POLICY': 'PASSIVE'" in out
    assert "parity jax-dropless" in out and "[different computation: not gated]" in out
    assert "== interleaved" in out and "== alone" in out and "FAILED" not in out
    assert out.count("n=5") == 6  # 3 rows x 2 modes, each a median of 5 with its spread
    assert "drops" in out and "by kind of work" in out and "matmul" in out
    assert "time by component x work" in out and "MoE routed experts" in out and "attention scores+softmax" in out
    assert "matmul GFLOP/s per component" in out


@pytest.mark.slow  # torch.compile of the small model's fwd+bwd: ~3-5 min on 2 cores
def test_torch_compile_row_is_always_in_the_tables():
    """The torch-compile row prints in both timing modes: timed (after the gated compile probe) or
    as 'not compiled: REASON' when the compiler is unavailable or too slow."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "model_step.py"), "--batch", "1", "--seq", "32",
           "--rows", "torch,torch-compile", "--repeats", "5", "--compile-timeout", "900"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = re.findall(r"^torch-compile +(.*)$", r.stdout, re.M)
    assert len(rows) == 2, r.stdout  # interleaved and alone tables
    for row in rows:
        assert row.startswith("not compiled: ") or re.match(r"[\d.]+s \[min .*n=5", row), row
    if not rows[0].startswith("not compiled"):
        assert re.search(r"^parity torch-compile .*\[compile \+ first step", r.stdout, re.M)


def test_compile_probe_past_its_bound_gives_a_not_compiled_row(tmp_path, capsys):
    """A compile that cannot finish within --compile-timeout is reported as a row, not a crash
    (0.5 s: importing torch and transformers alone takes longer)."""
    import numpy as np

    np.save(tmp_path / "tokens.npy", np.zeros((1, 8), np.int64))
    args = model_step.parse_args(["--compile-timeout", "0.5"])
    got = model_step.probe_compile(str(tmp_path), args, ref=(8.0, 2.0))
    assert got["error"].startswith("not compiled: compile + first step exceeded --compile-timeout")
    from c2jax.model import preset

    model_step.report("alone", {"torch": {"times": [1.0] * 5}, "torch-compile": got}, preset("small"), 1, 8, 50.0)
    out = capsys.readouterr().out
    assert re.search(r"^torch-compile +not compiled: compile \+ first step exceeded", out, re.M), out
    assert "FAILED" not in out


def test_compile_probe_that_crashes_gives_its_reason(tmp_path):
    args = model_step.parse_args([])  # no inputs written in tmp_path: the worker fails at once
    got = model_step.probe_compile(str(tmp_path), args, ref=(8.0, 2.0))
    assert got["error"].startswith("not compiled: ") and "tokens.npy" in got["error"], got
