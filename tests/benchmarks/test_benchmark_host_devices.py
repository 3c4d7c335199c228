"""benchmarks/host_devices.py: the split rows compute what one device computes before anything is timed, a
row that does not is stopped (positive control), and bad arguments fail before any compute. The test
process has 8 simulated host devices (tests/conftest.py); the script uses the first --devices of them."""
from __future__ import annotations

import os
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import host_devices  # noqa: E402

SMOKE = ["--preset", "tiny", "--batch", "2", "--seq", "16", "--repeats", "5", "--modes", "interleaved"]


@pytest.mark.slow
def test_split_rows_agree_with_one_device_and_are_timed(capsys, monkeypatch):
    monkeypatch.setattr(host_devices.perf, "matmul_peak_gflops", lambda *a, **k: 100.0)
    res = host_devices.main(SMOKE)
    out = capsys.readouterr().out
    assert set(res["interleaved"]) == set(host_devices.ROWS) and res["devices"] == 2 and "alone" not in res
    for name in host_devices.ROWS:
        assert res["parity"][name]["loss_rel_diff"] <= 1e-6 and res["parity"][name]["grad_rel_diff"] <= 1e-4
        assert res["interleaved"][name]["n"] == 5 and res["interleaved"][name]["median"] > 0
    assert res["parity"]["one device"]["loss_rel_diff"] == 0.0
    assert res["interleaved"]["one device"]["speedup"] == pytest.approx(1.0)
    assert "x one device" in out and "shard_map DP" in out and "GSPMD DP" in out


def test_a_split_row_that_computes_something_else_is_not_timed(monkeypatch):
    """Positive control: a shard_map row whose gradient is 1% off stops the script before timing (only
    that row and one device are built, to keep the default test run short; the unskewed rows: the slow
    test above)."""
    real = host_devices.build_rows

    def skewed(*a, **k):
        rows = real(*a, names=("one device", "shard_map DP"))
        fn = rows["shard_map DP"]
        rows["shard_map DP"] = lambda: (lambda lg: (lg[0], host_devices.jax.tree.map(lambda g: g * 1.01, lg[1])))(fn())
        return rows
    monkeypatch.setattr(host_devices, "build_rows", skewed)
    monkeypatch.setattr(host_devices, "time_interleaved", lambda *a, **k: pytest.fail("timed rows that disagree"))
    with pytest.raises(SystemExit, match=r"parity gate FAILED for \['shard_map DP'\]"):
        host_devices.main(SMOKE)


@pytest.mark.slow
def test_alone_runs_each_row_in_a_process_with_its_own_device_count(capsys, monkeypatch):
    """Alone: one device in a one-device process, the split rows in two-device ones; each worker's loss
    is the parity gate's (checked by the script, which stops otherwise: the next test)."""
    monkeypatch.setattr(host_devices.perf, "matmul_peak_gflops", lambda *a, **k: 100.0)
    argv = ["--preset", "tiny", "--batch", "2", "--seq", "16", "--repeats", "5", "--modes", "alone"]
    res = host_devices.main(argv)
    assert set(res["alone"]) == set(host_devices.ROWS) and "interleaved" not in res
    assert all(res["alone"][n]["n"] == 5 for n in host_devices.ROWS)
    assert "each row in its own process" in capsys.readouterr().out
    assert host_devices.worker_env("one device", 2)["XLA_FLAGS"].endswith("--xla_force_host_platform_device_count=1")
    assert "count=8" not in host_devices.worker_env("GSPMD DP", 2)["XLA_FLAGS"]


def test_an_alone_worker_with_another_loss_is_not_used(monkeypatch):
    """Positive control for the alone mode's check: a gate loss the worker cannot reproduce stops it (the
    gate itself is faked here to spare its compiles; the worker is real)."""
    monkeypatch.setattr(host_devices.perf, "matmul_peak_gflops", lambda *a, **k: 100.0)
    monkeypatch.setattr(host_devices, "build_rows", lambda *a, **k: {})
    monkeypatch.setattr(host_devices, "check_parity", lambda rows, rtol: {n: {"loss": 1.0} for n in host_devices.ROWS})
    with pytest.raises(SystemExit, match="alone worker for 'one device': loss"):
        host_devices.main(["--preset", "tiny", "--batch", "2", "--seq", "16", "--repeats", "5", "--modes", "alone"])


@pytest.mark.parametrize("argv", [["--devices", "1"], ["--repeats", "3"], ["--batch", "3"], ["--seq", "1"],
                                  ["--modes", "fast"], ["--worker", "two devices"]])
def test_bad_arguments_fail_before_compute(argv, monkeypatch):
    monkeypatch.setattr(host_devices, "build_rows", lambda *a, **k: pytest.fail("built before checking"))
    with pytest.raises(SystemExit):
        host_devices.main(argv)


def test_more_devices_than_the_process_has_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(host_devices, "build_rows", lambda *a, **k: pytest.fail("built without the devices"))
    with pytest.raises(SystemExit, match="devices asked, this process has"):
        n = len(host_devices.jax.devices()) + 2
        host_devices.main(["--devices", str(n), "--batch", str(2 * n)])


def test_the_device_count_is_asked_for_only_when_xla_flags_names_none(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    host_devices._set_device_count(["--devices", "4"])
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    host_devices._set_device_count(["--devices=2"])
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
