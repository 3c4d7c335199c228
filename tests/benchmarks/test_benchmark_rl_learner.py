"""benchmarks/rl_learner.py: a variant is timed only after its logprobs, loss, gradient norm and
gradient element by element matched the default's (the gate stops a variant that changes the result), and bad arguments fail
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
    assert re.search(r"parity: logits-at=all vs default: logprob max diff \S+, loss/grad_norm rel diff \S+, "
                     r"gradient max diff \S+ of its leaf's largest entry \(at .+\) ok", out)
    assert re.search(r"^default +[0-9.]+ s \[", out, re.M)
    assert re.search(r"^logits-at=all +[0-9.]+ s .*[0-9.]+x the default", out, re.M)


def test_the_parity_gate_stops_a_variant_that_changes_the_result(monkeypatch):
    # positive control: zero attention scale (uniform attention) must not pass as the same learner step
    monkeypatch.setattr(rl_learner, "parse_variants",
                        lambda text: [("zero-scale", "c2jax.model.mla", "softmax_scale", lambda a: 0.0)])
    with pytest.raises(SystemExit, match="parity gate failed"):
        rl_learner.main(SMOKE + ["--variants", "x=1"])


def test_the_gradient_check_sees_what_a_norm_cannot():
    """grad_diff compares element by element: a gradient with two entries swapped has the same norm
    (the positive control the loss/norm check passes) but fails GRAD_RTOL, naming its leaf."""
    import numpy as np

    want = {"a": {"kernel": np.array([[1.0, -2.0], [0.5, 4.0]])}, "b": np.array([3.0, 1e-3])}
    assert rl_learner.grad_diff(want, want) == (0.0, rl_learner.grad_diff(want, want)[1])
    swapped = {"a": {"kernel": np.array([[-2.0, 1.0], [0.5, 4.0]])}, "b": want["b"]}
    norm = lambda t: float(np.sqrt(sum((np.asarray(x) ** 2).sum() for x in (t["a"]["kernel"], t["b"]))))
    assert norm(swapped) == norm(want)
    rel, where = rl_learner.grad_diff(swapped, want)
    assert rel == pytest.approx(3.0 / 4.0) and rel > rl_learner.GRAD_RTOL and "kernel" in where
    tiny = {"a": want["a"], "b": np.array([3.0, 1e-3 + 3.0 * rl_learner.GRAD_RTOL / 2])}
    assert rl_learner.grad_diff(tiny, want)[0] == pytest.approx(rl_learner.GRAD_RTOL / 2)
    assert rl_learner.grad_diff({"a": want["a"]}, want)[0] == float("inf")  # a missing leaf is not "equal"


@pytest.mark.parametrize("argv", [["--repeats", "2"], ["--variants", "nope=1"], ["--variants", "logits-at"]])
def test_bad_arguments_fail_before_compute(argv, monkeypatch):
    monkeypatch.setattr(rl_learner, "synthetic_batch", lambda *a, **k: pytest.fail("built a batch before checking"))
    with pytest.raises(SystemExit):
        rl_learner.main(argv)
