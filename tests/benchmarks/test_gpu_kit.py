"""GPU kit plumbing: the validation record (`kernels_pallas.gpu_validation`), `impl='auto'` dispatch
gated by it, and the kit's dry run (`bash benchmarks/gpu_kit.sh --dry-run`) end to end on CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from kernels_pallas import api, gpu_validation
from _paths import REPO_ROOT  # noqa: E402

ROOT = Path(REPO_ROOT)


def test_record_roundtrip_and_gating(tmp_path):
    path = tmp_path / "rec.json"
    assert not gpu_validation.validated("gmm_bf16", kind="NVIDIA H200", path=path)  # no record
    gpu_validation.write({"gmm_bf16": {"passed": True, "max_err_ratio": 0.01},
                          "gmm_mxfp8": {"passed": False, "max_err_ratio": 7.0}}, "NVIDIA H200", path)
    assert gpu_validation.validated("gmm_bf16", kind="NVIDIA H200", path=path)
    assert not gpu_validation.validated("gmm_mxfp8", kind="NVIDIA H200", path=path)   # failed check
    assert not gpu_validation.validated("gmm_fp8_blockwise", kind="NVIDIA H200", path=path)  # never checked
    assert not gpu_validation.validated("gmm_bf16", kind="NVIDIA H100 80GB HBM3", path=path)  # other kind
    data = json.loads(path.read_text())
    data["devices"]["NVIDIA H200"]["jax"] = "0.0.1"  # recorded under another JAX: not trusted
    path.write_text(json.dumps(data))
    os.utime(path, ns=(1, 1))  # new mtime for the cache
    assert not gpu_validation.validated("gmm_bf16", kind="NVIDIA H200", path=path)


def test_record_rejects_bad_input(tmp_path):
    path = tmp_path / "rec.json"
    with pytest.raises(ValueError, match="unknown kernel names"):
        gpu_validation.write({"gmm_int4": {"passed": True}}, "X", path)
    with pytest.raises(ValueError, match="boolean 'passed'"):
        gpu_validation.write({"gmm_bf16": {"passed": "yes"}}, "X", path)
    assert not path.exists()
    path.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        gpu_validation.validated("gmm_bf16", kind="X", path=path)


def test_auto_picks_triton_only_for_validated_kernels_on_gpu(tmp_path, monkeypatch):
    """Positive control with a faked GPU device: the record flips 'auto' to 'triton'; without the
    record (or on the real CPU backend) 'auto' stays on the reference path."""
    path = tmp_path / "rec.json"
    monkeypatch.setenv(gpu_validation.RECORD_ENV, str(path))
    assert api.resolve_impl("auto", "gmm_bf16") == "xla"  # CPU backend
    fake = SimpleNamespace(platform="gpu", device_kind="Fake GPU")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [fake])
    assert api.resolve_impl("auto", "gmm_bf16") == "xla"  # GPU, but no record
    gpu_validation.write({"gmm_bf16": {"passed": True}, "quant_mxfp8_e4m3": {"passed": False}}, "Fake GPU", path)
    assert api.resolve_impl("auto", "gmm_bf16") == "triton"
    assert api.resolve_impl("auto", "quant_mxfp8_e4m3") == "xla"
    assert api.resolve_impl("auto", None) == "xla"
    assert api.resolve_impl("xla", "gmm_bf16") == "xla"  # explicit impls are never overridden


def _run_dry(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_kit.sh"), "--dry-run", "--out", str(out),
                           "--skip-model"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.slow
def test_gpu_kit_dry_run_writes_the_skeleton(tmp_path):
    res = _run_dry(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads((tmp_path / "gpu_kit.json").read_text())
    rows = rep["rows"]
    assert rep["meta"]["dry_run"] is True and rep["meta"]["validation_record"] is None
    by = {}
    for r in rows:
        by.setdefault(r["section"], []).append(r)
    # CPU part ran and passed: every lowering and interpret-mode correctness row
    assert by["lowering"] and all(r["status"] == "pass" for r in by["lowering"])
    interp = [r for r in by["correctness"] if "triton_interpret" in r["name"]]
    assert len(interp) >= 8 and all(r["status"] == "pass" for r in interp), interp
    # every GPU row is marked, none is silently missing
    for sec in ("gmm", "quant", "aims"):
        assert by[sec] and all(r["status"] == "not run: no GPU" for r in by[sec]), sec
    assert any("kimi" in r["name"] or "K=7168" in r["name"] for r in by["gmm"])
    assert (tmp_path / "gpu_kit.md").read_text().count("not run: no GPU") == sum(
        r["status"] == "not run: no GPU" for r in rows)
