"""benchmarks/sampling.py: greedy agreement is computed from the timed outputs themselves, every
prompt, position by position; bad arguments fail before any compute."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
_omp = os.environ.get("OMP_WAIT_POLICY")
import sampling as sampling_bench  # noqa: E402  (sets OMP_WAIT_POLICY for its own process: undo it)

if _omp is None:
    os.environ.pop("OMP_WAIT_POLICY", None)


def test_greedy_agreement_counts_every_prompt_and_position():
    ours = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    theirs = np.array([[1, 2, 3, 4], [5, 6, 0, 0], [0, 9, 9, 9]])
    a = sampling_bench.greedy_agreement(ours, theirs)
    assert a["tokens"] == pytest.approx(9 / 12)
    assert a["prompts"] == pytest.approx(1 / 3)
    assert a["first_diff"] == [4, 2, 0]


def test_greedy_agreement_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="differ in shape"):
        sampling_bench.greedy_agreement(np.zeros((2, 3), int), np.zeros((2, 4), int))


@pytest.mark.parametrize("argv", [["--repeats", "2"], ["--new-tokens", "0"]])
def test_bad_arguments_fail_before_compute(argv):
    with pytest.raises(SystemExit):
        sampling_bench.main(argv)
