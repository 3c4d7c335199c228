"""The difficulty sweep's config keys, table and plot (the sweep itself runs in the RL stage)."""
from __future__ import annotations

import os

import pytest

from c2jax.rl.stage_config import resolve_stage, stage_defaults
from c2jax.train import rl_difficulty


def _errors(eval_over: dict) -> list:
    from c2jax.rl.stage_config import validate_rl_stage

    class Check:
        def __init__(self):
            self.errors = []

        def error(self, key, msg):
            self.errors.append((key, msg))

    c = Check()
    validate_rl_stage(c, {"eval": eval_over})
    return c.errors


def test_defaults_cover_every_difficulty():
    ev = stage_defaults()["eval"]
    assert list(ev["difficulties"]) == [0, 1, 2, 3] and ev["difficulty_n_tasks"] >= 1 and ev["difficulty_k"] >= 1
    assert resolve_stage({"eval": {"difficulties": (1,)}})["eval"]["difficulty_k"] == ev["difficulty_k"]


@pytest.mark.parametrize("bad", [(4,), (-1, 1), "123", (True,)])
def test_bad_difficulties_are_named(bad):
    errs = _errors({"difficulties": bad})
    assert [k for k, _ in errs] == ["eval.difficulties"], errs


def test_bad_counts_are_named():
    keys = sorted(k for k, _ in _errors({"difficulty_n_tasks": 0, "difficulty_k": -1}))
    assert keys == ["eval.difficulty_k", "eval.difficulty_n_tasks"]


def test_table_and_plot(tmp_path):
    by_d = {1: {"before": {"pass@1": 0.25, "ci95": [0.1, 0.4], "samples": 32, "malformed_tool_call_rate": 0.1},
                "after": {"pass@1": 0.5, "ci95": [0.3, 0.7], "samples": 32, "malformed_tool_call_rate": 0.0}},
            3: {"before": {"pass@1": 0.0, "ci95": [0.0, 0.0], "samples": 64, "malformed_tool_call_rate": None}}}
    lines = rl_difficulty.report_lines(by_d)
    rows = [ln for ln in lines if ln.startswith("| 1 ") or ln.startswith("| 3 ")]
    assert rows == ["| 1 | after | 0.500 | [0.300, 0.700] | 32 | 0.000 |",
                    "| 1 | before | 0.250 | [0.100, 0.400] | 32 | 0.100 |",
                    "| 3 | before | 0.000 | [0.000, 0.000] | 64 | None |"]
    path = rl_difficulty.plot(by_d, str(tmp_path / "p.png"))
    assert os.path.getsize(path) > 1000


def test_sweep_samples_difficulty_k_not_eval_samples(monkeypatch, tmp_path):
    """The sweep evaluates `difficulty_k` samples per task even when `eval.samples` asks the main
    evaluation for more (16 would quadruple the sweep's time for a pass@1 it does not need)."""
    import c2jax.train.rl_eval as rl_eval
    import c2jax.train.rl_family as rl_family

    seen = []

    def fake_evaluate(params, cfg, tok, config, rl, tasks, out_dir, seed):
        seen.append(rl_eval.eval_samples(rl["eval"]))
        return {"results": {"overall": {"pass@1": 0.5, "samples": len(tasks) * seen[-1]}}}

    monkeypatch.setattr(rl_eval, "evaluate", fake_evaluate)
    monkeypatch.setattr(rl_family, "load_split", lambda fam, split: list(range(10)))
    monkeypatch.setattr(rl_difficulty, "family_for_difficulty", lambda config, rl, d: f"fam{d}")
    ev = dict(stage_defaults()["eval"], k=8, samples=16, difficulties=(1, 2), difficulty_k=4, difficulty_n_tasks=3)
    out = rl_difficulty.sweep({"before": None}, None, None, None, {"eval": ev, "tasks": {"difficulty": 0}}, 0,
                              str(tmp_path))
    assert seen == [4, 4] and out[1]["before"]["samples"] == 12
