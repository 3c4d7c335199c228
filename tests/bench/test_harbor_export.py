"""Export direction: c2jax task -> Harbor task directory.

The official `harbor` package needs Python >= 3.12 (every release on the registry says so; this is
3.11), so it cannot be installed here. The format is checked against its source as released
(harbor 0.26.0: models/task/config.py TaskConfig and its sections, models/task/paths.py layout,
lint/task.py default rules), and the round trip runs through this repository's Harbor importer,
which follows Harbor's semantics (solve.sh as oracle, test.sh writes the reward).
"""
from __future__ import annotations

import os
import re
import subprocess
import tomllib

import pytest

from _bench_common import DATA, bench_state, needs_bwrap  # noqa: F401
from c2jax.bench.adapters.harbor_export import NAME_RE, _heredoc, _task_toml, export_many, harbor_name
from c2jax.envs.tasks import HiddenTests, Source, TaskRecord, TestSpec

# harbor 0.26.0 models/task/config.py: the fields of TaskConfig and of the sections written here
TASK_CONFIG = {"schema_version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
               "multi_step_reward_strategy", "steps", "artifacts", "version"}
SECTIONS = {"task": {"name", "version", "description", "authors", "keywords"},
            "agent": {"timeout_sec", "user"},
            "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect"},
            "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus",
                            "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck", "workdir"}}
LINT_RULES = {"invalid-task-config", "unknown-config-field", "invalid-task-files", "unused-harborignore",
              "root-agent", "shared-verifier", "overlapping-artifacts", "artifact-log-overlap", "unpinned-image",
              "unpinned-python-dependency", "verifier-runtime-install", "verifier-network-download",
              "agent-image-test-leak"}


def _task(**kw) -> TaskRecord:
    base = dict(instance_id="org+2Frepo-1:x", source=Source("swebench", "org/repo", "0.1", "", "MIT"),
                codebase="org/repo", env_id="unused", category="swebench", subcategory="", problem_statement="Fix it.",
                test=TestSpec("pytest", ("python", "-m", "pytest"), "/workspace", {}),
                timeouts={"agent_s": 900.0, "verify_s": 60.0}, limits={},
                hidden_tests=HiddenTests({}, ("a.py::t",), ()),
                patch="", protected_paths=(), provenance={}, stats={}, split="eval")
    base.update(kw)
    return TaskRecord(**base)


def check_task_toml(text: str) -> dict:
    """task.toml as Harbor 0.26 reads it: known fields only, [task].name in org/name form."""
    cfg = tomllib.loads(text)
    assert set(cfg) <= TASK_CONFIG, set(cfg) - TASK_CONFIG
    for sect, keys in SECTIONS.items():
        assert set(cfg.get(sect, {})) <= keys, (sect, set(cfg[sect]) - keys)
    assert NAME_RE.match(cfg["task"]["name"]) and ".." not in cfg["task"]["name"]
    assert cfg["task"]["version"] and cfg["verifier"]["timeout_sec"] > 0 and cfg["agent"]["timeout_sec"] > 0
    assert set(cfg["metadata"]["harbor"]["lint"]["ignore"]) <= LINT_RULES  # metadata.harbor.lint: its lint config
    return cfg


def test_task_toml_names_and_heredocs(tmp_path):
    t = _task()
    name = harbor_name(t)
    assert name == "c2jax/org-2Frepo-1-x" and NAME_RE.match(name)
    assert harbor_name(_task(source=Source("harbor", "acme/fix", "2", "", ""))) == "acme/fix"  # its own name back
    assert harbor_name(_task(instance_id="..weird", source=Source("harbor", "bad name", "", "", ""))) == "c2jax/weird"
    cfg = check_task_toml(_task_toml(t, name))
    assert cfg["environment"]["workdir"] == "/workspace" and cfg["verifier"]["timeout_sec"] == 60.0
    assert cfg["metadata"]["c2jax_instance_id"] == t.instance_id
    # the oracle's heredocs write exactly the text, a missing final newline and a clashing marker included
    texts = {"a/b.py": "x = 1\n", "c.txt": "no newline", "d.sh": "C2JAX_EOF\nstill text\n", "e.txt": ""}
    script = "set -e\n" + "".join(_heredoc(p, s) for p, s in texts.items())
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    for p, s in texts.items():
        assert (tmp_path / p).read_text() == s, p


def _check_layout(d: str) -> dict:
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
        assert os.path.isfile(os.path.join(d, rel)), rel
    for rel in ("tests/test.sh", "solution/solve.sh"):
        assert os.access(os.path.join(d, rel), os.X_OK), rel
    docker = open(os.path.join(d, "environment", "Dockerfile")).read()
    assert re.search(r"^RUN pip install pytest==\d", docker, re.M)  # unpinned-python-dependency
    for line in docker.splitlines():  # agent-image-test-leak: no grading/solution files in the image
        if line.startswith(("COPY", "ADD")):
            assert not re.search(r"(?:^|/)(?:solution/solve\.sh|tests/(?:test\.sh|test_[^/]+\.py))", line)
    return check_task_toml(open(os.path.join(d, "task.toml")).read())


@pytest.mark.slow  # two conversions, two exports, a re-import with oracle grading (~3 min on a busy 2-core machine)
@needs_bwrap
def test_export_round_trips_through_the_harbor_importer(bench_state, tmp_path):
    from test_bench_adapters import make_repo

    from c2jax.bench.adapters import convert_harbor, convert_swebench
    from c2jax.envs.grading import grade

    make_repo(str(tmp_path / "repos" / "c2jax-fixtures__calc"))
    swe, _ = convert_swebench(os.path.join(DATA, "swebench", "instances.jsonl"), str(tmp_path / "repos"),
                              str(tmp_path / "swe"), verify_s=120, validate=False)
    hb, _ = convert_harbor([os.path.join(DATA, "harbor", "fix-wordcount")], str(tmp_path / "hb"), validate=False)
    dirs, failed = export_many([swe[0], hb[0]], str(tmp_path / "exported"))
    assert failed == [] and [os.path.basename(d) for d in dirs] == ["c2jax-fixtures__calc-1", "fix-wordcount"]
    cfgs = [_check_layout(d) for d in dirs]
    # the Harbor fixture has no [task] table: its directory name is no org/name, so it gets the c2jax org
    assert [c["task"]["name"] for c in cfgs] == ["c2jax/c2jax-fixtures__calc-1", "c2jax/fix-wordcount"]
    # the Harbor task's verifier comes back verbatim (its WORKDIR is /workspace now)
    orig = open(os.path.join(DATA, "harbor", "fix-wordcount", "tests", "test.sh")).read()
    assert open(os.path.join(dirs[1], "tests", "test.sh")).read() == orig.replace("cd /app", "cd /workspace")
    assert "test_mul_negative" not in open(os.path.join(dirs[0], "environment", "workspace", "tests",
                                                        "test_ops.py")).read()  # hidden tests stay out of the image
    back, unsupported = convert_harbor(dirs, str(tmp_path / "back"))  # validate: each oracle passes its verifier
    assert unsupported == [] and len(back) == 2
    for t in back:
        assert not grade(t, "").resolved, t.instance_id  # and the untouched workspace does not
