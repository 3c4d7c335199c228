"""SWE-bench-format instances -> c2jax task records, run in the local sandbox.

Input: a JSONL file (one instance per line) or a JSON array of instances (the two forms the
official harness's loader reads from disk). Each instance: instance_id, repo, base_commit, patch
(gold), test_patch (hidden tests), FAIL_TO_PASS, PASS_TO_PASS (lists, or JSON-encoded lists as in
the HF dataset), optional problem_statement. A task is converted when the user supplies the
repository (`repos_dir/<owner>__<name>`, a git checkout holding `base_commit`), its tests are
pytest node ids (``path/test_x.py::test_y``: the grader runs pytest) and it needs only what pip
installs on this Python offline (the runner's pytest wheelhouse). Otherwise it is listed as
unsupported with the reason: another language or Docker image, another Python version, packages
not available offline, a missing repository or commit, Django/sympy-style test ids. Malformed or
duplicate instances raise TaskFormatError naming file, line (or array index) and field.

Ids: a c2jax task id allows ``[A-Za-z0-9_.:+-]``; an instance id with other characters (``/``) is
escaped reversibly (`task_id_for`: each such byte and ``+`` become ``+HH``), so
`swebench_instance_id` gives back the exact official id (predictions.jsonl is written with it) and
two distinct instance ids never share a task id.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

from c2jax.envs.grading import diff_paths
from c2jax.envs.tasks import (DEFAULT_PROTECTED, HiddenTests, Source, TaskFormatError, TaskRecord, TestSpec,
                              iter_jsonl, patch_stats)

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


def task_id_for(instance_id: str) -> str:
    """The c2jax task id of a SWE-bench instance id (identical unless it has characters outside
    ``[A-Za-z0-9_.:-]``, which become ``+HH`` per UTF-8 byte; reversible, see module docstring)."""
    return "".join(c if c in _PLAIN else "".join(f"+{b:02X}" for b in c.encode("utf-8")) for c in instance_id)


def swebench_instance_id(task_id: str) -> str:
    """Inverse of `task_id_for`: the official instance id of a converted task."""
    raw, i = bytearray(), 0
    while i < len(task_id):
        if task_id[i] == "+":
            raw.append(int(task_id[i + 1:i + 3], 16))
            i += 3
        else:
            raw += task_id[i].encode()
            i += 1
    return raw.decode("utf-8")


def pytest_id_problem(test_ids: list[str]) -> str | None:
    """Why `test_ids` are not pytest node ids (``file.py::name``), or None. SWE-bench's Django
    instances use ``test_x (module.Class)`` and sympy's bare ``test_x``: their harness runs each
    repository's own test runner, this adapter grades with pytest."""
    bad = [t for t in test_ids if "::" not in t or not t.split("::", 1)[0].endswith(".py")]
    if not bad:
        return None
    style = "Django-style 'test (module.Class)'" if re.search(r"\(\w[\w.]*\)\s*$", bad[0]) else \
        "bare test names (sympy style)" if re.fullmatch(r"\w+", bad[0]) else "not 'file.py::name'"
    return (f"FAIL_TO_PASS/PASS_TO_PASS ids are not pytest node ids ({style}, e.g. {bad[0]!r}; {len(bad)} of "
            f"{len(test_ids)}): the official harness runs this repository's own test runner, this adapter grades "
            f"with pytest")


def _id_list(v: Any, where: str, field: str) -> list[str]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise TaskFormatError(f"{where}: field {field!r}: not a JSON list") from None
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise TaskFormatError(f"{where}: field {field!r}: expected a list of test ids")
    return v


def _instances(path: str) -> list[tuple[str, Any]]:
    """[(where, value)] from a JSON array file (where = file[index]) or a JSONL file (file:line)."""
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if not head.startswith("["):
        return [(where, rec) for _, where, rec in iter_jsonl(path)]
    with open(path, encoding="utf-8") as f:
        try:
            arr = json.load(f)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{path}: not a valid JSON array ({e})") from None
    return [(f"{path}[{i}]", rec) for i, rec in enumerate(arr)]


def read_swebench(path: str) -> list[tuple[str, dict]]:
    """[(where, record)] of a JSONL or JSON-array file, required fields checked, ids unique;
    FAIL_TO_PASS/PASS_TO_PASS decoded to lists."""
    out = []
    seen: dict[str, str] = {}
    for where, rec in _instances(path):
        if not isinstance(rec, dict):
            raise TaskFormatError(f"{where}: field '<record>': expected a JSON object")
        for k in REQUIRED:
            if k not in rec:
                raise TaskFormatError(f"{where}: field {k!r}: missing")
        for k in ("instance_id", "repo", "base_commit", "patch", "test_patch"):
            if not isinstance(rec[k], str):
                raise TaskFormatError(f"{where}: field {k!r}: expected a string")
        iid = rec["instance_id"]
        if not iid or len(task_id_for(iid)) > 200:
            raise TaskFormatError(f"{where}: field 'instance_id': must be 1..200 characters once escaped, got {iid!r}")
        if "/" not in rec["repo"]:
            raise TaskFormatError(f"{where}: field 'repo': expected 'owner/name'")
        rec["FAIL_TO_PASS"] = _id_list(rec["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
        rec["PASS_TO_PASS"] = _id_list(rec["PASS_TO_PASS"], where, "PASS_TO_PASS")
        if not rec["FAIL_TO_PASS"]:
            raise TaskFormatError(f"{where}: field 'FAIL_TO_PASS': empty")
        if iid in seen:
            raise TaskFormatError(f"{where}: field 'instance_id': duplicate of {seen[iid]} ({iid!r})")
        seen[iid] = where
        out.append((where, rec))
    return out


read_swebench_jsonl = read_swebench  # the earlier name


def unsupported_reason(rec: dict, repos_dir: str | None, offline_packages: set[str]) -> str | None:
    lang = str(rec.get("language", "python")).lower()
    if lang not in ("python", "py"):
        return f"language {lang}: needs a Docker image with its toolchain"
    image = rec.get("docker_image") or rec.get("image_name")
    if image:
        return f"needs Docker image {image}"
    want = rec.get("python") or rec.get("python_version")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and not str(want).startswith(here):
        return f"needs Python {want} (this is {here})"
    reqs = rec.get("requirements") or []
    missing = sorted({r.split("=")[0].split("<")[0].split(">")[0].strip().lower() for r in reqs} - offline_packages)
    if missing:
        return f"needs pip packages not installable offline: {', '.join(missing)}"
    why = pytest_id_problem(rec["FAIL_TO_PASS"] + rec["PASS_TO_PASS"])
    if why:
        return why
    if not repos_dir:
        return f"repository {rec['repo']} not supplied (--repos DIR with {rec['repo'].replace('/', '__')})"
    repo = os.path.join(repos_dir, rec["repo"].replace("/", "__"))
    if not os.path.isdir(repo):
        return f"repository {rec['repo']} not supplied ({repo} missing)"
    r = subprocess.run(["git", "-C", repo, "cat-file", "-e", f"{rec['base_commit']}^{{commit}}"], capture_output=True)
    if r.returncode != 0:
        return f"base commit {rec['base_commit'][:12]} not in {repo}"
    return None


def convert_swebench(path: str, repos_dir: str | None, out_dir: str, *, verify_s: float = 600.0,
                     validate: bool = True) -> tuple[list[TaskRecord], list[dict]]:
    """Convert a SWE-bench JSONL or JSON-array file into task records (written to out_dir/tasks.jsonl).

    Returns (tasks, unsupported [{instance_id, reason}]). With `validate`, each converted task is
    graded with its gold patch and kept only if resolved (else reported unsupported with why).
    """
    from c2jax.envs import images
    from c2jax.envs.grading import grade
    from c2jax.envs.synth.build import BuildContext, runner_env
    from c2jax.envs.synth.wheelhouse import RUNNER_DISTS
    from c2jax.envs.tasks import write_tasks

    os.makedirs(out_dir, exist_ok=True)
    recs = read_swebench(path)
    ctx = BuildContext(out_dir)
    tasks, unsupported = [], []
    runner = None
    for where, rec in recs:
        reason = unsupported_reason(rec, repos_dir, set(RUNNER_DISTS))
        if reason:
            unsupported.append({"instance_id": rec["instance_id"], "reason": reason})
            continue
        repo = os.path.join(repos_dir, rec["repo"].replace("/", "__"))
        task_id = task_id_for(rec["instance_id"])
        tree = os.path.join(out_dir, "trees", task_id)
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(tree)
        arc = subprocess.run(["git", "-C", repo, "archive", "--format=tar", rec["base_commit"]], capture_output=True)
        subprocess.run(["tar", "-x", "-C", tree], input=arc.stdout, check=True)
        runner = runner or runner_env(ctx)
        env_id = images.new_layer_env(runner, lambda dst, t=tree: shutil.copytree(t, dst, symlinks=True),
                                      env_id="swe-" + images.tree_digest(tree)[:32])
        test_files = sorted(p for p in diff_paths(rec["test_patch"])[0] if p.endswith(".py"))
        lines, files = patch_stats(rec["patch"])
        prompt = rec.get("problem_statement") or f"Make {', '.join(rec['FAIL_TO_PASS'][:3])} pass."
        task = TaskRecord(
            instance_id=task_id,
            source=Source("swebench", rec["repo"], rec.get("version", "") or rec["base_commit"][:12], "", "",
                          f"https://github.com/{rec['repo']}"),
            codebase=rec["repo"], env_id=env_id, category="swebench", subcategory="", problem_statement=prompt,
            test=TestSpec("pytest", ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *test_files),
                          "/workspace", {}),
            timeouts={"agent_s": 1800.0, "verify_s": verify_s}, limits={"timeout_s": verify_s},
            hidden_tests=HiddenTests({}, tuple(rec["FAIL_TO_PASS"]), tuple(rec["PASS_TO_PASS"]), rec["test_patch"]),
            patch=rec["patch"], protected_paths=tuple(DEFAULT_PROTECTED) + tuple(test_files),
            provenance={"generator": "c2jax.bench.adapters.swebench", "from": where,
                        "base_commit": rec["base_commit"], "swebench_instance_id": rec["instance_id"]},
            stats={"lines_changed": lines, "files_changed": files, "prompt_chars": len(prompt)}, split="eval")
        if validate:
            g = grade(task, task.patch, check_gold=False)
            if not g.resolved:
                unsupported.append({"instance_id": rec["instance_id"],
                                    "reason": f"gold patch does not resolve locally: {g.flags} {g.detail[:200]}"})
                continue
        tasks.append(task)
    write_tasks(os.path.join(out_dir, "tasks.jsonl"), tasks)
    with open(os.path.join(out_dir, "unsupported.json"), "w") as f:
        json.dump(unsupported, f, indent=1)
    return tasks, unsupported
