"""Running commands in a sandbox: the in-sandbox POSIX-shell executor (`EXECUTOR`), one command's
host-side driver (`CommandRun`: script, FIFOs, streaming, truncation, timeouts, kills), its result
(`ExecResult`), background processes (`Process`) and the persistent shell (`ShellSession`).

The host reads the FIFOs directly, so output limits, timeouts and kills are measured and enforced on
the host side, never trusted to the sandbox (see `c2jax.envs.sandbox`).
"""
from __future__ import annotations

import codecs
import dataclasses
import os
import select
import shlex
import shutil
import signal
import threading
import time
import uuid
from typing import TYPE_CHECKING, Iterator

from c2jax.envs.errors import SandboxClosed, SandboxError
from c2jax.envs.limits import Limits

if TYPE_CHECKING:
    from c2jax.envs.sandbox import Sandbox

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


def session_of(host_pid: int, pidns: str) -> int | None:
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


class CommandRun:
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
        self._stdin_lock = threading.Lock()
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
        # The pump thread may close stdin (the command ended) while this writes. Writing to the shared
        # number could then hit EBADF or, had another thread reused the number, an unrelated file. So
        # write through a private duplicate taken under the close lock: a close in the meantime leaves
        # it pointing at this command's FIFO, and the caller hears that stdin closed during the write.
        with self._stdin_lock:
            if self.stdin_fd is None:
                raise ValueError("stdin is closed")
            fd = self.stdin_fd
            own = os.dup(fd)
        try:
            view = memoryview(data.encode() if isinstance(data, str) else data)
            while view:
                view = view[os.write(own, view):]
        finally:
            os.close(own)
        if self.stdin_fd != fd:
            raise ValueError("stdin was closed during the write (the command ended)")

    def close_stdin(self) -> None:
        # Called by the caller's thread (Process.close_stdin) and by the pump thread when the command
        # ends (_close_fds): take the fd under the lock so exactly one of them closes it. Without it
        # both could pass the None check and close twice: EBADF in the pump (surfaced by wait()), or,
        # had another thread reused the number in between, an unrelated file closed.
        with self._stdin_lock:
            fd, self.stdin_fd = self.stdin_fd, None
        if fd is not None:
            os.close(fd)

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

    def __init__(self, run: CommandRun) -> None:
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
