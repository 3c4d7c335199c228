"""Local sandboxes: bubblewrap + a per-sandbox copy-on-write overlay + cgroups, driven from the host.

Usage:
    from c2jax.envs import build_env, start
    env = build_env("path/to/repo", requirements=["pytest"])
    with start(env, memory_bytes=1 << 30) as sb:
        r = sb.exec("python -m pytest -q", timeout=120)
        r.exit_code, r.stdout, r.killed_reason
        sb.write_file("fix.py", "...");  patch = sb.diff();  child = sb.fork()

Design (see ../shared/docs/environments.md §6):
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

Trust: the executor runs with the same uid as the commands, so a command can disturb its own
sandbox's executor (that is reported as a `SandboxError`, i.e. an infrastructure failure the caller
should mask); it can never reach the host. Exit codes are reported by the executor; kills, timeouts,
truncation and resource usage are the host's own observations.
"""
from __future__ import annotations

import atexit
import codecs
import dataclasses
import heapq
import itertools
import json
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
import weakref
from typing import Any, Iterator, Mapping, Sequence

from c2jax.envs import cgroups, fsops, images, seccomp, state
from c2jax.envs.bwrap import bwrap_path
from c2jax.envs.errors import SandboxClosed, SandboxError
from c2jax.envs.limits import Limits

WORKSPACE = "/workspace"
ENV_DIR = "/env"
CTL = "/run/c2jax"
SANDBOX_UID = 1000
KILLED_REASONS = ("timeout", "oom", "pids", "fsize", "disk", "output", "lifetime", "closed")

# The in-sandbox executor. Reads command numbers on stdin; for each, runs ctl/N/cmd in a new session
# with ctl/N/{in,out,err} as stdio and reports "pid P" then "rc R" on the FIFO ctl/N/st.
EXECUTOR = r"""
echo ready
while IFS= read -r n; do
  case "$n" in ''|*[!0-9]*) continue;; esac
  d=/run/c2jax/$n
  (
    exec 4>"$d/st"
    setsid /bin/sh "$d/cmd" <"$d/in" >"$d/out" 2>"$d/err" 4>&- &
    echo "pid $!" >&4
    wait "$!"
    echo "rc $?" >&4
  ) </dev/null >/dev/null 2>&1 &
done
"""

_ids = itertools.count()
_live: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()
_reaped_once = threading.Lock()
_reaped: float | bool = False


@dataclasses.dataclass
class ExecResult:
    """Outcome of one command. A command's failure is data here; infrastructure failure raises.

    Attributes:
      exit_code: the command's exit status (128+N if it died of signal N; -1 if never started).
      stdout, stderr: decoded (UTF-8, invalid bytes replaced) and cut at `Limits.output_bytes`.
      stdout_truncated, stderr_truncated: output beyond the limit was dropped.
      duration_s: wall time measured on the host.
      usage: sandbox-wide resource figures observed around the command: `cpu_s` (CPU seconds of
        the sandbox's cgroup during the command, None without cgroups), `memory_peak_bytes`.
      killed_reason: None, or why the host (or a limit) ended it: one of KILLED_REASONS.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    usage: dict = dataclasses.field(default_factory=dict)
    killed_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None


@dataclasses.dataclass
class _Spec:
    """Everything needed to launch one bwrap (a sandbox or an image build)."""

    layers: Sequence[str]
    venv: str
    interpreter: images.Interpreter
    venv_writable: bool = False
    wheelhouse: str | None = None
    network: bool = False
    overlay: bool = True  # False: bind the single layer read-write (image builds only)
    hide: Sequence[str] = ()  # in-sandbox paths covered up (images.hide_paths_env): files, "dir/"


REAP_INTERVAL_S = 300.0


def _reap_once() -> None:
    """Reap orphans on the first start in this process, then at most every REAP_INTERVAL_S."""
    global _reaped
    with _reaped_once:
        now = time.monotonic()
        if _reaped is False or now - _reaped > REAP_INTERVAL_S:
            state.reap_orphans()
            _reaped = now


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
    _reap_once()
    image = images.load(env_id)
    spec = _Spec(image.layers, image.venv, image.interpreter, hide=tuple(image.meta.get("hide", ())))
    return Sandbox(env_id, spec, limits)


def launch_build(build_dir: str, interp: images.Interpreter, script: str, *, wheelhouse: str | None,
                 network: bool, timeout_s: float) -> ExecResult:
    """Run an image-build script in a sandbox whose /env is `build_dir/venv` (writable)."""
    _reap_once()
    spec = _Spec([os.path.join(build_dir, "layer")], os.path.join(build_dir, "venv"), interp,
                 venv_writable=True, wheelhouse=wheelhouse, network=network, overlay=False)
    limits = Limits(timeout_s=timeout_s, lifetime_s=timeout_s + 60, cpu_s=int(timeout_s) + 60,
                    memory_bytes=4 << 30, pids=1024, cpus=float(os.cpu_count() or 1))
    with Sandbox("(build)", spec, limits) as sb:
        return sb.exec(script, timeout=timeout_s, cwd=WORKSPACE)


class Sandbox:
    """A running sandbox. Create with `start(env_id, ...)`; always `close()` (or use `with`)."""

    def __init__(self, env_id: str, spec: _Spec, limits: Limits) -> None:
        self.env_id = env_id
        self.limits = limits
        self.id = f"{os.getpid()}-{next(_ids)}-{uuid.uuid4().hex[:6]}"
        self._spec = spec
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._runs = itertools.count(1)
        self._active: set[_Run] = set()
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
        _deadlines.add(time.monotonic() + limits.lifetime_s, self)
        _live.add(self)

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
            self._proc = _spawner.popen(
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
            _remove_sandbox_files(self._cg, self.dir)
        else:
            _janitor.submit(self._cg, self.dir)

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
        _live.discard(self)

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
            members = [h for h in self.host_pids() if _session_of(h, self._pidns) == inner_pid]
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
        run = _Run(self, cmd, timeout, stdin, env, cwd, background)
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
        return _Frozen(self)

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
            return images.new_layer_env(self.env_id, lambda dst: _copy_layer(upper, self._root_fd, dst),
                                        env_id=env_id, extra_meta=extra_meta)

    def fork(self, **overrides: Any) -> "Sandbox":
        """A new sandbox starting from this one's current workspace (processes are not copied)."""
        return start(self.snapshot(), self.limits, **overrides)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, env={self.env_id!r}, alive={self.alive})"


class _Deadlines:
    """One daemon thread enforcing every sandbox's lifetime (a heap of deadlines, weak refs)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, weakref.ref]] = []
        self.seq = itertools.count()
        self.thread: threading.Thread | None = None

    def add(self, deadline: float, sb: "Sandbox") -> None:
        with self.cond:
            heapq.heappush(self.heap, (deadline, next(self.seq), weakref.ref(sb)))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, daemon=True, name="c2jax-lifetimes")
                self.thread.start()
            self.cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cond.wait(None if not self.heap else self.heap[0][0] - time.monotonic())
                _, _, ref = heapq.heappop(self.heap)
            sb = ref()
            if sb is not None and not sb._closed:
                try:
                    sb._expire()
                except Exception:  # noqa: BLE001 - never let one sandbox stop the thread
                    pass


_deadlines = _Deadlines()


class _Spawner:
    """Starts every bwrap from one long-lived thread.

    `--die-with-parent` uses PR_SET_PDEATHSIG, which fires when the *thread* that forked the
    process exits, not the process: a sandbox started from a short-lived worker thread would be
    SIGKILLed when that thread ends. A single daemon thread that lives as long as the process
    makes "parent" mean the Python process.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.jobs: list[list] = []
        self.thread: threading.Thread | None = None

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(*args, **kwargs)  # the main thread lives as long as the process
        job = [args, kwargs, None, None, False]
        with self.cond:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, daemon=True, name="c2jax-spawner")
                self.thread.start()
            self.jobs.append(job)
            self.cond.notify_all()
            self.cond.wait_for(lambda: job[4])
        if job[3] is not None:
            raise job[3]
        return job[2]

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.jobs)
                job = self.jobs.pop(0)
            try:
                job[2] = subprocess.Popen(*job[0], **job[1])
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                job[3] = e
            with self.cond:
                job[4] = True
                self.cond.notify_all()


_spawner = _Spawner()


def _remove_sandbox_files(cg: cgroups.SandboxCgroup, sb_dir: str) -> None:
    try:
        cg.remove()
    except OSError:
        pass
    try:
        state.umount(os.path.join(sb_dir, "rw"))
    except OSError:
        pass
    shutil.rmtree(sb_dir, ignore_errors=True)


class _Janitor:
    """One daemon thread removing closed sandboxes' cgroups, mounts and directories."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: list[tuple[cgroups.SandboxCgroup, str]] = []
        self.busy = 0
        self.thread: threading.Thread | None = None

    def submit(self, cg: cgroups.SandboxCgroup, sb_dir: str) -> None:
        with self.cond:
            self.queue.append((cg, sb_dir))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, daemon=True, name="c2jax-janitor")
                self.thread.start()
            self.cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                item = self.queue.pop(0)
                self.busy += 1
            try:
                _remove_sandbox_files(*item)
            finally:
                with self.cond:
                    self.busy -= 1
                    self.cond.notify_all()

    def flush(self, timeout: float | None = 30.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.queue and not self.busy, timeout)


_janitor = _Janitor()


def flush_cleanup(timeout: float | None = 30.0) -> bool:
    """Wait until every `close(wait=False)` sandbox's files, mount and cgroups are removed."""
    return _janitor.flush(timeout)


@atexit.register
def _close_all_at_exit() -> None:
    for sb in list(_live):
        try:
            sb.close()
        except Exception:  # noqa: BLE001
            pass
    _janitor.flush(10.0)


class _Frozen:
    """Context manager: stop every process of the sandbox (cgroup freezer) for a consistent copy."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb, self.done = sb, False

    def __enter__(self):
        try:
            self.done = self.sb._cg.freeze(True)
        except OSError:
            self.done = False
        return self

    def __exit__(self, *exc):
        if self.done:
            self.sb._cg.freeze(False)


def _copy_layer(upper: str, root_fd: int, dst: str) -> None:
    """Write the sandbox's changes as a new overlay layer at `dst`.

    The *structure* (which names changed, whiteouts for deletions, opaque directories, modes)
    comes from the upper dir's metadata; file *contents* and link targets are read through the
    merged /workspace view with the escape-proof file API, never from the mounted upper dir.
    Called while the sandbox is frozen, so both agree. FIFOs are recreated; sockets are skipped
    (they mean nothing once their process is gone).
    """
    os.mkdir(dst, 0o755)

    def walk(rel: str) -> None:
        src_dir = os.path.join(upper, rel)
        for name in sorted(os.listdir(src_dir)):
            r = f"{rel}/{name}" if rel else name
            src, out = os.path.join(upper, r), os.path.join(dst, r)
            st = os.lstat(src)
            if images.is_whiteout(st):
                os.mknod(out, stat.S_IFCHR | 0o000, os.makedev(0, 0))
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(out)
                os.chmod(out, stat.S_IMODE(st.st_mode))
                if images.is_opaque(src):
                    os.setxattr(out, "user.overlay.opaque", b"y", follow_symlinks=False)
                walk(r)
            elif stat.S_ISLNK(st.st_mode):
                head, _, leaf = r.rpartition("/")
                dfd = fsops.openat2(root_fd, head or ".", os.O_PATH | os.O_DIRECTORY)
                try:
                    os.symlink(os.readlink(leaf, dir_fd=dfd), out)
                finally:
                    os.close(dfd)
            elif stat.S_ISREG(st.st_mode):
                with open(out, "wb") as f:
                    f.write(fsops.read_bytes(root_fd, r))
                os.chmod(out, stat.S_IMODE(st.st_mode))
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(out, stat.S_IMODE(st.st_mode))

    walk("")


def _session_of(host_pid: int, pidns: str) -> int | None:
    """In-namespace session id of a host pid (via /proc/PID/status NSsid)."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSsid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def pids_in_namespace(pidns: str) -> set[int]:
    """Host pids of all processes whose pid namespace is `pidns` (e.g. 'pid:[4026532]')."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == pidns:
                    out.add(int(name))
            except OSError:
                pass
    return out


def _mkfifo(path: str) -> None:
    os.mkfifo(path, 0o666)
    os.chmod(path, 0o666)


class _Run:
    """One command inside a sandbox: control files, the host-side pump and limit enforcement."""

    def __init__(self, sb: Sandbox, cmd, timeout, stdin, env, cwd, background: bool) -> None:
        self.sb = sb
        lim = sb.limits
        self.n = next(sb._runs)
        self.dir = os.path.join(sb.ctl, str(self.n))
        self.timeout = float(timeout) if timeout is not None else (None if background else lim.timeout_s)
        self.background = background
        self.out = bytearray()
        self.err = bytearray()
        self.out_trunc = self.err_trunc = False
        self.total = 0
        self.read_pos = [0, 0]
        self.inner_pid: int | None = None
        self.rc: int | None = None
        self.killed: str | None = None
        self.cond = threading.Condition()
        self.done = False
        self.stdin_fd: int | None = None
        self.consume = False  # set by Process.read(consume=True) users such as ShellSession
        os.mkdir(self.dir)
        script = _command_script(cmd, env, cwd, lim)
        with open(os.path.join(self.dir, "cmd"), "w") as f:
            f.write(script)
        for name in ("out", "err", "st"):
            _mkfifo(os.path.join(self.dir, name))
        if background:
            _mkfifo(os.path.join(self.dir, "in"))
            self.stdin_fd = os.open(os.path.join(self.dir, "in"), os.O_RDWR | os.O_CLOEXEC)
            if stdin is not None:
                self.write_stdin(stdin)
        elif stdin is None:
            os.symlink("/dev/null", os.path.join(self.dir, "in"))
        else:
            with open(os.path.join(self.dir, "in"), "wb") as f:
                f.write(stdin.encode() if isinstance(stdin, str) else stdin)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        self.fds = {name: os.open(os.path.join(self.dir, name), flags) for name in ("out", "err", "st")}
        self.st_buf = b""
        self.cpu0 = sb._cg.cpu_seconds()
        self.oom0 = sb._cg.oom_kills()
        self.pids0 = sb._cg.pids_limit_hits()
        self.t0 = time.monotonic()
        sb._active.add(self)
        try:
            with sb._send_lock:
                sb._proc.stdin.write(f"{self.n}\n".encode())
                sb._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._close_fds()
            sb._active.discard(self)
            sb._check_alive()
            raise SandboxError(f"sandbox {sb.id}: executor is gone")
        if background:
            self.thread = threading.Thread(target=self._pump_safe, daemon=True, name=f"sb-run-{self.n}")
            self.thread.start()

    # ---- stdin (background only) ----
    def write_stdin(self, data: bytes | str) -> None:
        if self.stdin_fd is None:
            raise ValueError("stdin is closed")
        view = memoryview(data.encode() if isinstance(data, str) else data)
        while view:
            view = view[os.write(self.stdin_fd, view):]

    def close_stdin(self) -> None:
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
            self.stdin_fd = None

    # ---- the pump ----
    def _kill(self, reason: str) -> None:
        if self.killed is None:
            self.killed = reason
        if self.inner_pid is None:  # not started yet: wait briefly for its pid
            self._read_status(0.5)
        self.sb._kill_session(self.inner_pid)

    def _read_status(self, wait: float = 0.0) -> bool:
        """Consume status lines; True once the status FIFO is at EOF or 'rc' arrived."""
        fd = self.fds.get("st")
        if fd is None:
            return True
        if wait and not select.select([fd], [], [], wait)[0]:
            return False
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return False
        if not chunk:
            # read() gives EOF both before the reporter opened the FIFO and after it closed it;
            # only the latter makes the FIFO selectable (POLLHUP), so trust EOF only then.
            if wait or self.st_ready:
                self.st_eof = True
                return True
            return False
        self.st_buf += chunk
        while b"\n" in self.st_buf:
            line, self.st_buf = self.st_buf.split(b"\n", 1)
            kind, _, value = line.decode(errors="replace").partition(" ")
            if kind == "pid" and value.isdigit():
                self.inner_pid = int(value)
            elif kind == "rc" and value.lstrip("-").isdigit():
                self.rc = int(value)
        return self.rc is not None

    st_ready = False  # select() reported the status FIFO readable in this round
    st_eof = False

    def _drain(self, name: str) -> bool:
        """Read what is available from out/err; False at EOF."""
        fd = self.fds[name]
        lim = self.sb.limits
        while True:
            want = 65536
            if self.consume:  # streaming: never drop, apply backpressure (the writer blocks)
                want = min(want, self._backlog_room(name))
                if want <= 0:
                    return True
            try:
                chunk = os.read(fd, want)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            buf = self.out if name == "out" else self.err
            with self.cond:
                self.total += len(chunk)
                # Consume mode (streams read by the caller): the limit bounds the unread backlog.
                used = len(buf) - (self.read_pos[0 if name == "out" else 1] if self.consume else 0)
                room = lim.output_bytes - used
                if room > 0:
                    buf += chunk[:room]
                    self.cond.notify_all()
            if len(chunk) > max(room, 0):
                if name == "out":
                    self.out_trunc = True
                else:
                    self.err_trunc = True
            if self.total > lim.output_kill_bytes:
                self._kill("output")
                return True

    def _backlog_room(self, name: str) -> int:
        buf = self.out if name == "out" else self.err
        return self.sb.limits.output_bytes - len(buf)

    def _pump_safe(self) -> None:
        try:
            self._pump()
        except Exception as e:  # noqa: BLE001 - surfaced by wait()
            self.error = e
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    error: Exception | None = None

    def _pump(self) -> None:
        sb, lim = self.sb, self.sb.limits
        deadline = self.t0 + self.timeout if self.timeout is not None else None
        open_streams = {"out", "err"}
        last_check = 0.0
        while True:
            now = time.monotonic()
            if sb._dead_reason is not None or (sb._proc.poll() is not None):
                break
            if deadline is not None and now >= deadline and self.killed is None:
                self._kill("timeout")
            if now - last_check > 0.05:
                last_check = now
                if self.killed is None and sb._cg.pids_limit_hits() > self.pids0:
                    self._kill("pids")
            # In streaming mode a stream whose unread backlog is full is not read (backpressure).
            fds = [self.fds[s] for s in open_streams
                   if not self.consume or self._backlog_room(s) > 0] + [self.fds["st"]]
            wait = 0.05
            if deadline is not None and self.killed is None:
                wait = max(0.0, min(wait, deadline - now))
            ready = select.select(fds, [], [], wait)[0]
            for s in list(open_streams):
                if self.fds[s] in ready and not self._drain(s):
                    open_streams.discard(s)
            if self.fds["st"] in ready:
                self.st_ready = True
                if self._read_status():
                    break
        for s in open_streams:  # what the command wrote before exiting is already in the pipes
            self._drain(s)
        self._finish()

    def _finish(self) -> None:
        sb = self.sb
        self.duration = time.monotonic() - self.t0
        if self.rc is None:  # the executor vanished without reporting
            if sb._dead_reason in ("lifetime", "closed"):
                self.killed = self.killed or sb._dead_reason
                self.rc = 137
            elif self.st_eof and sb._proc.poll() is None:
                # The sandbox lives, but this command's reporter died before reporting (something
                # in the sandbox killed it): the command's outcome is unknown.
                self._close_fds()
                sb._active.discard(self)
                raise SandboxError(f"sandbox {sb.id}: the executor's reporter for this command was "
                                   "killed (by a process in the sandbox?); its outcome is unknown")
            else:
                self._close_fds()
                sb._active.discard(self)
                sb._dead_reason = sb._dead_reason or "crashed"
                raise SandboxError(f"sandbox {sb.id} died while running a command ({sb._dead_reason}: "
                                   "its executor was killed, possibly by a command inside it); "
                                   f"the command's outcome is unknown. {sb._diagnose()}")
        if self.killed is None:
            if self.rc == 128 + signal.SIGKILL and sb._cg.oom_kills() > self.oom0:
                self.killed = "oom"
            elif self.rc == 128 + signal.SIGXFSZ:
                self.killed = "fsize"
            elif self.rc == 128 + signal.SIGXCPU:
                self.killed = "timeout"  # the CPU-seconds limit
            elif sb._cg.pids_limit_hits() > self.pids0:
                self.killed = "pids"  # a fork failed at the process limit during the command
            elif self.rc != 0 and self._disk_full():
                self.killed = "disk"  # the writable layer is full (tmpfs returned ENOSPC)
        cpu1 = sb._cg.cpu_seconds()
        self.usage = {"cpu_s": (cpu1 - self.cpu0) if cpu1 is not None and self.cpu0 is not None else None,
                      "memory_peak_bytes": sb._cg.memory_peak()}
        self._close_fds()
        sb._active.discard(self)

    def _disk_full(self) -> bool:
        if not self.sb.limits_report.get("disk_bytes", "").startswith("enforced"):
            return False
        try:
            vfs = os.statvfs(os.path.join(self.sb.dir, "rw"))
        except OSError:
            return False
        return vfs.f_bavail * vfs.f_frsize < 256 * 1024

    def _close_fds(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}
        self.close_stdin()
        for name in ("cmd", "in", "out", "err", "st"):
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            shutil.rmtree(self.dir, ignore_errors=True)

    def result(self) -> ExecResult:
        return ExecResult(
            exit_code=self.rc if self.rc is not None else -1,
            stdout=bytes(self.out).decode("utf-8", errors="replace"),
            stderr=bytes(self.err).decode("utf-8", errors="replace"),
            stdout_truncated=self.out_trunc, stderr_truncated=self.err_trunc,
            duration_s=self.duration, usage=self.usage, killed_reason=self.killed)

    def wait(self, timeout: float | None = None) -> ExecResult | None:
        if not self.background:
            self._pump()
            return self.result()
        with self.cond:
            if not self.cond.wait_for(lambda: self.done, timeout):
                return None
        if self.error is not None:
            raise self.error
        return self.result()


def _command_script(cmd, env, cwd, lim: Limits) -> str:
    """The shell script the executor runs for one command (rlimits, cwd, env, then exec)."""
    if isinstance(cmd, (list, tuple)):
        if not cmd:
            raise ValueError("empty argv")
        body = "exec " + " ".join(shlex.quote(str(c)) for c in cmd)
    elif isinstance(cmd, str):
        body = cmd  # the script is already run by /bin/sh: no second shell needed
    else:
        raise TypeError(f"cmd must be a string or an argv list, got {type(cmd).__name__}")
    lines = [
        f"ulimit -S -t {int(lim.cpu_s)}",  # SIGXCPU at the soft limit, SIGKILL 1 s later
        f"ulimit -H -t {int(lim.cpu_s) + 1}",
        f"ulimit -f {max(1, lim.file_size_bytes // 512)}",  # 512-byte blocks
        f"ulimit -n {int(lim.nofile)} 2>/dev/null",
        f"cd -- {shlex.quote(cwd or WORKSPACE)} || exit 126",
    ]
    for k, v in (env or {}).items():
        if not k.replace("_", "a").isalnum() or k[0].isdigit():
            raise ValueError(f"invalid environment variable name {k!r}")
        lines.append(f"export {k}={shlex.quote(str(v))}")
    lines.append(body)
    return "\n".join(lines) + "\n"


class Process:
    """A background command: streamed output, stdin, poll/wait/kill. From `exec(background=True)`."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        # Incremental decoders: a UTF-8 character split across two reads is not mangled.
        self._dec = (codecs.getincrementaldecoder("utf-8")("replace"),
                     codecs.getincrementaldecoder("utf-8")("replace"))

    @property
    def pid(self) -> int | None:
        """Pid inside the sandbox (None until started)."""
        return self._run.inner_pid

    def read(self, timeout: float = 0.0) -> tuple[str, str]:
        """New stdout/stderr since the last read; waits up to `timeout` s for something new.

        Output is kept up to `Limits.output_bytes` per stream for the process's whole life (so
        `wait()` can return it) unless `stream_only()` was called, after which the limit bounds
        only what has not been read yet: a long-lived process can then stream without end.
        """
        r = self._run
        with r.cond:
            r.cond.wait_for(lambda: len(r.out) > r.read_pos[0] or len(r.err) > r.read_pos[1] or r.done,
                            timeout)
            out, err = bytes(r.out[r.read_pos[0]:]), bytes(r.err[r.read_pos[1]:])
            if r.consume:
                del r.out[:], r.err[:]
                r.read_pos = [0, 0]
                r.total = 0
            else:
                r.read_pos = [len(r.out), len(r.err)]
        return self._dec[0].decode(out), self._dec[1].decode(err)

    def stream_only(self) -> "Process":
        """Drop output once read (bounded memory for endless streams; `wait()` then returns only
        the unread rest)."""
        with self._run.cond:
            self._run.consume = True
        return self

    def stream(self, poll_s: float = 0.1) -> Iterator[tuple[str, str]]:
        """Yield (stdout, stderr) chunks until the command ends."""
        while True:
            out, err = self.read(poll_s)
            if out or err:
                yield out, err
            if self._run.done and not (out or err):
                return

    def write_stdin(self, data: bytes | str) -> None:
        self._run.write_stdin(data)

    def close_stdin(self) -> None:
        self._run.close_stdin()

    def poll(self) -> int | None:
        return self._run.rc if self._run.done else None

    def wait(self, timeout: float | None = None) -> ExecResult | None:
        """The ExecResult once finished, or None if still running after `timeout` seconds."""
        return self._run.wait(timeout)

    def kill(self) -> ExecResult | None:
        """Kill the command's whole session and return its result."""
        self._run.sb._kill_session(self._run.inner_pid)
        return self._run.wait(10.0)


class ShellSession:
    """A persistent `bash` in the sandbox (the harness's terminal tool).

    `run(cmd)` executes `cmd` in the same shell (via `eval` of a quoted here-document, so syntax
    errors are reported, not fatal), with stdin from /dev/null and stderr merged into stdout. On a
    timeout the command's child processes are killed; if the shell itself is stuck (a builtin
    loop), the shell is restarted and the result says so.
    """

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.proc: Process | None = None
        self._buf = ""
        self._truncated = False

    def _ensure(self) -> Process:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self.sb.exec(["/bin/bash", "--noprofile", "--norc"], background=True,
                                     env={"PS1": "", "PS2": ""}).stream_only()
            self._buf = ""
        return self.proc

    def run(self, cmd: str, timeout: float | None = None) -> ExecResult:
        proc = self._ensure()
        timeout = timeout if timeout is not None else self.sb.limits.timeout_s
        nonce = uuid.uuid4().hex
        marker = f"__C2JAX_DONE_{nonce}"
        proc.write_stdin(f"eval \"$(cat <<'{marker}'\n{cmd}\n{marker}\n)\" </dev/null 2>&1\n"
                         f"printf '\\n{marker} %d\\n' $?\n")
        t0 = time.monotonic()
        killed = None
        out = self._buf
        while True:
            idx = out.find(f"\n{marker} ")
            if idx >= 0 and "\n" in out[idx + 1:]:
                end = out.index("\n", idx + 1)
                rc = int(out[idx + len(marker) + 2:end])
                self._buf = out[end + 1:]
                text = out[:idx]
                truncated = self._truncated or len(text) > self.sb.limits.output_bytes
                self._truncated = False
                return ExecResult(rc, text[: self.sb.limits.output_bytes], "", truncated, False,
                                  time.monotonic() - t0, {}, killed)
            if proc.poll() is not None:
                self.proc = None
                raise SandboxError("the shell session ended unexpectedly") \
                    if killed is None and self.sb.alive else SandboxClosed("sandbox closed")
            chunk, _ = proc.read(0.05)
            out += chunk
            limit = self.sb.limits.output_bytes
            if len(out) > limit + 8192:  # keep the head (returned) and a tail (holds the marker)
                out = out[:limit] + out[-8192:]
                self._truncated = True
            elapsed = time.monotonic() - t0
            if elapsed > timeout and killed is None:
                killed = "timeout"
                self._kill_children(proc)
            elif killed and elapsed > timeout + 2.0:  # the shell itself is stuck: restart it
                proc.kill()
                self.proc = None
                return ExecResult(137, out[: self.sb.limits.output_bytes],
                                  "shell restarted after a timeout; its state was lost",
                                  False, False, elapsed, {}, "timeout")

    def _kill_children(self, proc: Process) -> None:
        shell_pid = proc.pid
        for h in self.sb.host_pids():
            try:
                with open(f"/proc/{h}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                nspid = int(fields["NSpid"].split()[-1])
                nssid = int(fields["NSsid"].split()[-1])
            except (OSError, KeyError, ValueError):
                continue
            if nssid == shell_pid and nspid != shell_pid:
                try:
                    os.kill(h, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.proc = None
