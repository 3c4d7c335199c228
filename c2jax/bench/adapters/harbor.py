"""Harbor / Terminal-Bench 2 task directories -> c2jax task records, run in the local sandbox.

A task directory holds instruction.md, task.toml, environment/Dockerfile (+ build context, or
``[environment].docker_image``), tests/test.sh (the verifier, which writes a reward into
/logs/verifier/reward.json or reward.txt) and solution/solve.sh (the oracle). Supported when the
image is ``python:<this X.Y>...`` with only WORKDIR, COPY/ADD of context files, ENV, and
`pip install` of packages available offline (the runner wheelhouse). What is read from task.toml:

* ``[task].name`` (``org/name``) -> the task id (escaped reversibly, `adapters.ids`) and source
  package; ``[task].version`` -> source version. Without ``[task]``: the directory name.
* ``[agent].timeout_sec``, ``[verifier].timeout_sec`` -> timeouts; ``[metadata]`` category/license.
* ``[environment].workdir`` -> the working directory (overrides the Dockerfile's WORKDIR, as in
  Harbor); ``[environment].docker_image`` -> the base image (its Dockerfile, if any, says how it
  is built; without one the image must be a plain ``python:X.Y`` image).
* rewards as Harbor reads them: reward.json (a number or ``{"reward": x, ...}``) when the verifier
  wrote one, else reward.txt. The verifier's log directory is emptied before it runs.

Listed as unsupported, with the reason, never aborting the other tasks: another base image, RUN
steps other than pip, packages not available offline, a verifier in a separate environment
(``[verifier].environment`` / ``environment_mode = "separate"``), multi-step tasks (``[[steps]]``),
non-Linux tasks, binary files under tests/ (``__pycache__``/``.pyc`` are skipped: Python rebuilds
them), unreadable or malformed files, a missing oracle, and an oracle that fails locally.

Path mapping into the local sandbox: the working directory -> /workspace, /tests ->
/workspace/.c2jax/tests (added only when grading), /logs/verifier -> /workspace/.c2jax/logs/verifier.
The gold patch is what solution/solve.sh changes, taken with `Sandbox.diff()`. The reverse
direction (c2jax task -> Harbor task directory) is `harbor_export.export_harbor`.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tomllib

from c2jax.bench.adapters.ids import task_id_for
from c2jax.envs.tasks import DEFAULT_PROTECTED, HiddenTests, Source, TaskFormatError, TaskRecord, TestSpec, \
    patch_stats

LOG_DIR = ".c2jax/logs/verifier"
TESTS_DIR = ".c2jax/tests"
REWARD = f"{LOG_DIR}/c2jax-reward.json"  # what the verifier wrapper leaves for the grader
# the verifier as Harbor runs it: a fresh log directory, then test.sh; reward.json wins over reward.txt
VERIFY = (f"rm -rf /workspace/{LOG_DIR} && mkdir -p /workspace/{LOG_DIR} && cd /workspace && "
          f"bash /workspace/{TESTS_DIR}/test.sh; rc=$?; cd /workspace/{LOG_DIR} && "
          f"if [ -s reward.json ]; then cp reward.json c2jax-reward.json; "
          f"elif [ -s reward.txt ]; then printf '{{\"reward\": %s}}' \"$(head -c 64 reward.txt)\" > c2jax-reward.json; "
          f"fi; exit $rc")


class Unsupported(Exception):
    """A task this adapter cannot run locally; the message is the reason."""


def _rewrite(text: str, workdir: str) -> str:
    text = text.replace("/logs/verifier", f"/workspace/{LOG_DIR}").replace("/tests/", f"/workspace/{TESTS_DIR}/")
    text = re.sub(r"(?<![\w/.])/tests\b", f"/workspace/{TESTS_DIR}", text)
    if workdir and workdir != "/":
        text = re.sub(rf"(?<![\w/.]){re.escape(workdir.rstrip('/'))}\b", "/workspace", text)
    return text


def parse_dockerfile(text: str, offline: set[str]) -> tuple[dict, str | None]:
    """({workdir, copies: [(src, dst, workdir then)], env: {}, pip: []}, unsupported reason or None)."""
    info: dict = {"workdir": "/", "copies": [], "env": {}, "pip": []}
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines, buf = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    saw_from = False
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "FROM":
            image = rest.split()[0]
            m = re.match(r"^(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)", image)
            if not m:
                return info, f"needs Docker image {image}"
            if m.group(1) != here:
                return info, f"needs Python {m.group(1)} (image {image}; this is {here})"
            saw_from = True
        elif op == "WORKDIR":
            info["workdir"] = os.path.normpath(os.path.join(info["workdir"], rest))  # relative: to the last one
        elif op in ("COPY", "ADD"):
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            if len(parts) < 2 or any(p.startswith(("http://", "https://")) for p in parts):
                return info, f"unsupported {op} {rest}"
            for src in parts[:-1]:
                info["copies"].append((src, parts[-1], info["workdir"]))
        elif op == "ENV":
            if "=" in rest:
                for kv in shlex.split(rest):
                    k, _, v = kv.partition("=")
                    info["env"][k] = v
            else:
                k, _, v = rest.partition(" ")
                info["env"][k] = v.strip()
        elif op == "RUN":
            words = shlex.split(rest)
            if len(words) >= 3 and words[0] in ("pip", "pip3") and words[1] == "install" or \
                    words[:4] == ["python", "-m", "pip", "install"]:
                pkgs = [w for w in words[(4 if words[0] == "python" else 2):] if not w.startswith("-")]
                names = {re.split(r"[<>=!~\[]", p)[0].lower() for p in pkgs}
                missing = sorted(names - offline)
                if missing:
                    return info, f"needs pip packages not installable offline: {', '.join(missing)}"
                info["pip"] += pkgs
            else:
                return info, f"RUN step needs a Docker build: {rest[:120]}"
        elif op in ("LABEL", "CMD", "ENTRYPOINT", "USER", "EXPOSE", "SHELL", "ARG"):
            continue
        else:
            return info, f"unsupported Dockerfile instruction {op}"
    if not saw_from:
        return info, "Dockerfile has no FROM"
    return info, None


def _read(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise Unsupported(f"{what} missing")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise Unsupported(f"{what} is not UTF-8 text") from None


def _table(meta: dict, key: str) -> dict:
    v = meta.get(key, {})
    if not isinstance(v, dict):
        raise Unsupported(f"task.toml: [{key}] must be a table")
    return v


def _seconds(meta: dict, sect: str) -> float:
    v = _table(meta, sect).get("timeout_sec", 600)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise Unsupported(f"task.toml: '{sect}.timeout_sec' must be a positive number, got {v!r}")
    return float(v)


def _check_supported_config(meta: dict) -> None:
    env, ver = _table(meta, "environment"), _table(meta, "verifier")
    if meta.get("steps"):
        raise Unsupported("multi-step task ([[steps]]): not supported")
    if str(env.get("os", "linux")).lower() != "linux":
        raise Unsupported(f"environment os {env.get('os')!r}: only linux tasks run locally")
    if ver.get("environment") is not None or str(ver.get("environment_mode", "shared")) == "separate":
        image = (ver.get("environment") or {}).get("docker_image") if isinstance(ver.get("environment"), dict) else None
        raise Unsupported("the verifier runs in a separate environment" + (f" (image {image})" if image else "") +
                          ": grading here runs in the agent's sandbox")


def _hidden_tests(d: str, workdir: str) -> dict[str, str]:
    """tests/ files under .c2jax/tests, scripts rewritten to local paths; binary files are unsupported."""
    hidden = {}
    tests = os.path.join(d, "tests")
    for root, dirs, files in os.walk(tests):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(files):
            if fn.endswith((".pyc", ".pyo")):
                continue  # compiled Python: rebuilt from the sources
            p = os.path.join(root, fn)
            rel = os.path.relpath(p, tests)
            try:
                with open(p, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError:
                raise Unsupported(f"tests/{rel} is a binary file (hidden tests are stored as text)") from None
            hidden[f"{TESTS_DIR}/{rel}"] = _rewrite(text, workdir) if fn.endswith((".sh", ".py")) else text
    return hidden


def _copy_context(d: str, info: dict, build_wd: str, run_wd: str, tree: str) -> None:
    """COPY/ADD sources into `tree` (= run_wd), destinations resolved against the build WORKDIR."""
    ctx_dir = os.path.abspath(os.path.join(d, "environment"))
    for src, dst, wd in info["copies"]:
        s = os.path.normpath(os.path.join(ctx_dir, src))
        if s != ctx_dir and not s.startswith(ctx_dir + os.sep):
            raise Unsupported(f"Dockerfile COPY {src}: leaves the build context")
        if not os.path.exists(s):
            raise Unsupported(f"Dockerfile COPY {src}: not in environment/")
        abs_dst = os.path.normpath(dst if dst.startswith("/") else os.path.join(wd or build_wd, dst))
        rel = os.path.relpath(abs_dst, run_wd)
        if rel == ".." or rel.startswith("../"):
            raise Unsupported(f"Dockerfile COPY to {dst}: outside the working directory {run_wd}")
        target = os.path.normpath(os.path.join(tree, rel))
        if os.path.isdir(s):
            shutil.copytree(s, target, dirs_exist_ok=True)
        else:
            into_dir = dst.endswith("/") or os.path.isdir(target)
            os.makedirs(target if into_dir else os.path.dirname(target), exist_ok=True)
            shutil.copy(s, os.path.join(target, os.path.basename(s)) if into_dir else target)


def _identity(d: str, meta: dict) -> tuple[str, str, str]:
    """(task id, package name, version) from [task] or the directory name."""
    task = _table(meta, "task")
    name = task.get("name") or os.path.basename(os.path.normpath(d))
    if not isinstance(name, str) or not name:
        raise Unsupported("task.toml: [task].name must be a non-empty string")
    version = task.get("version", "")
    return task_id_for(name), name, str(version if version is not None else "")


def _convert_one(d: str, out_dir: str, runner_box: list, validate: bool) -> TaskRecord:
    from c2jax.envs import images, start
    from c2jax.envs.grading import grade
    from c2jax.envs.synth.build import BuildContext, runner_env
    from c2jax.envs.synth.wheelhouse import RUNNER_DISTS

    if not os.path.isdir(d):
        raise Unsupported(f"{d} is not a directory")
    try:
        meta = tomllib.loads(_read(os.path.join(d, "task.toml"), "task.toml"))
    except tomllib.TOMLDecodeError as e:
        raise Unsupported(f"task.toml is not valid TOML ({e})") from None
    _check_supported_config(meta)
    task_id, package, version = _identity(d, meta)
    agent_s, verify_s = _seconds(meta, "agent"), _seconds(meta, "verifier")
    env_cfg = _table(meta, "environment")
    instruction = _read(os.path.join(d, "instruction.md"), "instruction.md")
    dockerfile = os.path.join(d, "environment", "Dockerfile")
    image = env_cfg.get("docker_image")
    if os.path.isfile(dockerfile):
        docker = _read(dockerfile, "environment/Dockerfile")
    elif image:
        docker = f"FROM {image}\n"  # a prebuilt image: only a plain python image is reproducible here
    else:
        raise Unsupported("neither environment/Dockerfile nor [environment].docker_image")
    info, reason = parse_dockerfile(docker, set(RUNNER_DISTS))
    if reason:
        raise Unsupported(reason)
    _read(os.path.join(d, "tests", "test.sh"), "tests/test.sh")
    solve = os.path.join(d, "solution", "solve.sh")
    if not os.path.isfile(solve):
        raise Unsupported("no solution/solve.sh (oracle) to derive a gold patch")
    build_wd = info["workdir"]
    run_wd = os.path.normpath(env_cfg.get("workdir") or build_wd)
    if not run_wd.startswith("/"):
        raise Unsupported(f"[environment].workdir {run_wd!r} must be an absolute path")
    hidden = _hidden_tests(d, run_wd)
    tree = os.path.join(out_dir, "trees", task_id)
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    _copy_context(d, info, build_wd, run_wd, tree)
    if not runner_box:
        runner_box.append(runner_env(BuildContext(out_dir)))
    env_id = images.new_layer_env(runner_box[0], lambda dst, t=tree: shutil.copytree(t, dst, symlinks=True),
                                  env_id="hb-" + images.tree_digest(tree)[:32])
    env_vars = {k: _rewrite(v, run_wd) for k, v in info["env"].items()}
    with start(env_id, timeout_s=agent_s) as sb:
        r = sb.exec(["bash", "-c", _rewrite(_read(solve, "solution/solve.sh"), run_wd)], env=env_vars)
        if r.exit_code != 0:
            raise Unsupported(f"solve.sh failed locally: {r.stderr[-300:]}")
        gold = sb.diff()
    lines, files_n = patch_stats(gold)
    md = _table(meta, "metadata")
    task = TaskRecord(
        instance_id=task_id, source=Source("harbor", package, version, "", str(md.get("license", "")), ""),
        codebase=package, env_id=env_id, category="harbor", subcategory=str(md.get("category", "")),
        problem_statement=_rewrite(instruction, run_wd).strip(),
        test=TestSpec("script", ("bash", "-c", VERIFY), "/workspace", env_vars, report=REWARD),
        timeouts={"agent_s": agent_s, "verify_s": verify_s}, limits={"timeout_s": verify_s},
        hidden_tests=HiddenTests(hidden, (), ()), patch=gold, protected_paths=DEFAULT_PROTECTED,
        provenance={"generator": "c2jax.bench.adapters.harbor", "from": d, "harbor_name": package,
                    "workdir": run_wd},
        stats={"lines_changed": lines, "files_changed": files_n, "prompt_chars": len(instruction)}, split="eval")
    if validate:
        g = grade(task, task.patch, check_gold=False)
        if not g.resolved:
            raise Unsupported(f"oracle does not pass the verifier locally: {g.flags} {g.detail[:200]}")
    return task


def convert_harbor(task_dirs: list[str], out_dir: str, *, validate: bool = True) -> tuple[list[TaskRecord], list[dict]]:
    """Convert Harbor task directories; returns (tasks, unsupported [{instance_id, reason}]).

    A task that cannot run locally, or whose files are missing or malformed, becomes an unsupported
    entry with the reason; the other tasks are converted all the same."""
    from c2jax.envs.tasks import write_tasks

    os.makedirs(out_dir, exist_ok=True)
    tasks: list[TaskRecord] = []
    unsupported: list[dict] = []
    runner_box: list = []
    seen: dict[str, str] = {}
    for d in task_dirs:
        label = os.path.basename(os.path.normpath(d))
        try:
            task = _convert_one(d, out_dir, runner_box, validate)
        except Unsupported as e:
            unsupported.append({"instance_id": label, "reason": str(e)})
            continue
        except (OSError, TaskFormatError) as e:  # unreadable files, a bad record: this task only
            unsupported.append({"instance_id": label, "reason": f"{type(e).__name__}: {e}"})
            continue
        if task.instance_id in seen:
            unsupported.append({"instance_id": label, "reason": f"duplicate task name {task.source.package!r} "
                                                                f"(also {seen[task.instance_id]})"})
            continue
        seen[task.instance_id] = d
        tasks.append(task)
    write_tasks(os.path.join(out_dir, "tasks.jsonl"), tasks)
    return tasks, unsupported
