"""Harbor adapter on task directories as real batches have them: a per-task problem is an
`unsupported` entry and never aborts the others; task.toml's [task] name/version,
[environment].workdir / docker_image and reward.json verifiers are honoured; a separate verifier
environment, multi-step and non-Linux tasks are listed with the reason.

Built from tests/data/bench/harbor/fix-wordcount, varied per test. The sandbox test converts and
grades (oracle resolves, null does not); the others are decided before any sandbox starts.
"""
from __future__ import annotations

import os
import shutil

import pytest

from _bench_common import DATA, bench_state, needs_bwrap  # noqa: F401
from c2jax.bench.adapters import convert_harbor
from c2jax.bench.adapters.ids import original_id

BASE = os.path.join(DATA, "harbor", "fix-wordcount")


def variant(root, name: str, toml_extra: str = "", files: dict | None = None, drop: tuple = ()) -> str:
    """A copy of fix-wordcount named `name`, with text appended to task.toml, files (path -> str or
    bytes) written and paths removed."""
    d = os.path.join(str(root), name)
    shutil.copytree(BASE, d)
    with open(os.path.join(d, "task.toml"), "a") as f:
        f.write(toml_extra)
    for rel, content in (files or {}).items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
    for rel in drop:
        p = os.path.join(d, rel)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    return d


def test_per_task_problems_are_unsupported_entries_not_aborts(tmp_path):
    dirs = [
        variant(tmp_path, "binary-test", files={"tests/data.bin": b"\x00\xff\xfe binary"}),
        variant(tmp_path, "image-no-dockerfile", "\n[environment.extra]\n", drop=("environment/Dockerfile",)),
        variant(tmp_path, "ubuntu-image", files={"task.toml": 'version = "1.0"\n[environment]\n'
                                                              'docker_image = "ubuntu:24.04"\n'},
                drop=("environment/Dockerfile",)),
        variant(tmp_path, "separate-verifier", '\n[verifier.environment]\ndocker_image = "verifier:1"\n'),
        variant(tmp_path, "separate-mode", files={"task.toml": 'version = "1.0"\n[verifier]\n'
                                                               'environment_mode = "separate"\n'}),
        variant(tmp_path, "multi-step", '\n[[steps]]\nname = "one"\n'),
        variant(tmp_path, "windows", files={"task.toml": '[environment]\nos = "windows"\n'}),
        variant(tmp_path, "bad-toml", files={"task.toml": "[agent\n"}),
        variant(tmp_path, "bad-timeout", files={"task.toml": "[agent]\ntimeout_sec = -1\n"}),
        variant(tmp_path, "latin1-instruction", files={"instruction.md": b"caf\xe9\n"}),
        variant(tmp_path, "no-oracle", drop=("solution",)),
        str(tmp_path / "does-not-exist"),
    ]
    tasks, unsupported = convert_harbor(dirs, str(tmp_path / "out"))
    assert tasks == []
    got = {u["instance_id"]: u["reason"] for u in unsupported}
    assert list(got) == [os.path.basename(d) for d in dirs]  # every task reported, in order
    assert got["binary-test"] == "tests/data.bin is a binary file (hidden tests are stored as text)"
    assert got["image-no-dockerfile"] == "neither environment/Dockerfile nor [environment].docker_image"
    assert got["ubuntu-image"] == "needs Docker image ubuntu:24.04"
    assert got["separate-verifier"].startswith("the verifier runs in a separate environment (image verifier:1)")
    assert got["separate-mode"].startswith("the verifier runs in a separate environment:")
    assert got["multi-step"].startswith("multi-step task")
    assert got["windows"].startswith("environment os 'windows'")
    assert got["bad-toml"].startswith("task.toml is not valid TOML")
    assert got["bad-timeout"] == "task.toml: 'agent.timeout_sec' must be a positive number, got -1"
    assert got["latin1-instruction"] == "instruction.md is not UTF-8 text"
    assert got["no-oracle"].startswith("no solution/solve.sh")
    assert got["does-not-exist"].endswith("is not a directory")
    assert (tmp_path / "out" / "tasks.jsonl").read_text() == ""


WORKDIR_DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /\nCOPY app/ /srv/app/\nRUN pip install pytest\n"
REWARD_JSON_TEST = """#!/bin/bash
cd /srv/app
if [ "$(cat greeting.txt)" = "hello" ]; then r=1; else r=0; fi
printf '{"reward": %s, "style": 1}' "$r" > /logs/verifier/reward.json
echo 0 > /logs/verifier/reward.txt   # reward.json wins, as in Harbor
"""


@pytest.mark.slow  # three conversions + seven gradings in the sandbox (~2 min on a busy 2-core machine)
@needs_bwrap
def test_name_version_workdir_image_and_reward_json_are_honoured(bench_state, tmp_path):
    from c2jax.envs.grading import grade

    named = variant(tmp_path, "named", files={"tests/__pycache__/test_outputs.cpython-311.pyc": b"\x00\x01\xa7\r",
                                              "tests/helper.pyc": b"\x00\x01"},
                    toml_extra='\n[task]\nname = "acme/fix-wordcount"\nversion = "2.1.0"\n')
    workdir = variant(tmp_path, "workdir", files={
        "task.toml": '[environment]\nworkdir = "/srv/app"\n[verifier]\ntimeout_sec = 60\n',
        "environment/Dockerfile": WORKDIR_DOCKERFILE,
        "tests/test.sh": REWARD_JSON_TEST,
        "solution/solve.sh": "#!/bin/bash\ncd /srv/app\necho hello > greeting.txt\n"})
    image = variant(tmp_path, "image-only", files={
        "task.toml": '[environment]\ndocker_image = "python:3.11-slim"\nworkdir = "/srv/app"\n',
        "tests/test.sh": REWARD_JSON_TEST,
        "solution/solve.sh": "#!/bin/bash\nmkdir -p /srv/app && cd /srv/app && echo hello > greeting.txt\n"},
        drop=("environment/Dockerfile", "environment/app"))
    dup = variant(tmp_path, "named-again", toml_extra='\n[task]\nname = "acme/fix-wordcount"\n')
    tasks, unsupported = convert_harbor([named, workdir, image, dup], str(tmp_path / "out"))
    by_id = {t.instance_id: t for t in tasks}
    assert list(by_id) == ["acme+2Ffix-wordcount", "workdir", "image-only"]
    assert unsupported == [{"instance_id": "named-again",
                            "reason": f"duplicate task name 'acme/fix-wordcount' (also {named})"}]
    t = by_id["acme+2Ffix-wordcount"]
    assert original_id(t.instance_id) == "acme/fix-wordcount" == t.source.package and t.source.version == "2.1.0"
    assert not any(p.endswith(".pyc") for p in t.hidden_tests.files)  # compiled files skipped
    assert grade(t, t.patch).resolved and not grade(t, "").resolved
    for tid in ("workdir", "image-only"):
        t = by_id[tid]
        assert "greeting.txt" in t.patch and t.provenance["workdir"] == "/srv/app"
        ok = grade(t, t.patch)
        assert ok.resolved and ok.reward == 1.0, (tid, ok.flags, ok.detail[-300:])
        null = grade(t, "")  # reward.json says 0 (reward.txt's 0 too, but it would not win)
        assert not null.resolved and null.reward == 0.0
