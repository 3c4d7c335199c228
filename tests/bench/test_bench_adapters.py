"""SWE-bench JSONL and Harbor task-directory adapters on fixtures written for these tests
(tests/data/bench): converted tasks run in the local sandbox (oracle resolves, null does not),
the rest are reported unsupported with the reason; malformed inputs name file, line and field."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from _bench_common import DATA, bench_state, needs_bwrap  # noqa: F401
from c2jax.bench.adapters import convert_harbor, convert_swebench, read_swebench_jsonl
from c2jax.bench.adapters.harbor import parse_dockerfile
from c2jax.envs.grading import grade
from c2jax.envs.tasks import TaskFormatError, load_tasks

FIXTURE_BASE = "1ba49ba0bf5b93403cf0dc37194be8bc4902283d"


def make_repo(dst: str) -> str:
    """The calc fixture as a git repository with one commit of a fixed hash."""
    shutil.copytree(os.path.join(DATA, "swebench", "calc_repo"), dst)
    env = {"PATH": "/usr/bin:/bin", "HOME": dst, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "fixture", "GIT_AUTHOR_EMAIL": "f@x", "GIT_COMMITTER_NAME": "fixture",
           "GIT_COMMITTER_EMAIL": "f@x", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    for cmd in (["git", "init", "-q", "-b", "main", "."], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "base"]):
        subprocess.run(cmd, cwd=dst, env=env, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=dst, capture_output=True, text=True).stdout.strip()
    assert head == FIXTURE_BASE, "fixture commit hash changed: update tests/data/bench/swebench/instances.jsonl"
    return dst


@needs_bwrap
def test_swebench_jsonl_runs_locally_and_reports_unsupported(bench_state, tmp_path):
    repos = tmp_path / "repos"
    make_repo(str(repos / "c2jax-fixtures__calc"))
    tasks, unsupported = convert_swebench(os.path.join(DATA, "swebench", "instances.jsonl"), str(repos),
                                          str(tmp_path / "out"), verify_s=120)
    assert [t.instance_id for t in tasks] == ["c2jax-fixtures__calc-1"]
    reasons = {u["instance_id"]: u["reason"] for u in unsupported}
    assert reasons["c2jax-fixtures__ripgrep-7"].startswith("language rust")
    assert "not supplied" in reasons["c2jax-fixtures__absent-2"]
    assert reasons["c2jax-fixtures__calc-py27"].startswith("needs Python 2.7")
    t = load_tasks(str(tmp_path / "out" / "tasks.jsonl"))[0]
    assert t == tasks[0] and t.category == "swebench" and t.hidden_tests.patch
    assert grade(t, t.patch).resolved
    null = grade(t, "")
    assert not null.resolved and null.f2p_fraction == 0.0 and null.p2p_regressions == 0 and not null.masked
    # the hidden test is not in the agent's base (only the base commit is)
    from c2jax.envs import start

    with start(t.env_id, timeout_s=30) as sb:
        assert "test_mul_negative" not in sb.read_file("tests/test_ops.py")
        assert sb.exec(["test", "-e", ".git"]).exit_code != 0


def test_malformed_swebench_lines_name_file_line_field(tmp_path):
    good = open(os.path.join(DATA, "swebench", "instances.jsonl")).readline()
    for mutate, field in ((lambda r: r.pop("base_commit"), "base_commit"),
                          (lambda r: r.__setitem__("FAIL_TO_PASS", "[oops"), "FAIL_TO_PASS"),
                          (lambda r: r.__setitem__("PASS_TO_PASS", [1]), "PASS_TO_PASS"),
                          (lambda r: r.__setitem__("repo", "noslash"), "repo")):
        rec = json.loads(good)
        mutate(rec)
        p = tmp_path / "x.jsonl"
        p.write_text(good + json.dumps(rec) + "\n")
        with pytest.raises(TaskFormatError, match=rf"x.jsonl:2: field '{field}'"):
            read_swebench_jsonl(str(p))


@needs_bwrap
def test_harbor_task_dirs_run_locally_and_report_unsupported(bench_state, tmp_path):
    dirs = [os.path.join(DATA, "harbor", n) for n in ("fix-wordcount", "needs-apt")]
    tasks, unsupported = convert_harbor(dirs, str(tmp_path / "out"))
    assert [t.instance_id for t in tasks] == ["fix-wordcount"]
    assert unsupported == [{"instance_id": "needs-apt", "reason": "needs Docker image ubuntu:22.04"}]
    t = tasks[0]
    assert t.test.runner == "script" and "in /workspace should" in t.problem_statement
    assert "len(text.split())" in t.patch and t.timeouts["verify_s"] == 120
    ok = grade(t, t.patch)
    assert ok.resolved and ok.reward == 1.0
    assert not grade(t, "").resolved
    # a planted reward file earns nothing: the verifier log directory is emptied before the tests
    from c2jax.envs import start

    with start(t.env_id, timeout_s=30) as sb:
        sb.write_file(".c2jax/logs/verifier/reward.txt", "1\n")
        planted = sb.diff()
    r = grade(t, planted)
    assert not r.resolved and any(f.startswith("protected_restored") for f in r.flags)


def test_dockerfile_support_rules():
    ok, why = parse_dockerfile("FROM python:3.11-slim\nWORKDIR /app\nCOPY . /app\nENV A=1\nRUN pip install pytest\n",
                               {"pytest"})
    assert why is None and ok["workdir"] == "/app" and ok["env"] == {"A": "1"}
    assert parse_dockerfile("FROM python:3.9\n", set())[1].startswith("needs Python 3.9")
    assert parse_dockerfile("FROM python:3.11\nRUN pip install numpy\n", {"pytest"})[1] == \
        "needs pip packages not installable offline: numpy"
    assert parse_dockerfile("FROM python:3.11\nRUN make\n", set())[1].startswith("RUN step needs a Docker build")

def test_missing_harbor_task_is_reported_not_raised(tmp_path):
    tasks, unsupported = convert_harbor([os.path.join(DATA, "no-such-task")], str(tmp_path))
    assert tasks == [] and unsupported[0]["reason"].endswith("is not a directory")
