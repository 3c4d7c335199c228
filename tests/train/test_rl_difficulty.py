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
