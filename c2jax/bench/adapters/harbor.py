"""Harbor / Terminal-Bench 2 task directories -> c2jax task records, run in the local sandbox.

A task directory holds instruction.md, task.toml ([agent] / [verifier] timeout_sec,
[environment] cpus / memory_mb), environment/Dockerfile (+ build context), tests/test.sh (the
verifier, which writes a reward into /logs/verifier/reward.txt or reward.json) and
solution/solve.sh (the oracle). Supported when the Dockerfile is `FROM python:<this X.Y>...` with
only WORKDIR, COPY/ADD of context files, ENV, and `pip install` of packages available offline
(the runner wheelhouse); anything else (another base image, apt-get, ...) is reported as
unsupported with the reason.

Path mapping into the local sandbox: the image's WORKDIR -> /workspace, /tests ->
/workspace/.c2jax/tests (added only when grading), /logs/verifier -> /workspace/.c2jax/logs/verifier.
The gold patch is what solution/solve.sh changes, taken with `Sandbox.diff()`.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tomllib

from c2jax.envs.tasks import DEFAULT_PROTECTED, HiddenTests, Source, TaskFormatError, TaskRecord, TestSpec, \
    patch_stats

LOG_DIR = ".c2jax/logs/verifier"
TESTS_DIR = ".c2jax/tests"


def _rewrite(text: str, workdir: str) -> str:
    text = text.replace("/logs/verifier", f"/workspace/{LOG_DIR}").replace("/tests/", f"/workspace/{TESTS_DIR}/")
    text = re.sub(r"(?<![\w/.])/tests\b", f"/workspace/{TESTS_DIR}", text)
    if workdir and workdir != "/":
        text = re.sub(rf"(?<![\w/.]){re.escape(workdir.rstrip('/'))}\b", "/workspace", text)
    return text


def parse_dockerfile(text: str, offline: set[str]) -> tuple[dict, str | None]:
    """({workdir, copies: [(src, dst)], env: {}, pip: []}, unsupported reason or None)."""
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
            info["workdir"] = rest
        elif op in ("COPY", "ADD"):
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            if len(parts) < 2 or any(p.startswith(("http://", "https://")) for p in parts):
                return info, f"unsupported {op} {rest}"
            for src in parts[:-1]:
                info["copies"].append((src, parts[-1]))
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


def _read(path: str, where: str, field: str) -> str:
    if not os.path.isfile(path):
        raise TaskFormatError(f"{where}: field {field!r}: {path} missing")
    with open(path, encoding="utf-8") as f:
        return f.read()


def convert_harbor(task_dirs: list[str], out_dir: str, *, validate: bool = True) -> tuple[list[TaskRecord], list[dict]]:
    """Convert Harbor task directories; returns (tasks, unsupported [{instance_id, reason}])."""
    from c2jax.envs import images, start
    from c2jax.envs.grading import grade
    from c2jax.envs.synth.build import BuildContext, runner_env
    from c2jax.envs.synth.wheelhouse import RUNNER_DISTS
    from c2jax.envs.tasks import write_tasks

    os.makedirs(out_dir, exist_ok=True)
    tasks, unsupported = [], []
    runner = None
    for d in task_dirs:
        name = os.path.basename(os.path.normpath(d))
        where = os.path.join(d, "task.toml")
        try:
            meta = tomllib.loads(_read(where, where, "task.toml"))
        except tomllib.TOMLDecodeError as e:
            raise TaskFormatError(f"{where}: not valid TOML ({e})") from None
        instruction = _read(os.path.join(d, "instruction.md"), d, "instruction.md")
        docker = _read(os.path.join(d, "environment", "Dockerfile"), d, "environment/Dockerfile")
        test_sh = _read(os.path.join(d, "tests", "test.sh"), d, "tests/test.sh")
        for sect, key in (("agent", "timeout_sec"), ("verifier", "timeout_sec")):
            v = meta.get(sect, {}).get(key, 600)
            if not isinstance(v, (int, float)) or v <= 0:
                raise TaskFormatError(f"{where}: field '{sect}.{key}': expected a positive number")
        info, reason = parse_dockerfile(docker, set(RUNNER_DISTS))
        if reason:
            unsupported.append({"instance_id": name, "reason": reason})
            continue
        solve = os.path.join(d, "solution", "solve.sh")
        if not os.path.isfile(solve):
            unsupported.append({"instance_id": name, "reason": "no solution/solve.sh (oracle) to derive a gold patch"})
            continue
        workdir = info["workdir"]
        tree = os.path.join(out_dir, "trees", name)
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(tree)
        ctx_dir = os.path.join(d, "environment")
        for src, dst in info["copies"]:
            s = os.path.normpath(os.path.join(ctx_dir, src))
            if not s.startswith(os.path.abspath(ctx_dir)) and not s.startswith(ctx_dir):
                raise TaskFormatError(f"{d}/environment/Dockerfile: field 'COPY': {src} leaves the build context")
            rel = os.path.relpath(os.path.join(workdir, dst), workdir) if dst.startswith("/") else dst
            target = os.path.normpath(os.path.join(tree, rel))
            if os.path.isdir(s):
                shutil.copytree(s, target, dirs_exist_ok=True)
            else:
                os.makedirs(target if dst.endswith("/") else os.path.dirname(target), exist_ok=True)
                shutil.copy(s, os.path.join(target, os.path.basename(s)) if dst.endswith("/") else target)
        runner = runner or runner_env(BuildContext(out_dir))
        env_id = images.new_layer_env(runner, lambda dst, t=tree: shutil.copytree(t, dst, symlinks=True),
                                      env_id="hb-" + images.tree_digest(tree)[:32])
        with start(env_id, timeout_s=float(meta.get("agent", {}).get("timeout_sec", 600))) as sb:
            r = sb.exec(["bash", "-c", _rewrite(open(solve).read(), workdir)], env=info["env"])
            if r.exit_code != 0:
                unsupported.append({"instance_id": name, "reason": f"solve.sh failed locally: {r.stderr[-300:]}"})
                continue
            gold = sb.diff()
        hidden = {}
        for root, _, files in os.walk(os.path.join(d, "tests")):
            for fn in files:
                p = os.path.join(root, fn)
                rel = os.path.relpath(p, os.path.join(d, "tests"))
                with open(p, encoding="utf-8") as f:
                    text = f.read()
                hidden[f"{TESTS_DIR}/{rel}"] = _rewrite(text, workdir) if fn.endswith((".sh", ".py")) else text
        lines, files_n = patch_stats(gold)
        verify_s = float(meta.get("verifier", {}).get("timeout_sec", 600))
        env_vars = {k: _rewrite(v, workdir) for k, v in info["env"].items()}
        task = TaskRecord(
            instance_id=re.sub(r"[^A-Za-z0-9_.:+-]", "_", name),
            source=Source("harbor", name, str(meta.get("version", "1.0")), "", str(meta.get("metadata", {}).get("license", "")),
                          ""),
            codebase=name, env_id=env_id, category="harbor", subcategory=str(meta.get("metadata", {}).get("category", "")),
            problem_statement=_rewrite(instruction, workdir).strip(),
            test=TestSpec("script", ("bash", f"{TESTS_DIR}/test.sh"), "/workspace", env_vars,
                          report=f"{LOG_DIR}/reward.txt"),
            timeouts={"agent_s": float(meta.get("agent", {}).get("timeout_sec", 600)), "verify_s": verify_s},
            limits={"timeout_s": verify_s}, hidden_tests=HiddenTests(hidden, (), ()), patch=gold,
            protected_paths=DEFAULT_PROTECTED, provenance={"generator": "c2jax.bench.adapters.harbor", "from": d},
            stats={"lines_changed": lines, "files_changed": files_n, "prompt_chars": len(instruction)}, split="eval")
        if validate:
            g = grade(task, task.patch, check_gold=False)
            if not g.resolved:
                unsupported.append({"instance_id": name, "reason": f"oracle does not pass the verifier locally: "
                                                                   f"{g.flags} {g.detail[:200]}"})
                continue
        tasks.append(task)
    write_tasks(os.path.join(out_dir, "tasks.jsonl"), tasks)
    return tasks, unsupported
