"""benchmarks/rl_learner.py: a variant is timed only after its logprobs, loss and gradient norm
matched the default's (the gate stops a variant that changes the result), and bad arguments fail
before any compute."""
from __future__ import annotations

import os
import re
import sys

import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import rl_learner  # noqa: E402

SMOKE = ["--config", os.path.join(REPO_ROOT, "experiments/configs/rl_quickstart.py:smoke"), "--rows", "4",
         "--row-len", "384", "--repeats", "5"]


def test_the_logits_paths_agree_and_are_timed(capsys):
    rl_learner.main(SMOKE + ["--variants", "logits-at=all"])
    out = capsys.readouterr().out
    assert re.search(r"parity: logits-at=all vs default: logprob max diff \S+, loss/grad_norm rel diff \S+ ok", out)
    assert re.search(r"^default +[0-9.]+ s \[", out, re.M)
    assert re.search(r"^logits-at=all +[0-9.]+ s .*[0-9.]+x the default", out, re.M)


def test_the_parity_gate_stops_a_variant_that_changes_the_result(monkeypatch):
    # positive control: zero attention scale (uniform attention) must not pass as the same learner step
    monkeypatch.setattr(rl_learner, "parse_variants",
                        lambda text: [("zero-scale", "c2jax.model.mla", "softmax_scale", lambda a: 0.0)])
    with pytest.raises(SystemExit, match="parity gate failed"):
        rl_learner.main(SMOKE + ["--variants", "x=1"])


@pytest.mark.parametrize("argv", [["--repeats", "2"], ["--variants", "nope=1"], ["--variants", "logits-at"]])
def test_bad_arguments_fail_before_compute(argv, monkeypatch):
    monkeypatch.setattr(rl_learner, "synthetic_batch", lambda *a, **k: pytest.fail("built a batch before checking"))
    with pytest.raises(SystemExit):
        rl_learner.main(argv)
