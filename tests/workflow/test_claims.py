"""The claims ledger: verdict rules, the statistics behind them (against scipy), every entry well
formed, an entry cannot hand-write a verdict its CI contradicts, expensive claims refuse to run
without --force, and one cheap claim (k3 vs k1 variance) run end to end."""
from __future__ import annotations

import json
import math
import os
import types

import numpy as np
import pytest

from c2jax.workflow import claims as ledger
from c2jax.workflow.claims import Claim, Verdict, decide

from _paths import REPO_ROOT as ROOT
CLAIMS_DIR = os.path.join(ROOT, "experiments", "claims")
REQUIRED = {"rl_pass_at_1_and_k", "cpt_loss_predicts_rl", "advantage_normalisation_bias", "kl_k3_variance",
            "router_replay_mismatch", "nvfp4_batch_invariance", "inflight_updates_staleness",
            "checkpoint_sparse_diffs", "length_penalty_q", "overlong_masking_no_benefit"}


def test_decide_rules():
    assert decide(0.5, 0.1, 0.9, "greater") == "holds"
    assert decide(-0.5, -0.9, -0.1, "greater") == "does not hold"
    assert decide(0.5, -0.1, 0.9, "greater") == "inconclusive"
    assert decide(-0.5, -0.9, -0.1, "less") == "holds"
    assert decide(0.01, -0.02, 0.03, "none", 0.05) == "holds"
    assert decide(0.01, -0.02, 0.08, "none", 0.05) == "inconclusive"
    assert decide(0.2, 0.1, 0.3, "none", 0.05) == "does not hold"
    assert decide(math.nan, 0, 1, "greater") == "inconclusive"
    # "no benefit" (not_greater): a harm or a benefit below the margin holds, a shown benefit does not
    assert decide(-0.16, -0.17, -0.15, "not_greater", 0.05) == "holds"
    assert decide(0.02, 0.01, 0.04, "not_greater", 0.05) == "holds"
    assert decide(0.04, -0.01, 0.09, "not_greater", 0.05) == "inconclusive"
    assert decide(0.2, 0.1, 0.3, "not_greater", 0.05) == "does not hold"
    with pytest.raises(ValueError, match="margin"):
        decide(0.0, -1.0, 1.0, "not_greater")


def test_weakest_effect_picks_the_sub_effect_that_decides():
    effects = {"strong": (1.0, 0.8, 1.2, 5), "weak": (0.3, 0.05, 0.55, 5), "null": (0.1, -0.2, 0.4, 5)}
    assert ledger.weakest_effect(effects, "greater")[0] == "null"  # inconclusive beats any holding one
    del effects["null"]
    assert ledger.weakest_effect(effects, "greater")[0] == "weak"  # both hold: the smaller effect / half-width
    assert ledger.weakest_effect({"a": (-1.0, -1.2, -0.8, 3), "b": (-0.3, -0.5, -0.1, 3)}, "less")[0] == "b"
    assert ledger.weakest_effect({"a": (1.0, 0.5, 1.5, 3), "b": (-1.0, -1.5, -0.5, 3)}, "greater")[0] == "b"
    with pytest.raises(ValueError):
        ledger.weakest_effect({}, "greater")


def test_statistics_match_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 7), rng.normal(0.0, 2.0, 9)
    d, lo, hi = ledger.welch_diff(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (d, lo, hi) == pytest.approx((a.mean() - b.mean(), ci.low, ci.high), rel=1e-9)
    diffs = rng.normal(0.3, 0.2, 5)
    m, lo, hi, n = ledger.paired_t(diffs)
    ci = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert (m, lo, hi, n) == pytest.approx((diffs.mean(), ci.low, ci.high, 5), rel=1e-9)
    x = np.arange(15.0)
    rho, lo, hi = ledger.spearman_ci(x, -x + rng.normal(0, 1, 15))
    assert rho == pytest.approx(stats.spearmanr(x, -x + rng.normal(0, 1, 15)).statistic, abs=0.2) and hi < 0
    from c2jax.workflow.probes import newcombe_diff, wilson

    for k, n in ((81, 263), (0, 128), (128, 128), (3, 10)):  # Wilson interval against scipy's
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    d, lo, hi = newcombe_diff(56, 70, 48, 80)  # Newcombe (1998) example 1: 0.2, CI 0.0524 to 0.3339
    assert (d, lo, hi) == pytest.approx((0.2, 0.0524, 0.3339), abs=1e-3)


def test_every_entry_is_well_formed_and_the_required_claims_are_listed():
    entries = ledger.load_entries(CLAIMS_DIR)
    assert REQUIRED <= set(entries)
    for name, mod in entries.items():
        c = mod.CLAIM
        assert c.claim.endswith(".") and "report" in c.source and c.command and c.metric, name
        if c.scale == "cheap":
            assert callable(getattr(mod, "run", None)), f"{name}: a cheap claim must be runnable here"
        else:
            assert c.scale_note, f"{name}: say why it is {c.scale}"
    with pytest.raises(ValueError):
        Claim("x", "c.", "report", "t", "m", "sideways", "cmd", "cheap")
    with pytest.raises(ValueError):
        Claim("x", "c.", "report", "t", "m", "none", "cmd", "cheap")  # needs a margin
    with pytest.raises(ValueError):
        Claim("x", "c.", "report", "t", "m", "not_greater", "cmd", "cheap")  # so does "no benefit"
    for name in ("advantage_normalisation_bias", "checkpoint_sparse_diffs", "inflight_updates_staleness",
                 "length_penalty_q", "overlong_masking_no_benefit"):  # CPU-scale stand-ins say what they run
        c = entries[name].CLAIM
        assert c.run_scale and c.full_command and callable(getattr(entries[name], "run", None)), name


def _entry(verdict: str, effect: float, ci, scale="cheap"):
    claim = Claim("fake", "A fake claim.", "report", "t", "m", "greater", "cmd", scale, "because")
    return types.SimpleNamespace(CLAIM=claim, run=lambda out: Verdict(verdict, effect, ci, 3))


def test_an_entry_cannot_write_a_verdict_its_ci_contradicts(tmp_path):
    v = ledger.run_claim(_entry("holds", 0.5, (0.1, 0.9)), str(tmp_path))  # consistent: accepted and recorded
    assert v.verdict == "holds"
    rec = json.load(open(tmp_path / "fake" / "verdict.json"))
    assert rec["verdict"] == "holds" and rec["ci95"] == [0.1, 0.9] and rec["run_scale"] == "cheap"
    with pytest.raises(AssertionError, match="disagrees"):
        ledger.run_claim(_entry("holds", 0.5, (-0.1, 0.9)), str(tmp_path / "b"))
    assert not (tmp_path / "b" / "fake" / "verdict.json").exists()


def test_expensive_claims_need_force_and_table_says_not_run(tmp_path):
    with pytest.raises(RuntimeError, match="--force"):
        ledger.run_claim(_entry("holds", 0.5, (0.1, 0.9), scale="expensive"), str(tmp_path))
    entries = ledger.load_entries(CLAIMS_DIR)
    no_run = types.SimpleNamespace(CLAIM=_entry("holds", 0.5, (0.1, 0.9)).CLAIM)
    with pytest.raises(RuntimeError, match="no runnable test"):
        ledger.run_claim(no_run, str(tmp_path), force=True)
    rows = {r["name"]: r for r in ledger.table(entries, str(tmp_path))}
    assert all(r["verdict"] == "not run" for r in rows.values())


def test_cheap_claim_kl_k3_variance_end_to_end(tmp_path):
    entries = ledger.load_entries(CLAIMS_DIR)
    v = ledger.run_claim(entries["kl_k3_variance"], str(tmp_path))
    # closed forms: var k3 / var k1 = (e^{mu^2} - 1 - mu^2) / mu^2 -> 0.136 at mu=0.5, 12.65 at mu=2
    assert v.detail["k3_over_k1_var_at_0.5"] == pytest.approx((math.expm1(0.25) - 0.25) / 0.25, rel=0.1)
    assert v.detail["k1_var_over_mu2_at_2"] == pytest.approx(1.0, rel=0.05)
    assert v.verdict == "holds" and v.ci95[0] > 0 and os.path.getsize(v.figure) > 1000
    rows = {r["name"]: r for r in ledger.table(entries, str(tmp_path))}
    assert rows["kl_k3_variance"]["verdict"] == "holds" and rows["router_replay_mismatch"]["verdict"] == "not run"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["advantage_normalisation_bias", "overlong_masking_no_benefit", "length_penalty_q"])
def test_bandit_claims_end_to_end(tmp_path, name):
    """The controlled-bandit claims run through run_claim: verdict.json records the scale it ran at,
    its verdict matches its own CI, the figure exists; their mechanisms show in the detail."""
    entries = ledger.load_entries(CLAIMS_DIR)
    v = ledger.run_claim(entries[name], str(tmp_path))
    rec = json.load(open(tmp_path / name / "verdict.json"))
    assert rec["run_scale"] == entries[name].CLAIM.run_scale and rec["verdict"] == v.verdict
    assert os.path.getsize(v.figure) > 1000 and v.n == 5
    if name == "advantage_normalisation_bias":  # E|o| starts at 12 in every arm
        arms = v.detail["arms"]
        assert arms["1/|o|"]["len_wrong"] > 24 and arms["1/|o|"]["len_right"] < 6
        assert 8 < arms["constant"]["len_wrong"] < 16
    if name == "length_penalty_q":  # the no-penalty control is the most thorough on hard tasks
        arms = v.detail["arms"]
        assert arms["no penalty"]["calls"][-1] > arms["q=0.5"]["calls"][-1] > arms["q=0"]["calls"][-1]
