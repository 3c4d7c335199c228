"""SWE-bench adapter inputs as the official harness has them: JSON-array files, ids with '/',
duplicate ids (rejected at convert time), Django/sympy test ids (reported, not graded).
No sandbox needed: everything here is decided before a task is built."""
from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from _bench_common import DATA
from c2jax.bench.adapters import convert_swebench, read_swebench, read_swebench_jsonl
from c2jax.bench.adapters.swebench import pytest_id_problem, swebench_instance_id, task_id_for
from c2jax.bench.run import write_predictions
from c2jax.envs.tasks import TaskFormatError

FIXTURE = os.path.join(DATA, "swebench", "instances.jsonl")
TASK_ID = re.compile(r"^[A-Za-z0-9_.:+\-]{1,200}$")  # c2jax.envs.tasks: what a task id may hold


def _records() -> list[dict]:
    return [json.loads(line) for line in open(FIXTURE) if line.strip()]


def test_json_array_file_reads_like_jsonl(tmp_path):
    arr = tmp_path / "instances.json"
    arr.write_text(json.dumps(_records(), indent=2))
    got, want = read_swebench(str(arr)), read_swebench_jsonl(FIXTURE)
    assert [r for _, r in got] == [r for _, r in want] and len(got) == 4
    assert got[1][0] == f"{arr}[1]" and want[1][0] == f"{FIXTURE}:2"
    bad = _records()
    bad[2].pop("repo")
    arr.write_text(json.dumps(bad))
    with pytest.raises(TaskFormatError, match=re.escape(f"{arr}[2]: field 'repo': missing")):
        read_swebench(str(arr))
    arr.write_text("[{\"instance_id\": ")
    with pytest.raises(TaskFormatError, match="not a valid JSON array"):
        read_swebench(str(arr))


def test_duplicate_instance_ids_are_rejected_at_convert_time(tmp_path):
    recs = _records()
    lines = [recs[0], recs[1], dict(recs[0], problem_statement="again")]
    p = tmp_path / "dup.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(TaskFormatError, match=re.escape(f"{p}:3: field 'instance_id': duplicate of {p}:1")):
        convert_swebench(str(p), None, str(tmp_path / "out"))
    assert not (tmp_path / "out" / "tasks.jsonl").exists()  # nothing half-written
    arr = tmp_path / "dup.json"
    arr.write_text(json.dumps(lines))
    with pytest.raises(TaskFormatError, match=re.escape(f"{arr}[2]: field 'instance_id': duplicate of {arr}[0]")):
        read_swebench(str(arr))


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_task_ids_round_trip_and_never_collide(iid):
    tid = task_id_for(iid)
    assert swebench_instance_id(tid) == iid
    assert TASK_ID.match(tid) or len(tid) > 200
    assert task_id_for(iid + "/x") != task_id_for(iid + "__x")  # the old '/' -> '__' rewrite collided


def test_official_ids_are_kept_and_slashes_round_trip_to_predictions(tmp_path):
    assert task_id_for("django__django-11099") == "django__django-11099"  # real ids are unchanged
    assert task_id_for("org/repo-7") == "org+2Frepo-7" and task_id_for("a+b") == "a+2Bb"
    per_task = [{"instance_id": task_id_for("org/repo-7"), "category": "swebench",
                 "samples": [{"diff": "d"}]},
                {"instance_id": "calc+2Fx", "category": "harbor", "samples": []}]  # not SWE-bench: as is
    path = write_predictions(per_task, str(tmp_path / "predictions.jsonl"), "m")
    rows = [json.loads(line) for line in open(path)]
    assert [(r["instance_id"], r["model_patch"]) for r in rows] == [("org/repo-7", "d"), ("calc+2Fx", "")]


def test_non_pytest_test_ids_are_reported_unsupported(tmp_path):
    base = _records()[0]
    django = dict(base, instance_id="django__django-1", FAIL_TO_PASS=["test_x (admin.tests.AdminTests)"])
    sympy = dict(base, instance_id="sympy__sympy-1", FAIL_TO_PASS=["test_issue_1"], PASS_TO_PASS=[])
    slash = dict(base, instance_id="org/calc-1")  # pytest ids, but no repository supplied here
    p = tmp_path / "x.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in (django, sympy, slash)))
    tasks, unsupported = convert_swebench(str(p), None, str(tmp_path / "out"))
    reasons = {u["instance_id"]: u["reason"] for u in unsupported}
    assert tasks == [] and set(reasons) == {"django__django-1", "sympy__sympy-1", "org/calc-1"}
    assert reasons["django__django-1"].startswith("FAIL_TO_PASS/PASS_TO_PASS ids are not pytest node ids "
                                                  "(Django-style")
    assert "(bare test names (sympy style)" in reasons["sympy__sympy-1"]
    assert "not supplied" in reasons["org/calc-1"]  # its ids are fine: it fails later, for the repository
    assert pytest_id_problem(["tests/test_ops.py::test_a[1-2]", "t.py::C::test_b"]) is None
