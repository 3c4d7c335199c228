"""c2jax task record -> Harbor task directory (the reverse of `harbor.convert_harbor`).

    path = export_harbor(task, "out/harbor")     # out/harbor/<name>/{task.toml, instruction.md, ...}

Layout written (Harbor's task format, task.toml schema 1.4):

    task.toml              [task] name ("org/name") + version, [metadata], [agent]/[verifier]
                           timeout_sec, [environment] workdir = "/workspace"
    instruction.md         the problem statement
    environment/Dockerfile FROM python:<this X.Y>-slim, WORKDIR /workspace, COPY workspace/,
                           pip install pytest==<the version here> (pinned: Harbor's linter asks for it)
    environment/workspace/ the task environment's files (read from a sandbox of its env_id)
    tests/test.sh          puts the hidden tests in place, runs them, writes /logs/verifier/reward.txt
    tests/files/...        hidden test files as they must be in /workspace (test patch already applied)
    solution/solve.sh      the oracle: writes the files the gold patch changes (heredocs), removes deleted ones

The verifier shares the agent's sandbox, as c2jax grades (the agent's changes are what it checks),
so task.toml says ``[metadata.harbor.lint] ignore = ["shared-verifier"]``: Harbor's linter
recommends a separate verifier image, which would need the workspace shipped across as artifacts.

Reward: pytest tasks score 1 when every FAIL_TO_PASS and PASS_TO_PASS node id passes (one pytest run
over exactly those ids), else 0; tasks without ids use the exit status of their test command.
Tasks that came from Harbor (``source.kind == 'harbor'``) get their verifier back verbatim, with the
local paths (/workspace/.c2jax/tests, /workspace/.c2jax/logs/verifier) turned back into /tests and
/logs/verifier, and their package name. Text files only: a binary file in a patch or hidden test
raises `HarborExportError`, as do symlinks in the workspace.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from typing import Any

from c2jax.bench.adapters.harbor import LOG_DIR, TESTS_DIR
from c2jax.envs.grading import diff_paths
from c2jax.envs.tasks import TaskRecord

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")  # Harbor's ORG_NAME_PATTERN


class HarborExportError(ValueError):
    """The task cannot be written as a Harbor task directory; the message says why."""


def harbor_name(task: TaskRecord, org: str = "c2jax") -> str:
    """The ``org/name`` package name: a Harbor task's own, else ``org/<instance id, sanitised>``."""
    if task.source.kind == "harbor" and NAME_RE.match(task.source.package) and ".." not in task.source.package:
        return task.source.package
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", task.instance_id).lstrip("._-") or "task"
    return f"{org}/{name.replace('..', '.')}"


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _heredoc(path: str, text: str) -> str:
    tag = "C2JAX_EOF"
    while tag in text:
        tag += "_"
    q = shlex.quote(path)
    mkdir = f"mkdir -p \"$(dirname {q})\"\n"
    if not text:
        return f"{mkdir}: > {q}\n"
    body = text if text.endswith("\n") else text + "\n"
    strip = "" if text.endswith("\n") else f"truncate -s -1 {q}\n"  # keep a missing final newline
    return f"{mkdir}cat > {q} <<'{tag}'\n{body}{tag}\n{strip}"


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HarborExportError(f"{what} is a binary file: Harbor export writes text files only") from None


def _patched(env_id: str, patch: str, what: str) -> tuple[dict[str, str], list[str]]:
    """({path: text after the patch}, [deleted paths]) of the files `patch` touches in `env_id`."""
    from c2jax.envs import start

    paths, problems = diff_paths(patch)
    if problems:
        raise HarborExportError(f"{what}: {problems[0]}")
    if not patch.strip():
        return {}, []
    with start(env_id, timeout_s=120) as sb:
        r = sb.exec(["git", "apply", "--binary", "--whitespace=nowarn", "-"], stdin=patch)
        if r.exit_code != 0:
            raise HarborExportError(f"{what} does not apply to the task's environment: {r.stderr[-300:]}")
        changed, deleted = {}, []
        for p in sorted(paths):
            if sb.exec(["test", "-f", p]).exit_code == 0:
                changed[p] = _text(sb.read_file(p, binary=True), f"{what}: {p}")
            else:
                deleted.append(p)
    return changed, deleted


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)


def _export_workspace(env_id: str, dst: str) -> None:
    from c2jax.envs import start

    with start(env_id, timeout_s=300) as sb:
        r = sb.exec(["bash", "-c", "find . -path ./.c2jax -prune -o \\( -type f -o -type l \\) -printf '%y %p\\0'"])
        if r.exit_code != 0:
            raise HarborExportError(f"cannot list the environment's files: {r.stderr[-300:]}")
        for entry in filter(None, r.stdout.split("\0")):
            kind, rel = entry[0], os.path.normpath(entry[2:])
            if kind == "l":
                raise HarborExportError(f"{rel} is a symlink: not exported")
            target = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(sb.read_file(rel, binary=True))


def _from_local_paths(text: str) -> str:
    return text.replace(f"/workspace/{TESTS_DIR}", "/tests").replace(f"/workspace/{LOG_DIR}", "/logs/verifier")


def _tests(task: TaskRecord, tests_dir: str) -> None:
    """tests/: the verifier script and the files it needs."""
    ht = task.hidden_tests
    if task.source.kind == "harbor" and task.test.runner == "script":
        for p, text in ht.files.items():
            if not p.startswith(TESTS_DIR + "/"):
                raise HarborExportError(f"hidden file {p} is outside {TESTS_DIR}/")
            _write(os.path.join(tests_dir, p[len(TESTS_DIR) + 1:]), _from_local_paths(text), 0o755)
        return
    files = dict(ht.files)
    changed, deleted = _patched(task.env_id, ht.patch, "the hidden test patch")
    files.update(changed)
    for p, text in files.items():
        _write(os.path.join(tests_dir, "files", p), text)
    ids = list(ht.FAIL_TO_PASS) + list(ht.PASS_TO_PASS)
    if task.test.runner == "pytest" and ids:
        run = " ".join(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(shlex.quote, ids)])
    else:
        run = " ".join(map(shlex.quote, task.test.cmd))
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(task.test.env.items()))
    rm = "".join(f"rm -f {shlex.quote(p)}\n" for p in deleted)
    script = ("#!/bin/bash\n# Verifier exported by c2jax: hidden tests into place, run them, reward 1 iff they pass.\n"
              "mkdir -p /logs/verifier\ncd /workspace\n"
              + ("cp -r /tests/files/. /workspace/\n" if files else "") + rm + env +
              f"if {run}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    _write(os.path.join(tests_dir, "test.sh"), script, 0o755)


def _dockerfile(task: TaskRecord) -> str:
    from importlib.metadata import version

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = task.test.env if task.source.kind == "harbor" else {}  # a Harbor task's ENV lines
    return (f"FROM python:{here}-slim\nWORKDIR /workspace\n" +
            "".join(f"ENV {k}={json.dumps(_from_local_paths(v))}\n" for k, v in sorted(env.items())) +
            f"COPY workspace/ /workspace/\nRUN pip install pytest=={version('pytest')}\n")


def _task_toml(task: TaskRecord, name: str) -> str:
    version = task.source.version or "0"
    meta = {"category": task.category, "subcategory": task.subcategory, "license": task.source.license,
            "c2jax_instance_id": task.instance_id, "c2jax_source": task.source.kind}
    lines = ['schema_version = "1.4"', "", "[task]", f"name = {_toml_str(name)}", f"version = {_toml_str(version)}",
             "", "[metadata]"]
    lines += [f"{k} = {_toml_str(str(v))}" for k, v in meta.items() if v]
    lines += ["", "[agent]", f"timeout_sec = {float(task.timeouts.get('agent_s', 600.0))}",
              "", "[verifier]", f"timeout_sec = {float(task.timeouts.get('verify_s', 600.0))}",
              "", "[environment]", 'workdir = "/workspace"',
              "", "[metadata.harbor.lint]", 'ignore = ["shared-verifier"]  # graded in the agent\'s sandbox', ""]
    return "\n".join(lines)


def export_harbor(task: TaskRecord, out_dir: str, *, org: str = "c2jax") -> str:
    """Write `task` as a Harbor task directory under `out_dir`; returns its path (see module docstring)."""
    name = harbor_name(task, org)
    d = os.path.join(out_dir, name.split("/", 1)[1])
    if os.path.exists(d):
        raise HarborExportError(f"{d} already exists")
    staging = d + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        gold, deleted = _patched(task.env_id, task.patch, "the gold patch")
        _export_workspace(task.env_id, os.path.join(staging, "environment", "workspace"))
        _tests(task, os.path.join(staging, "tests"))
        _write(os.path.join(staging, "environment", "Dockerfile"), _dockerfile(task))
        _write(os.path.join(staging, "instruction.md"), task.problem_statement.rstrip("\n") + "\n")
        solve = "#!/bin/bash\n# Oracle exported by c2jax: the files the gold patch changes.\nset -e\ncd /workspace\n"
        solve += "".join(_heredoc(p, text) for p, text in gold.items())
        solve += "".join(f"rm -f {shlex.quote(p)}\n" for p in deleted)
        _write(os.path.join(staging, "solution", "solve.sh"), solve, 0o755)
        _write(os.path.join(staging, "task.toml"), _task_toml(task, name))
        os.rename(staging, d)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return d


def export_many(tasks: list[TaskRecord], out_dir: str, *, org: str = "c2jax") -> tuple[list[str], list[dict[str, Any]]]:
    """Export each task; (directories, [{instance_id, reason}] for those that could not be exported)."""
    done, failed = [], []
    for t in tasks:
        try:
            done.append(export_harbor(t, out_dir, org=org))
        except HarborExportError as e:
            failed.append({"instance_id": t.instance_id, "reason": str(e)})
    return done, failed
