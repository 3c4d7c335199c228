"""Local sandboxes: bubblewrap + a per-sandbox copy-on-write overlay + cgroups, driven from the host.

Usage:
    from c2jax.envs import build_env, start
    env = build_env("path/to/repo", requirements=["pytest"])
    with start(env, memory_bytes=1 << 30) as sb:
        r = sb.exec("python -m pytest -q", timeout=120)
        r.exit_code, r.stdout, r.killed_reason
        sb.write_file("fix.py", "...");  patch = sb.diff();  child = sb.fork()

Design:
- One long-lived `bwrap` per sandbox: every namespace unshared (user, pid, net, ipc, uts, cgroup),
  uid 1000, all capabilities dropped, no further user namespaces, cleared environment, new session,
  dies with its parent. The root is an allow-list: /usr, a minimal /etc, /env (the environment's
  venv, read-only), /workspace (overlay: read-only layers + a writable upper dir on a size-capped
  tmpfs), a size-capped /tmp, private /proc and /dev, and the control directory /run/c2jax
  (read-only). The root itself is remounted read-only. Network: a private loopback only. A
  seccomp filter (seccomp.py) denies keyrings, bpf, io_uring, perf, mount and namespace calls.
- Inside runs a tiny POSIX-shell executor (dash starts in ~1 ms; Python would take ~28 ms). For
  each command the host writes a script and three FIFOs (stdout, stderr, status) into the control
  directory and sends the command number on the executor's stdin; the executor starts the command
  in its own session. The host reads the FIFOs directly, so output streaming, truncation, timeouts
  and kills are measured and enforced on the host side, never trusted to the sandbox.
- Limits: memory, pids and CPU bandwidth by a cgroup per sandbox (nested under the caller's);
  CPU time, file size and open files by rlimits per command; disk by the tmpfs size; wall time per
  command (host timer) and per sandbox (host timer plus an in-sandbox `timeout -s KILL`).
- `close()` kills bwrap, whose death kills the PID namespace's init and with it every process in the
  sandbox; the cgroup is then emptied with SIGKILL as a second line and removed. If the Python parent
  is SIGKILLed, `--die-with-parent` does the same, and the next `start()` reaps what is left
  (state.reap_orphans).

Modules: this one launches and drives the sandbox (`Sandbox`, `start`, `launch_build`); commands
run through `executor` (`ExecResult`, `Process`, `ShellSession`), snapshots through `overlay`, and
the background threads and clean-up live in `reaper` (`flush_cleanup`). The public names of all four
are importable from here.

Trust: the executor runs with the same uid as the commands, so a command can disturb its own
sandbox's executor (that is reported as a `SandboxError`, i.e. an infrastructure failure the caller
should mask); it can never reach the host. Exit codes are reported by the executor; kills, timeouts,
truncation and resource usage are the host's own observations.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import select
import shlex
import signal
import subprocess
import threading
import time
import uuid
from typing import Any, Mapping, Sequence
from c2jax.envs import cgroups, fsops, images, seccomp, state
from c2jax.envs.bwrap import bwrap_path
from c2jax.envs.errors import SandboxClosed, SandboxError
from c2jax.envs.limits import Limits
from c2jax.envs.executor import (CTL, ENV_DIR, EXECUTOR, KILLED_REASONS, SANDBOX_UID, WORKSPACE,
                                 CommandRun, ExecResult, Process, ShellSession, pids_in_namespace, session_of)
from c2jax.envs.overlay import Frozen, copy_layer
from c2jax.envs.reaper import (DEADLINES, JANITOR, LIVE_SANDBOXES, SPAWNER, flush_cleanup, reap_once,
                               remove_sandbox_files)

_ids = itertools.count()


@dataclasses.dataclass
class LaunchSpec:
    """Everything needed to launch one bwrap (a sandbox or an image build)."""

    layers: Sequence[str]
    venv: str
    interpreter: images.Interpreter
    venv_writable: bool = False
    wheelhouse: str | None = None
    network: bool = False
    overlay: bool = True  # False: bind the single layer read-write (image builds only)
    hide: Sequence[str] = ()  # in-sandbox paths covered up (images.hide_paths_env): files, "dir/"


def start(env_id: str, limits: Limits | Mapping[str, Any] | None = None, **overrides: Any) -> "Sandbox":
    """Start an isolated sandbox over environment `env_id`; returns a running `Sandbox`.

    `limits` (a `Limits` or a mapping, e.g. a config section) and keyword overrides such as
    `memory_bytes=...`, `timeout_s=...` set the limits; everything else keeps its safe default.
    Reaps sandboxes left by dead processes on the first call in this process.
    """
    if not isinstance(limits, Limits):
        limits = Limits.from_config(limits)
    if overrides:
        limits = limits.replace(**overrides)
    reap_once()
    image = images.load(env_id)
    spec = LaunchSpec(image.layers, image.venv, image.interpreter, hide=tuple(image.meta.get("hide", ())))
    return Sandbox(env_id, spec, limits)


def launch_build(build_dir: str, interp: images.Interpreter, script: str, *, wheelhouse: str | None,
                 network: bool, timeout_s: float) -> ExecResult:
    """Run an image-build script in a sandbox whose /env is `build_dir/venv` (writable)."""
    reap_once()
    spec = LaunchSpec([os.path.join(build_dir, "layer")], os.path.join(build_dir, "venv"), interp,
                 venv_writable=True, wheelhouse=wheelhouse, network=network, overlay=False)
    limits = Limits(timeout_s=timeout_s, lifetime_s=timeout_s + 60, cpu_s=int(timeout_s) + 60,
                    memory_bytes=4 << 30, pids=1024, cpus=float(os.cpu_count() or 1))
    with Sandbox("(build)", spec, limits) as sb:
        return sb.exec(script, timeout=timeout_s, cwd=WORKSPACE)


class Sandbox:
    """A running sandbox. Create with `start(env_id, ...)`; always `close()` (or use `with`)."""

    def __init__(self, env_id: str, spec: LaunchSpec, limits: Limits) -> None:
        self.env_id = env_id
        self.limits = limits
        self.id = f"{os.getpid()}-{next(_ids)}-{uuid.uuid4().hex[:6]}"
        self._spec = spec
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._runs = itertools.count(1)
        self._active: set[CommandRun] = set()
        self._dead_reason: str | None = None
        self._closed = False
        self._proc: subprocess.Popen | None = None
        self._child_pid: int | None = None
        self._root_fd: int | None = None
        self._cg: cgroups.SandboxCgroup = cgroups.NoCgroup("not created")
        self.dir = os.path.join(state.sandboxes_dir(), self.id)
        self.limits_report: dict[str, str] = {}
        self.started_at = time.monotonic()
        try:
            self._launch()
        except BaseException:
            self._teardown()
            raise
        DEADLINES.add(time.monotonic() + limits.lifetime_s, self)
        LIVE_SANDBOXES.add(self)

    # ---- launch and teardown ------------------------------------------------------------------

    def _launch(self) -> None:
        spec, limits = self._spec, self.limits
        rw = os.path.join(self.dir, "rw")
        os.makedirs(rw)
        if os.geteuid() == 0:
            state.mount_tmpfs(rw, limits.disk_bytes)
            self.limits_report["disk_bytes"] = "enforced (size-capped tmpfs upper dir)"
        else:
            self.limits_report["disk_bytes"] = "unavailable: mounting a size-capped tmpfs needs root"
        # Control files live on the same tmpfs (FIFOs on tmpfs are cheaper than on disk).
        self.ctl = os.path.join(rw, "ctl")
        os.mkdir(self.ctl, 0o755)
        os.mkdir(os.path.join(rw, "upper"), 0o755)
        os.mkdir(os.path.join(rw, "work"), 0o755)
        self._cg = cgroups.create(self.id, limits)
        self.limits_report.update(self._cg.report)
        for name in ("timeout_s", "lifetime_s", "output_bytes", "output_kill_bytes"):
            self.limits_report[name] = "enforced (host)"
        for name in ("cpu_s", "file_size_bytes", "nofile"):
            self.limits_report[name] = "enforced (rlimit per command)"
        self.limits_report["tmp_bytes"] = "enforced (size-capped tmpfs)"
        record = {"owner": state.owner_record(), "cgroups": self._cg.paths, "env_id": self.env_id}
        state.write_record(self.dir, record)  # from here on the reaper can undo everything

        info_r, info_w = os.pipe()
        self._info_fd = info_w
        self._seccomp_fd = seccomp.filter_fd()
        self.limits_report["seccomp"] = (
            f"enforced ({len(seccomp.DENIED)} syscalls denied)" if self._seccomp_fd is not None
            else "unavailable: libseccomp not found")
        argv = self._bwrap_argv(rw)
        # A shim joins the cgroups before exec'ing bwrap, so every sandbox process starts inside.
        joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in self._cg.procs_files())
        shim = (joins + " && " if joins else "") + 'exec "$@"'
        try:
            self._proc = SPAWNER.popen(
                ["/bin/sh", "-c", shim, "sh", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=tuple(f for f in (info_w, self._seccomp_fd) if f is not None),
                close_fds=True, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
        finally:
            os.close(info_w)
            if self._seccomp_fd is not None:
                os.close(self._seccomp_fd)
        bw = {"pid": self._proc.pid, "start": state.proc_start_time(self._proc.pid)}
        state.write_record(self.dir, {**record, "bwrap": bw})
        try:
            # One wake-up: the executor's "ready" comes after bwrap wrote its info (child pid).
            line = self._read_line(self._proc.stdout.fileno(), 30.0)
            info = self._read_all(info_r, 30.0) if line == b"ready" else b""
        finally:
            os.close(info_r)
        if line != b"ready":
            raise SandboxError(f"sandbox failed to start: {self._startup_error()}")
        try:
            self._child_pid = int(json.loads(info.decode() or "{}")["child-pid"])
        except (ValueError, KeyError):
            raise SandboxError(f"sandbox failed to start (no child pid): {self._startup_error()}") from None
        self._pidns = os.readlink(f"/proc/{self._child_pid}/ns/pid")
        root = os.open(f"/proc/{self._child_pid}/root", os.O_PATH | os.O_DIRECTORY)
        try:
            self._root_fd = os.open("workspace", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
        finally:
            os.close(root)

    def _startup_error(self) -> str:
        try:
            self._proc.kill()
            _, err = self._proc.communicate(timeout=5)
            return err.decode(errors="replace").strip() or f"exit status {self._proc.returncode}"
        except Exception as e:  # noqa: BLE001 - reporting only
            return repr(e)

    @staticmethod
    def _read_all(fd: int, timeout: float) -> bytes:
        deadline, chunks = time.monotonic() + timeout, []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SandboxError("timed out waiting for bwrap")
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    @staticmethod
    def _read_line(fd: int, timeout: float) -> bytes:
        deadline, buf = time.monotonic() + timeout, b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SandboxError("timed out waiting for the sandbox executor")
            chunk = os.read(fd, 1)
            if not chunk:
                break
            buf += chunk
        return buf.strip()

    def _bwrap_argv(self, rw: str) -> list[str]:
        spec, limits = self._spec, self.limits
        interp = spec.interpreter
        a = [bwrap_path(), "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID),
             "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--die-with-parent",
             "--new-session", "--cap-drop", "ALL", "--disable-userns", "--clearenv"]
        if spec.network:
            a.append("--share-net")
        path = f"{ENV_DIR}/bin:/usr/local/bin:/usr/bin:/bin"
        env = {"PATH": path, "HOME": "/tmp", "USER": "user", "LOGNAME": "user", "LANG": "C.UTF-8",
               "TERM": "dumb", "VIRTUAL_ENV": ENV_DIR, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": "/tmp"}
        if interp.mode == "prefix":
            env["LD_LIBRARY_PATH"] = f"{images.SANDBOX_PREFIX_PYTHON}/lib"
        for k, v in env.items():
            a += ["--setenv", k, v]
        a += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
            host = f"/{link}"
            if os.path.islink(host):
                a += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                a += ["--ro-bind", host, host]
        a += ["--ro-bind", state.minimal_etc(), "/etc"]
        if interp.mode == "prefix":
            a += ["--ro-bind", interp.host_prefix, images.SANDBOX_PREFIX_PYTHON]
        for hidden in interp.hide:  # the interpreter's own site-packages stay invisible
            a += ["--tmpfs", hidden, "--remount-ro", hidden]
        a += ["--proc", "/proc", "--dev", "/dev"]
        a += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
        a += ["--bind" if spec.venv_writable else "--ro-bind", spec.venv, ENV_DIR]
        if spec.wheelhouse:
            a += ["--ro-bind", os.path.abspath(spec.wheelhouse), "/wheelhouse"]
        # Per-environment hiding (images.hide_paths_env), after every bind it may cover (/usr,
        # /env, /opt/python): a directory becomes empty, a file empty.
        for hidden in spec.hide:
            if hidden.endswith("/"):
                a += ["--tmpfs", hidden.rstrip("/"), "--remount-ro", hidden.rstrip("/")]
            else:
                a += ["--ro-bind", state.empty_file(), hidden]
        if spec.overlay:
            for layer in spec.layers:
                a += ["--overlay-src", layer]
            a += ["--overlay", os.path.join(rw, "upper"), os.path.join(rw, "work"), WORKSPACE]
        else:
            a += ["--bind", spec.layers[0], WORKSPACE]
        a += ["--ro-bind", self.ctl, CTL, "--chdir", WORKSPACE,
              "--remount-ro", "/", "--info-fd", str(self._info_fd)]
        if self._seccomp_fd is not None:
            a += ["--seccomp", str(self._seccomp_fd)]
        # The lifetime is enforced by the host's timer; if the host dies, --die-with-parent ends it.
        a += ["/bin/sh", "-c", EXECUTOR]
        return a

    def _expire(self) -> None:
        self._terminate("lifetime")

    def _terminate(self, reason: str) -> None:
        """Kill every process of the sandbox (idempotent); runs see `reason` as killed_reason."""
        with self._lock:
            if self._dead_reason is None:
                self._dead_reason = reason
        proc = self._proc
        # Kill the pid namespace's init first: the kernel then kills every process in the
        # namespace, and bwrap (its parent) reaps it and exits, so no zombie is left behind.
        if self._child_pid is not None:
            try:
                os.kill(self._child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc is not None:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)  # --die-with-parent takes the rest down
                except ProcessLookupError:
                    pass
        self._cg.kill_all()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _teardown(self, wait: bool = True) -> None:
        """Kill everything now; remove cgroups, mount and files now (`wait`) or via the janitor."""
        self._terminate(self._dead_reason or "closed")
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        if self._proc is not None:
            for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                try:
                    f.close()
                except Exception:  # noqa: BLE001
                    pass
        if wait:
            remove_sandbox_files(self._cg, self.dir)
        else:
            JANITOR.submit(self._cg, self.dir)

    def close(self, wait: bool = False) -> None:
        """Kill every process of the sandbox; then remove its writable layer, cgroups and mount.

        When close() returns, no process of the sandbox is running. The files, mount and cgroups
        are removed by a background janitor thread (`flush_cleanup()` waits for it), or before
        returning with `wait=True`; a crash in between is undone by the orphan reaper.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._teardown(wait)
        LIVE_SANDBOXES.discard(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False:
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass

    @property
    def alive(self) -> bool:
        return not self._closed and self._dead_reason is None and self._proc is not None \
            and self._proc.poll() is None

    def _diagnose(self) -> str:
        """bwrap's exit status and stderr tail, for infrastructure error messages."""
        proc = self._proc
        if proc is None or proc.poll() is None:
            return "bwrap is still running."
        err = b""
        try:
            os.set_blocking(proc.stderr.fileno(), False)
            err = proc.stderr.read() or b""
        except (OSError, ValueError):
            pass
        return f"bwrap exit status {proc.returncode}; stderr: {err.decode(errors='replace')[-2000:]!r}"

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        if self._dead_reason is not None:
            raise SandboxClosed(f"sandbox {self.id} was killed ({self._dead_reason})")
        if self._proc.poll() is not None:
            self._dead_reason = "crashed"
            raise SandboxError(f"sandbox {self.id} died (bwrap exit {self._proc.returncode})")

    # ---- processes ----------------------------------------------------------------------------

    def host_pids(self) -> set[int]:
        """Host pids of every process inside the sandbox (cgroup, or a pid-namespace scan)."""
        pids = self._cg.pids()
        if pids or self._cg.paths:
            return pids
        return pids_in_namespace(self._pidns) if getattr(self, "_pidns", None) else set()

    def _kill_session(self, inner_pid: int | None) -> None:
        """SIGKILL every sandbox process in the session led by in-sandbox pid `inner_pid`."""
        if inner_pid is None:
            return
        for _ in range(50):
            members = [h for h in self.host_pids() if session_of(h, self._pidns) == inner_pid]
            if not members:
                return
            for h in members:
                try:
                    os.kill(h, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def exec(self, cmd: str | Sequence[str], timeout: float | None = None, stdin: bytes | str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None,
             background: bool = False) -> "ExecResult | Process":
        """Run a command (argv list, or a string for /bin/sh -c) in the sandbox.

        Args:
          timeout: wall-clock seconds (default `limits.timeout_s`); the command's whole session is
            killed on expiry (`killed_reason="timeout"`).
          stdin: bytes/str fed to the command, then EOF; None gives an empty stdin (EOF at once).
          env: extra environment variables; cwd: directory inside the sandbox (default /workspace).
          background: return a `Process` at once (streamed output, stdin writes, wait/kill).
        Raises SandboxError if the sandbox itself fails; a failing command is an ExecResult.
        """
        self._check_alive()
        run = CommandRun(self, cmd, timeout, stdin, env, cwd, background)
        if background:
            return Process(run)
        return run.wait()

    def shell(self) -> "ShellSession":
        """A persistent bash session: cwd, variables and functions carry over between `run`s."""
        return ShellSession(self)

    # ---- host-side files (always through the merged /workspace view) --------------------------

    def _fd(self) -> int:
        self._check_alive()
        return self._root_fd

    def read_file(self, path: str, max_bytes: int | None = None, binary: bool = False) -> str | bytes:
        """Read a regular file of the workspace (refuses symlink escapes and special files)."""
        data = fsops.read_bytes(self._fd(), path, max_bytes)
        return data if binary else data.decode("utf-8", errors="replace")

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create/replace a regular file of the workspace, making parent directories."""
        fsops.write_bytes(self._fd(), path, data.encode() if isinstance(data, str) else data, mode)

    def list_dir(self, path: str = "") -> list[dict]:
        """Entries (name, type, size, mode) of a workspace directory, symlinks not followed."""
        return fsops.list_dir(self._fd(), path)

    def glob(self, pattern: str, limit: int = 10000) -> list[str]:
        """Workspace-relative paths matching `pattern` (`**` spans directories)."""
        return fsops.glob(self._fd(), pattern, limit)

    # ---- diff, snapshot, fork -----------------------------------------------------------------

    def _frozen(self):
        return Frozen(self)

    def diff(self) -> str:
        """A git-format patch (binary-safe) from the environment's base to the current workspace."""
        from c2jax.envs.gitdiff import workspace_diff

        self._check_alive()
        with self._frozen():
            return workspace_diff(self._spec.layers, os.path.join(self.dir, "rw", "upper"), self._root_fd)

    def snapshot(self, env_id: str | None = None, extra_meta: dict | None = None) -> str:
        """Freeze the workspace's current state as a new environment; returns its env_id.

        The sandbox is frozen (cgroup freezer) while its changes are copied, so the snapshot is
        consistent; contents are read through the merged view, deletions kept as whiteouts.
        `env_id`/`extra_meta` name the new environment and add to its meta.json (`derive_env`).
        """
        self._check_alive()
        upper = os.path.join(self.dir, "rw", "upper")
        with self._frozen():
            return images.new_layer_env(self.env_id, lambda dst: copy_layer(upper, self._root_fd, dst),
                                        env_id=env_id, extra_meta=extra_meta)

    def fork(self, **overrides: Any) -> "Sandbox":
        """A new sandbox starting from this one's current workspace (processes are not copied)."""
        return start(self.snapshot(), self.limits, **overrides)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, env={self.env_id!r}, alive={self.alive})"


__all__ = ["CTL", "ENV_DIR", "KILLED_REASONS", "SANDBOX_UID", "WORKSPACE", "ExecResult", "Process", "Sandbox",
           "ShellSession", "flush_cleanup", "launch_build", "pids_in_namespace", "start"]
