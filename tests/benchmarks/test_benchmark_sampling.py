"""benchmarks/sampling.py: greedy agreement is computed from the timed outputs themselves, every
prompt, position by position; bad arguments fail before any compute."""
from __future__ import annotations

import os
import re
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


def test_summarise_agreement_pools_every_prompt_of_every_repeat():
    a = sampling_bench.greedy_agreement(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 0]]))
    b = sampling_bench.greedy_agreement(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]))
    line = sampling_bench.summarise_agreement([a, b, b, b, a])
    assert "tokens identical 1.000 [min 0.750, max 1.000]" in line
    assert "prompts identical 1.000 [min 0.500, max 1.000] (median over 5 repeats)" in line
    assert "pooled over all 10 prompts: tokens 18/20, prompts 8/10" in line


def test_mixed_workload_keeps_the_default_lengths_and_scales_down():
    prompts, new, long = sampling_bench.mixed_workload(400, 256, 100, np.random.default_rng(0))
    assert len(prompts) == 400 and all(8 <= len(p) < 48 for p in prompts)
    assert new[long].min() >= 160 and new[long].max() < 224 and new[~long].min() >= 8 and new[~long].max() < 40
    _, small, _ = sampling_bench.mixed_workload(8, 4, 100, np.random.default_rng(0))
    assert small.min() >= 1 and small.max() <= 4


@pytest.mark.parametrize("argv", [["--batches", "1,x"], ["--batches", "0"], ["--preset", "huge"]])
def test_bad_batches_and_presets_fail_before_compute(argv, capsys):
    with pytest.raises(SystemExit):
        sampling_bench.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_runs_end_to_end_at_tiny_size(capsys):
    """The whole benchmark on the tiny preset: every section prints, agreement is counted on every
    prompt of the 5 timed repeats (5 x 2 prompts x 4 tokens), and the same-weights f32 models agree
    (a mis-paired comparison would not). No timing is asserted."""
    pytest.importorskip("transformers")
    assert sampling_bench.main(["--preset", "tiny", "--batches", "2", "--new-tokens", "4", "--prompt-len", "8",
                                "--mixed-requests", "3", "--slots", "2"]) == 0
    out = capsys.readouterr().out
    assert "model: tiny preset" in out and "attention sdpa" in out
    assert "batch   2: c2jax" in out and out.count("n=5 tok/s") == 2
    assert "c2jax / transformers (ratio of medians)" in out
    m = re.search(r"\(5 repeats x 2 prompts x 4 tokens\).*pooled over all 10 prompts: tokens (\d+)/40, "
                  r"prompts (\d+)/10", out)
    assert m, out
    assert int(m.group(1)) >= 36, out
    assert out.count("tok/s") >= 4 and "continuous / static (ratio of medians of 5)" in out
    assert re.search(r"static +tok/s [\d.]+ \[min", out) and re.search(r"continuous tok/s [\d.]+ \[min", out)
    assert "c2jax latent cache:" in out and "transformers DynamicCache (measured)" in out
