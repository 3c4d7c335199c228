"""The sandbox interface: exec, background, shell, files, diff round-trip, snapshot/fork, derive_env."""
from __future__ import annotations

import os

import pytest

from _envs_common import (assert_no_leftovers, envs_state, needs_bwrap, needs_root, repo_env,  # noqa: F401
                          tree_snapshot)
from c2jax.envs import ExecResult, SandboxClosed, SandboxError, UnsafePath, build_env, derive_env, start
from c2jax.envs.images import load
from _paths import REPO_ROOT  # noqa: E402

pytestmark = needs_bwrap


def test_exec_basics_and_fixed_paths(repo_env):
    _, env = repo_env
    with start(env) as sb:
        r = sb.exec("id -u; pwd; command -v python; python -c 'import sys; print(sys.prefix)'")
        assert isinstance(r, ExecResult) and r.ok
        assert r.stdout.split() == ["1000", "/workspace", "/env/bin/python", "/env"]
        r = sb.exec(["sh", "-c", 'echo "$1" >&2; echo out; exit 7', "sh", "a b"])
        assert (r.exit_code, r.stdout, r.stderr, r.killed_reason) == (7, "out\n", "a b\n", None)
        assert sb.exec("cat", stdin=b"piped\x00bytes").stdout == "piped\x00bytes"
        assert sb.exec("cat").stdout == ""  # stdin defaults to EOF, never a hang
        r = sb.exec("pwd; echo $FOO", cwd="/workspace/pkg", env={"FOO": "bar baz"})
        assert r.stdout == "/workspace/pkg\nbar baz\n"
        assert sb.exec("python -m pytest --version").exit_code != 0  # host site-packages hidden
        r = sb.exec("python -c 'import sys; print(sys.path)'; python -c 'import yaml'")
        assert "dist-packages" not in r.stdout and "site-packages" in r.stdout  # only /env's
        assert "No module named 'yaml'" in r.stderr or not os.path.isdir("/usr/lib/python3/dist-packages/yaml")
        assert sb.exec("python -c 'import pkg.core as c; print(c.add(2, 3))'").stdout == "5\n"
        assert r.duration_s > 0 and "cpu_s" in r.usage
        # The interpreter's own site-packages are hidden; the venv is read-only.
        assert sb.exec("touch /env/x").exit_code != 0
    assert_no_leftovers(sb)


def test_background_streaming_and_stdin(repo_env):
    _, env = repo_env
    with start(env) as sb:
        p = sb.exec("while read line; do echo got:$line; done; echo bye >&2", background=True)
        p.write_stdin("one\n")
        seen = ""
        for _ in range(100):
            out, _ = p.read(timeout=0.1)
            seen += out
            if "got:one" in seen:
                break
        assert "got:one" in seen and p.poll() is None
        p.write_stdin("two\n")
        p.close_stdin()
        r = p.wait(10)
        assert r.exit_code == 0 and "got:two" in seen + r.stdout and r.stderr == "bye\n"
        slow = sb.exec("sleep 30", background=True)
        assert slow.wait(0.2) is None
        assert slow.kill().exit_code == 137
    assert_no_leftovers(sb)


def test_shell_session_keeps_state_and_survives_errors(repo_env):
    _, env = repo_env
    with start(env) as sb:
        sh = sb.shell()
        assert sh.run("cd pkg && export X=42 && f() { echo fn$1; }").exit_code == 0
        r = sh.run("pwd; echo $X; f 1")
        assert r.stdout == "/workspace/pkg\n42\nfn1\n" and r.exit_code == 0
        assert sh.run("echo err >&2; false").stdout == "err\n"
        assert sh.run("false").exit_code == 1
        assert sh.run("if then fi").exit_code != 0  # syntax error is a result, shell lives on
        r = sh.run("sleep 20", timeout=0.5)
        assert r.killed_reason == "timeout"
        assert sh.run("echo $X").stdout == "42\n"  # the shell survived the timeout
        sh.close()


def test_file_api_roundtrip_and_refusals(repo_env):
    _, env = repo_env
    with start(env) as sb:
        sb.write_file("new/dir/f.txt", "héllo")
        assert sb.read_file("/workspace/new/dir/f.txt") == "héllo"
        assert sb.exec("cat new/dir/f.txt").stdout == "héllo"
        sb.write_file("bin.dat", b"\x00\xff" * 10)
        assert sb.read_file("bin.dat", binary=True) == b"\x00\xff" * 10
        names = {e["name"]: e["type"] for e in sb.list_dir("")}
        assert names["core_link.py"] == "symlink" and names["pkg"] == "dir" and names["blob.bin"] == "file"
        assert sb.glob("**/*.py") == ["core_link.py", "pkg/__init__.py", "pkg/core.py", "tests/test_core.py"]
        assert sb.read_file("core_link.py") == sb.read_file("pkg/core.py")  # in-tree symlink is fine
        for bad in ("/etc/passwd", "../x", "pkg/../../x"):
            with pytest.raises(UnsafePath):
                sb.read_file(bad)
        with pytest.raises(FileNotFoundError):
            sb.read_file("missing.txt")
    with pytest.raises(SandboxClosed):
        sb.read_file("README.md")


def test_diff_roundtrips_through_derive_env(repo_env):
    repo, env = repo_env
    with start(env) as sb:
        script = (
            "set -e; echo more >> pkg/core.py; rm pkg/sub/data.txt; rm -r tests; "
            "printf '\\000\\001\\002binary' > new.bin; head -c 3000 /dev/urandom > blob.bin; "
            "ln -sf README.md core_link.py; ln -s pkg/core.py newlink; chmod -x run.sh; "
            "mkdir -p deep/er && echo x > deep/er/file; mv README.md README.txt"
        )
        assert sb.exec(script).ok
        patch = sb.diff()
        assert "GIT binary patch" in patch and "deleted file mode" in patch and "120000" in patch
        expected = {p: v for p, v in _workspace_tree(sb).items()}
    derived = derive_env(env, patch)
    assert derive_env(env, patch) == derived  # cached by (parent, patch)
    with start(derived) as sb2:
        assert _workspace_tree(sb2) == expected
        assert sb2.diff() == ""  # the derived base already contains the change
    assert tree_snapshot(repo)["pkg/core.py"][2].endswith(b"a + b\n")  # the source is untouched
    with pytest.raises(ValueError):
        derive_env(env, "diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-a\n+b\n")


def _workspace_tree(sb) -> dict:
    r = sb.exec("find . -mindepth 1 \\( -type f -o -type l \\) -printf '%y %m %p\\n' | sort")
    out = {}
    for line in r.stdout.splitlines():
        kind, mode, path = line.split(" ", 2)
        content = sb.exec(["readlink", path]).stdout if kind == "l" else sb.read_file(path, binary=True)
        out[path] = (kind, mode if kind == "f" else "", content)
    return out


def test_snapshot_and_fork_keep_changes_and_deletions(repo_env):
    _, env = repo_env
    with start(env) as sb:
        sb.exec("rm -r pkg/sub; echo v1 > state.txt; rm README.md; ln -s state.txt lnk; "
                "mkfifo pipe; chmod 700 run.sh; mkdir -p new/deep && printf '\\000x' > new/deep/b")
        p = sb.exec("sleep 60", background=True)  # a live process does not block the snapshot
        with sb.fork() as child:
            assert child.read_file("state.txt") == "v1\n"
            r = child.exec("ls pkg; test -e README.md; echo $?")
            assert r.stdout == "__init__.py\ncore.py\n1\n"  # whiteouts and opaque dirs survived
            r = child.exec("readlink lnk; test -p pipe && echo fifo; stat -c %a run.sh; od -c new/deep/b | head -1")
            assert r.stdout.split("\n")[:3] == ["state.txt", "fifo", "700"] and "\\0   x" in r.stdout, r
            child.exec("echo child > state.txt")
            assert sb.read_file("state.txt") == "v1\n"  # forks are independent
        snap = sb.snapshot()
        assert load(snap).meta["parent"] == env
        p.kill()
    with start(snap) as again:
        assert again.read_file("state.txt") == "v1\n"
        assert again.exec("mkdir pkg/sub && ls pkg/sub | wc -l").stdout.strip() == "0"


def test_build_env_is_content_hashed_and_cached(envs_state, tmp_path):
    from _envs_common import make_repo

    repo = make_repo(tmp_path / "r")
    a = build_env(repo)
    assert build_env(repo) == a
    with open(os.path.join(repo, "README.md"), "a") as f:
        f.write("changed\n")
    b = build_env(repo)
    assert b != a
    os.chmod(os.path.join(repo, "run.sh"), 0o644)
    assert build_env(repo) not in (a, b)


def test_limits_validation_and_report(repo_env):
    from c2jax.config import ConfigError, validate
    from c2jax.envs import Limits

    with pytest.raises(ValueError):
        Limits(memory_bytes=0)
    with pytest.raises(ValueError):
        Limits(timeout_s=float("inf"))
    with pytest.raises(ValueError):
        Limits.from_config({"memroy_bytes": 1})
    with pytest.raises(ConfigError) as e:
        validate({"envs": {"limits": {"pids": 0, "timeout_s": "x"}, "backend": "docker"}})
    assert {"envs.limits.pids", "envs.limits.timeout_s", "envs.backend"} <= {k for k, _ in e.value.problems}
    _, env = repo_env
    with start(env, pids=64, timeout_s=5) as sb:
        report = sb.limits_report
        assert set(report) >= {"memory_bytes", "pids", "cpus", "disk_bytes", "timeout_s", "cpu_s"}
        if os.geteuid() == 0:
            assert report["memory_bytes"].startswith("enforced") and report["pids"].startswith("enforced")
        else:
            assert report["disk_bytes"].startswith("unavailable")


def test_requirements_install_from_wheelhouse(repo_env, tmp_path):
    """Real third-party packages (pytest) installed into /env from the prefetched wheelhouse, then
    the repository's own tests run inside the sandbox: pip and pytest never run on the host."""
    wheelhouse = os.environ.get("C2JAX_WHEELHOUSE") or os.path.join(
        REPO_ROOT, ".wheelhouse")
    if not os.path.isdir(wheelhouse) or not any(w.startswith("pytest-") for w in os.listdir(wheelhouse)):
        pytest.skip("no prefetched wheelhouse: .ci/run downloads .ci/wheelhouse.txt into .wheelhouse/")
    repo, _ = repo_env
    env = build_env(repo, requirements=["pytest==8.4.2"], wheelhouse=wheelhouse)
    assert build_env(repo, requirements=["pytest==8.4.2"], wheelhouse=wheelhouse) == env  # cached
    with start(env) as sb:
        r = sb.exec("python -m pytest -q -p no:cacheprovider tests", timeout=120)
        assert r.exit_code == 0 and "1 passed" in r.stdout, r
        sb.write_file("pkg/core.py", "def add(a, b):\n    return a - b\n")
        assert sb.exec("python -m pytest -q -p no:cacheprovider tests", timeout=120).exit_code == 1
    with pytest.raises(SandboxError):
        build_env(repo, requirements=["not-in-the-wheelhouse-pkg"], wheelhouse=wheelhouse)


def test_cli_build_prints_the_env_id(repo_env):
    import subprocess
    import sys

    repo, env = repo_env
    r = subprocess.run([sys.executable, "-m", "c2jax.envs", "build", repo], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0 and r.stdout.strip() == env, r.stderr
    r = subprocess.run([sys.executable, "-m", "c2jax.envs", "build", "/nonexistent-dir"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 1 and "not a directory" in r.stderr


def test_sandbox_started_in_a_short_lived_thread_survives_it(repo_env):
    """--die-with-parent is per *thread*: sandboxes must not die when their creating thread ends."""
    import threading

    _, env = repo_env
    box = []
    t = threading.Thread(target=lambda: box.append(start(env)))
    t.start()
    t.join()
    import time

    time.sleep(0.3)
    with box[0] as sb:
        assert sb.alive and sb.exec("echo alive").stdout == "alive\n"


def test_close_during_exec_and_infrastructure_failures(repo_env):
    """close() from another thread ends a running command with killed_reason="closed"; a sandbox
    killed from outside raises SandboxError instead of looking like a failed command."""
    import signal
    import threading

    from c2jax.envs import SandboxError

    _, env = repo_env
    sb = start(env)
    results = []
    t = threading.Thread(target=lambda: results.append(sb.exec("sleep 30", timeout=60)))
    t.start()
    import time

    time.sleep(0.3)
    sb.close()
    t.join(20)
    assert results and results[0].killed_reason == "closed" and results[0].exit_code == 137
    with pytest.raises(SandboxClosed):
        sb.exec("true")
    sb2 = start(env)
    os.kill(sb2._proc.pid, signal.SIGKILL)  # the infrastructure dies, not the command
    sb2._proc.wait(10)
    with pytest.raises(SandboxError) as e:
        sb2.exec("echo hi")
    assert "died" in str(e.value)
    sb2.close()
    assert_no_leftovers(sb2)


def test_shell_session_survives_large_cumulative_output(repo_env):
    """The shell streams: many runs with output past the limit keep working (no 1 MiB ceiling per
    session), each run is truncated on its own, and UTF-8 split across reads stays intact."""
    _, env = repo_env
    with start(env, output_bytes=64 << 10) as sb:
        sh = sb.shell()
        for _ in range(4):
            r = sh.run("head -c 200000 /dev/zero | tr '\\0' a; echo", timeout=30)
            assert r.stdout_truncated and len(r.stdout) == 64 << 10 and r.exit_code == 0
        r = sh.run("python -c \"print('é' * 20000)\"", timeout=30)
        assert r.stdout == "é" * 20000 + "\n" and not r.stdout_truncated
        assert sh.run("echo ok").stdout == "ok\n"


def test_relocatable_interpreter_at_a_fixed_path(repo_env):
    """A Python outside /usr (here this process's own base install, e.g. pyenv) is bound read-only
    at /opt/python with its site-packages hidden; the venv at /env uses it."""
    import sys

    repo, _ = repo_env
    py = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    if os.path.realpath(py).startswith("/usr/"):
        pytest.skip("this Python lives under /usr (covered by the system-interpreter tests)")
    env = build_env(repo, python=py)
    assert load(env).interpreter.mode == "prefix"
    with start(env) as sb:
        r = sb.exec("python -c 'import sys, platform; print(platform.python_version(), sys.prefix, "
                    "sys.base_prefix)'; python -c 'import pytest'")
        assert r.stdout.split() == [sys.version.split()[0], "/env", "/opt/python"], r
        assert "No module named 'pytest'" in r.stderr  # the host install's packages stay hidden


def test_failed_start_is_a_clear_sandbox_error_and_leaves_nothing(envs_state, tmp_path):
    import shutil

    from c2jax.envs.state import sandboxes_dir

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "f.txt").write_text("x")
    env = build_env(str(tmp_path / "r"))
    shutil.rmtree(load(env).venv)  # a damaged environment
    before = set(os.listdir(sandboxes_dir()))
    with pytest.raises(SandboxError, match="failed to start.*venv"):
        start(env)
    # nothing new (an earlier test's sandbox directory may still be reaped in the background meanwhile)
    assert not set(os.listdir(sandboxes_dir())) - before
    with open("/proc/self/mountinfo") as f:
        assert sandboxes_dir() not in f.read()
    with pytest.raises(SandboxError, match="unknown environment"):
        start("env-does-not-exist")


def test_hidden_paths_cover_usr_and_env(repo_env):
    """images.hide_paths_env covers files and directories outside /workspace, including inside
    /env (the venv is bound after /usr, so covers must be mounted after it)."""
    from c2jax.envs.images import hide_paths_env

    _, env = repo_env
    hidden = hide_paths_env(env, ["/env/pyvenv.cfg", "/env/bin/", "/usr/share/doc/"])
    with start(hidden) as sb:
        r = sb.exec("wc -c < /env/pyvenv.cfg; ls /env/bin | wc -l; ls /usr/share/doc | wc -l; ls /usr/bin | wc -l")
        size, n_bin, n_doc, n_usr_bin = (int(x) for x in r.stdout.split())
        assert (size, n_bin, n_doc) == (0, 0, 0) and n_usr_bin > 10, r
        assert sb.exec("touch /usr/share/doc/x").exit_code != 0  # covers are read-only
    with start(env) as sb:  # the parent environment is unchanged
        assert int(sb.exec("ls /env/bin | wc -l").stdout) > 0
    with pytest.raises(SandboxError):
        hide_paths_env(env, ["/workspace/pkg/"])
