"""benchmarks/attention_dots.py: both forms of the product are checked to agree before timing, and
bad arguments fail before any compute."""
from __future__ import annotations

import os
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import attention_dots  # noqa: E402


def test_both_forms_agree_and_are_timed(capsys):
    res = attention_dots.main(["--shape", "2,2,16,32,8", "--repeats", "5", "--calls", "2"])
    out = capsys.readouterr().out
    assert "forms agree" in out and "x the product as asked" in out
    assert all(v > 0 for v in res.values())


def test_the_roofline_is_printed_from_its_own_timings(capsys, monkeypatch):
    """--roofline: the write bound is the score bytes at the streaming pass's measured rate (read +
    write), so it is derived from the printed timings, not assumed."""
    monkeypatch.setattr(attention_dots.perf, "matmul_peak_gflops", lambda *a, **k: 100.0)
    res = attention_dots.main(["--shape", "2,2,16,32,8", "--repeats", "5", "--calls", "2", "--roofline"])
    out = capsys.readouterr().out
    assert "write bound of S" in out and "of the matmul peak (100.0 GFLOP/s" in out
    assert f"on {attention_dots.perf.cores()} cores)" in out and res["cores"] == attention_dots.perf.cores()
    assert res["torch_bmm_ms"] > 0 and "torch.bmm, same product" in out  # the CI installs the torch extra
    out_bytes = 4.0 * 2 * 2 * 16 * 32
    assert res["write_bound_ms"] == pytest.approx(res["stream_ms"] / 2)
    assert res["stream_gbs"] == pytest.approx(2 * out_bytes / (res["stream_ms"] * 1e6))
    assert res["product_gflops"] == pytest.approx(2.0 * 2 * 2 * 16 * 32 * 8 / (res["product_ms"] * 1e6))


def test_a_wrong_score_product_is_not_timed(monkeypatch):
    """Positive control for the roofline's check: a product that is not Q K^T stops the script."""
    real = attention_dots.jnp.einsum
    monkeypatch.setattr(attention_dots.jnp, "einsum",
                        lambda spec, *a, **k: real(spec, *a, **k) * (2.0 if spec == "bhsk,bhtk->bhst" else 1.0))
    monkeypatch.setattr(attention_dots.perf, "matmul_peak_gflops", lambda *a, **k: 100.0)
    with pytest.raises(SystemExit, match="disagrees with float64"):
        attention_dots.main(["--shape", "2,2,16,32,8", "--repeats", "5", "--calls", "2", "--roofline"])


@pytest.mark.parametrize("argv", [["--repeats", "2"], ["--shape", "1,2,3"], ["--shape", "a,b,c,d,e"]])
def test_bad_arguments_fail_before_compute(argv, monkeypatch):
    monkeypatch.setattr(attention_dots, "timed", lambda *a, **k: pytest.fail("timed before checking"))
    with pytest.raises(SystemExit):
        attention_dots.main(argv)


def test_forms_that_disagree_are_not_timed(monkeypatch):
    # positive control: a "transposed copy" that scales the operand must stop the script before timing
    monkeypatch.setattr(attention_dots.jax.lax, "optimization_barrier", lambda x: x * 2.0)
    monkeypatch.setattr(attention_dots, "timed", lambda *a, **k: pytest.fail("timed forms that disagree"))
    with pytest.raises(SystemExit, match="disagree"):
        attention_dots.main(["--shape", "2,2,16,32,8"])


def test_a_torch_product_that_disagrees_is_not_timed(monkeypatch):
    """Positive control for the torch row's check: a bmm that computes something else stops the script
    before its time is printed beside the JAX product's."""
    torch = pytest.importorskip("torch")
    real = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b, **kw: real(a, b, **kw) * 1.01)
    with pytest.raises(SystemExit, match="torch.bmm disagrees"):
        attention_dots.main(["--shape", "2,2,16,32,8", "--repeats", "5", "--calls", "2", "--roofline"])
