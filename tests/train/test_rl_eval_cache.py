"""The RL stage's evaluation reuses rows cached in its output directory only when they answer the
same question: the same held-out tasks, in order, with the configured samples per task."""
from __future__ import annotations

import json
import types

import pytest

from c2jax.train import rl_eval


def _tasks(n: int) -> list:
    return [types.SimpleNamespace(instance_id=f"t{i}") for i in range(n)]


def _rows(n: int, samples: int) -> list:
    """Evaluation rows in the harness's format (the sample keys of an unmasked episode)."""
    from c2jax.bench.agent_eval import _exception_row

    def sample(t, s):
        return dict(_exception_row(t, s, RuntimeError()), masked=False, masked_reason="", resolved=(s % 2 == 0),
                    stop_reason="finish")

    return [{"instance_id": t.instance_id, "category": "c", "codebase": "x", "split": "eval",
             "samples": [sample(t, s) for s in range(samples)]} for t in _tasks(n)]


def test_mismatch_names_what_differs():
    assert rl_eval.cached_rows_mismatch(_rows(3, 8), _tasks(3), 8) is None
    assert "samples per task" in rl_eval.cached_rows_mismatch(_rows(3, 8), _tasks(3), 16)
    assert "tasks differ" in rl_eval.cached_rows_mismatch(_rows(2, 8), _tasks(3), 8)
    assert "tasks differ" in rl_eval.cached_rows_mismatch(list(reversed(_rows(3, 8))), _tasks(3), 8)


class _WouldEvaluate(Exception):
    pass


def _no_engine(*a, **k):
    raise _WouldEvaluate("the evaluation ran instead of reusing the cache")


@pytest.mark.parametrize("wanted", [8, 16])
def test_evaluate_reuses_only_matching_rows(tmp_path, monkeypatch, wanted):
    """Cached rows of 8 samples stand for an 8-sample evaluation; for a 16-sample one the evaluation
    runs again (here it reaches the engine, replaced by one that raises: the positive control that a
    mismatch is not silently reported from the old rows)."""
    import c2jax.sampling

    monkeypatch.setattr(c2jax.sampling, "Engine", _no_engine)
    (tmp_path / "rows.json").write_text(json.dumps(_rows(4, 8)))
    rl = {"eval": {"k": 8, "samples": wanted, "temperature": 1.0, "max_in_flight": 4}, "max_len": 64,
          "grade_cache": True}
    if wanted == 8:
        got = rl_eval.evaluate(None, None, None, None, rl, _tasks(4), str(tmp_path), 0)
        assert got["rows"] == _rows(4, 8) and got["results"]["overall"]["samples"] == 32
    else:
        with pytest.raises(_WouldEvaluate):
            rl_eval.evaluate(None, None, None, None, rl, _tasks(4), str(tmp_path), 0)
