"""Shared fixtures for the tests/envs/test_envs_*.py files (not collected itself: no test_ prefix).

Every test uses a private state directory (C2JAX_ENVS_DIR under pytest's tmp dir), so nothing
touches a developer's real environment cache, and a tiny repository built into one environment.
"""
from __future__ import annotations

import os
import stat
import time

import pytest

from c2jax.envs import sandbox as sandbox_mod
from c2jax.envs.bwrap import bwrap_path
from c2jax.envs.errors import SandboxError

IS_ROOT = os.geteuid() == 0

# Sandboxes missing on a machine make their tests FAIL, naming what is missing: CI must not go green
# by skipping the attack suite. A machine that really has no sandboxes says so explicitly.
OPT_OUT_VAR = "C2JAX_SANDBOX_UNAVAILABLE"


def sandbox_mark(problem: str | None):
    """A mark for tests that need sandboxes: nothing if `problem` is None; otherwise the test fails
    with `problem` (or is skipped when ${OPT_OUT_VAR}=1). Enforced by tests/conftest.py, which calls
    `check_sandbox_requirement` for every test carrying the mark."""
    return pytest.mark.sandbox_required(problem)


def check_sandbox_requirement(problem: str | None, environ=os.environ) -> None:
    """Fail (or, with ${OPT_OUT_VAR}=1, skip) a test whose sandbox requirement is not met."""
    if problem is None:
        return
    if environ.get(OPT_OUT_VAR) == "1":
        pytest.skip(f"{problem} ({OPT_OUT_VAR}=1 says sandboxes are unavailable on this machine)")
    pytest.fail(f"{problem}. This test needs a working sandbox; on a machine that cannot run them, "
                f"set {OPT_OUT_VAR}=1 to skip sandbox tests explicitly.", pytrace=False)


def _bwrap_ok() -> str | None:
    try:
        bwrap_path()
        return None
    except SandboxError as e:
        return str(e)


BWRAP_PROBLEM = _bwrap_ok()
needs_bwrap = sandbox_mark(f"no usable bwrap: {BWRAP_PROBLEM}" if BWRAP_PROBLEM else None)
needs_root = sandbox_mark(None if IS_ROOT else "needs root: cgroup limits and the size-capped tmpfs disk "
                          "quota are created by root (CI runs as root)")


@pytest.fixture(scope="session")
def envs_state(tmp_path_factory):
    if os.environ.get("C2JAX_ENVS_DIR"):  # the session-wide private dir from tests/conftest.py
        yield os.environ["C2JAX_ENVS_DIR"]
        return
    root = tmp_path_factory.mktemp("c2jax_envs_state")
    old = os.environ.get("C2JAX_ENVS_DIR")
    os.environ["C2JAX_ENVS_DIR"] = str(root)
    yield str(root)
    if old is None:
        os.environ.pop("C2JAX_ENVS_DIR", None)
    else:
        os.environ["C2JAX_ENVS_DIR"] = old


def make_repo(path) -> str:
    """A small repository: text, binary, executable, symlink, nested dirs."""
    os.makedirs(os.path.join(path, "pkg", "sub"), exist_ok=True)
    files = {
        "README.md": "demo repo\n",
        "pkg/__init__.py": "",
        "pkg/core.py": "def add(a, b):\n    return a + b\n",
        "pkg/sub/data.txt": "line1\nline2\nline3\n",
        "tests/test_core.py": "from pkg.core import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    }
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "w") as f:
            f.write(text)
    with open(os.path.join(path, "blob.bin"), "wb") as f:
        f.write(bytes(range(256)) * 8)
    with open(os.path.join(path, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho run\n")
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    os.symlink("pkg/core.py", os.path.join(path, "core_link.py"))
    return str(path)


@pytest.fixture(scope="session")
def repo_env(envs_state, tmp_path_factory):
    """(repo dir, env id) of the demo repository, built once per test session."""
    from c2jax.envs import build_env

    repo = make_repo(tmp_path_factory.mktemp("repo"))
    return repo, build_env(repo)


def _describe(pids) -> dict:
    """{pid: "STATE PPID COMMAND"} from /proc, so a failure says whether the processes were zombies
    waiting to be reaped (a slow teardown under load) or running (a leak)."""
    out = {}
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            out[pid] = f"{fields[0]} ppid={fields[1]} {stat[stat.index('(') + 1:stat.rindex(')')]}"
        except (OSError, ValueError):
            out[pid] = "gone"
    return out


def assert_no_leftovers(sb, timeout: float = 5.0) -> None:
    """After close(): no process in the sandbox's pid namespace, no cgroup, no mount, no files."""
    sandbox_mod.flush_cleanup()  # close() hands files, mount and cgroups to the janitor thread
    deadline = time.monotonic() + timeout
    while True:
        left = sandbox_mod.pids_in_namespace(sb._pidns)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not left, f"processes left after close(): {_describe(left)}"
    for path in sb._cg.paths:
        assert not os.path.exists(path), f"cgroup left: {path}"
    assert not os.path.exists(sb.dir), f"state left: {sb.dir}"
    with open("/proc/self/mountinfo") as f:
        assert sb.id not in f.read(), "tmpfs mount left"


def tree_snapshot(root: str) -> dict:
    """{relative path: (type, mode, content or link target)} of a host tree."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", 0, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[rel] = ("f", st.st_mode & 0o777, f.read())
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", st.st_mode & 0o777, None)
    return out
