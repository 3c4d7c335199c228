"""A benchmark run interrupted mid-way resumes from its journal: finished tasks are not redone.

Uses the session's c2bench-mini build (tests/_bench_common.py).
"""
from __future__ import annotations

import json
import os

import pytest

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from c2jax.bench.policies import Attempt
from c2jax.bench.run import run_suite

pytestmark = needs_bwrap


class Interrupted(RuntimeError):
    pass


class CountingOracle:
    """The gold patch, counting calls; raises on call number `die_at` (a crash mid-run)."""

    name = "oracle"

    def __init__(self, die_at: int | None = None):
        self.calls: list[str] = []
        self.die_at = die_at

    def solve(self, task, sample):
        self.calls.append(task.instance_id)
        if self.die_at is not None and len(self.calls) == self.die_at:
            raise Interrupted(task.instance_id)
        return Attempt(task.patch)


def test_interrupted_run_resumes_without_redoing_finished_tasks(mini_suite, tmp_path):
    _, tasks, _, _ = mini_suite
    tasks = tasks[:5]
    out = str(tmp_path / "run")
    first = CountingOracle(die_at=4)
    with pytest.raises(Interrupted):
        run_suite(tasks, first, out, workers=1)
    # Queued tasks are cancelled (the one worker may already have taken the next).
    assert first.calls[:4] == [t.instance_id for t in tasks[:4]] and len(first.calls) <= 5
    journal = os.path.join(out, "journal.jsonl")
    done = [json.loads(x)["instance_id"] for x in open(journal)]
    assert done == [t.instance_id for t in tasks[:3]]
    with open(journal, "a") as f:
        f.write('{"policy": "oracle", "k": 1, "instance_id": "torn')  # the line being written at the kill
    second = CountingOracle()
    summary = run_suite(tasks, second, out, workers=1)
    assert second.calls == [t.instance_id for t in tasks[3:]]
    assert summary["overall"]["pass@1"] == 1.0 and summary["overall"]["tasks"] == len(tasks)
    res = json.load(open(os.path.join(out, "results.json")))
    assert [r["instance_id"] for r in res["tasks"]] == [t.instance_id for t in tasks]
    splits = {t.split for t in tasks}
    assert set(summary["by_split"]) == splits
    assert sum(b["tasks"] for b in summary["by_split"].values()) == len(tasks)
    assert all(f"split:{sp}" in summary["table"] for sp in splits)
    # Another policy name or k does not reuse the journal; --fresh (resume=False) drops it.
    third = CountingOracle()
    run_suite(tasks[:2], third, out, workers=1, k=2)
    assert third.calls == [t.instance_id for t in tasks[:2] for _ in range(2)]
    fourth = CountingOracle()
    run_suite(tasks[:1], fourth, out, workers=1, resume=False)
    assert fourth.calls == [tasks[0].instance_id]


def test_changed_task_or_masked_row_is_rerun(mini_suite, tmp_path):
    _, tasks, _, _ = mini_suite
    out = str(tmp_path / "run")
    run_suite(tasks[:2], CountingOracle(), out, workers=1)
    journal = os.path.join(out, "journal.jsonl")
    rows = [json.loads(x) for x in open(journal)]
    rows[1]["row"]["samples"][0]["masked"] = True  # an infrastructure failure: retried on resume
    with open(journal, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    edited = [tasks[0].replace(problem_statement=tasks[0].problem_statement + " (edited)"), tasks[1]]
    again = CountingOracle()
    run_suite(edited, again, out, workers=1)
    assert again.calls == [tasks[0].instance_id, tasks[1].instance_id]
