"""benchmarks/engine_steps.py: a variant is timed only after its decode step matched the default's
(the gate fails on a variant that changes the result), and bad arguments fail before any compute."""
from __future__ import annotations

import os
import re
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import engine_steps  # noqa: E402

SMOKE = ["--config", os.path.join(REPO_ROOT, "experiments/configs/rl_quickstart.py:smoke"), "--slots", "4",
         "--max-len", "256", "--windows", "128", "--chunks", "16", "--repeats", "5", "--steps", "2"]


def test_the_decode_layouts_agree_and_are_timed(capsys):
    engine_steps.main(SMOKE + ["--variants", "absorbed-out=bshc"])
    out = capsys.readouterr().out
    assert "parity: absorbed-out=bshc decode window 128: same sampled tokens" in out
    assert "parity: absorbed-out=bshc prefill window 128 chunk 16: same sampled tokens" in out
    assert re.search(r"decode window 128 \(4 rows\) +default +[0-9.]+ ms", out)
    assert "x the default" in out and "prefill window 128 chunk 16" in out


def test_the_parity_gate_stops_a_variant_that_changes_the_result(monkeypatch, capsys):
    # positive control: zero attention scale (uniform attention) must not pass as "the same step"
    monkeypatch.setattr(engine_steps, "parse_variants",
                        lambda text: [("zero-scale", "c2jax.model.mla", "softmax_scale", lambda a: 0.0)])
    with pytest.raises(SystemExit, match="parity gate failed: variant zero-scale"):
        engine_steps.main(SMOKE + ["--variants", "x=1"])


@pytest.mark.parametrize("argv", [["--repeats", "2"], ["--variants", "nope=1"], ["--variants", "absorbed-out"],
                                  ["--windows", "2048"], ["--windows", "16", "--steps", "16"]])
def test_bad_arguments_fail_before_compute(argv, monkeypatch):
    monkeypatch.setattr(engine_steps.Steps, "__init__", lambda *a, **k: pytest.fail("compiled before checking"))
    with pytest.raises(SystemExit):
        engine_steps.main(argv)
