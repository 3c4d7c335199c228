"""benchmarks/kernel_bench.py: every grouped-matmul recipe's % of peak is computed against the datasheet
peak of the tensor-core format it runs in (FP8 recipes against the FP8 peak, BF16 against BF16),
from the one peak table in benchmarks/perf.py, both in the helper and in the printed table.
Timing is replaced by a fixed figure so the printed column is checked exactly; nothing is timed."""
from __future__ import annotations

import os
import re
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

import kernel_bench as kernels_bench  # noqa: E402
import perf  # noqa: E402
from kernels_pallas import api  # noqa: E402

H200 = "NVIDIA H200"


def test_every_recipe_has_a_tensor_core_format_on_both_architectures():
    for arch in ("hopper", "blackwell"):
        assert set(api.PRECISIONS) <= set(perf.MMA_FORMAT[arch]), arch


@pytest.mark.parametrize("precision,peak", [("fp8_blockwise", 1978.9), ("mxfp8", 1978.9), ("bf16", 989.4),
                                            ("f32", 494.7), ("nvfp4_fwd_mxfp8_bwd", 989.4)])
def test_percent_of_peak_uses_the_recipes_own_format(precision, peak):
    assert kernels_bench.percent_of_peak(peak / 2, H200, precision) == pytest.approx(50.0)
    assert kernels_bench.percent_of_peak(1.0, "cpu", precision) is None


def test_printed_table_puts_fp8_rows_against_the_fp8_peak(monkeypatch, capsys):
    """bench_gmm with every call timed as exactly 1 ns (about 100 TFLOP/s at this size): a recipe's TFLOP/s is the same for all rows,
    so an FP8 row's % must be half a BF16 row's (the FP8 peak is twice the BF16 one)."""
    monkeypatch.setattr(kernels_bench, "timeit", lambda fn, *a, reps=0: perf.Stats((1e-9,) * 5))
    m, k, n, g = 64, 32, 32, 4
    kernels_bench.bench_gmm(m, k, n, g, "xla", H200)
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in api.PRECISIONS and len(parts) >= 5:
            rows[parts[0]] = (float(parts[2]), float(parts[4]))  # TFLOP/s, %peak
    assert set(rows) == set(api.PRECISIONS), out
    tflops = rows["bf16"][0]
    assert tflops > 50, out  # large enough that the printed percentages are not all 0.0
    assert all(r[0] == tflops for r in rows.values())
    for p, (tf, pct) in rows.items():
        want = 100 * tf / perf.datasheet_peak_tflops(H200, p)
        assert pct == pytest.approx(want, abs=0.051), (p, pct, want)
    assert rows["fp8_blockwise"][1] == pytest.approx(rows["bf16"][1] / 2, abs=0.051)
    assert re.search(r"FP8 for fp8_blockwise/mxfp8, BF16 for bf16", out)
