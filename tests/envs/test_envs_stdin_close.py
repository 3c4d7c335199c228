"""A background command's stdin is closed exactly once when the caller (`Process.close_stdin`) and the
pump thread (on the command's end) close it at the same time. A double close surfaced as EBADF from
`wait()` under load (two pytest workers), and could close an unrelated file whose descriptor number
had been reused in between."""
from __future__ import annotations

import os
import threading
import time

from c2jax.envs import executor


def _run_with_stdin(fd: int) -> executor.CommandRun:
    run = object.__new__(executor.CommandRun)  # only the stdin fields: no sandbox needed
    run.stdin_fd = fd
    run._stdin_lock = threading.Lock()
    return run


def _concurrent_closes(run, monkeypatch) -> list[int]:
    closed: list[int] = []
    real_close = os.close

    watched = run.stdin_fd

    def slow_close(fd: int) -> None:  # widens the window between the None check and the close
        if fd == watched:  # os.close is patched process-wide: other tests' threads close other fds
            closed.append(fd)
            time.sleep(0.05)
        real_close(fd)

    monkeypatch.setattr(executor.os, "close", slow_close)
    errors: list[BaseException] = []

    def close() -> None:
        try:
            run.close_stdin()
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return closed


def test_concurrent_close_stdin_closes_once(monkeypatch):
    r, w = os.pipe()
    os.close(r)
    run = _run_with_stdin(w)
    assert _concurrent_closes(run, monkeypatch) == [w]
    assert run.stdin_fd is None


def test_positive_control_unlocked_close_closes_twice(monkeypatch):
    """The pre-fix method (check, close, then clear) under the same schedule closes more than once,
    so the test above can fail."""
    r, w = os.pipe()
    os.close(r)

    class Unlocked:
        stdin_fd = w

        def close_stdin(self) -> None:
            if self.stdin_fd is not None:
                try:
                    os.close(self.stdin_fd)
                except OSError:
                    pass  # EBADF: the double close this test shows
                self.stdin_fd = None

    # the unlocked method reads executor.os.close too (same module object `os`)
    closed = _concurrent_closes(Unlocked(), monkeypatch)
    assert len(closed) > 1 and set(closed) == {w}


def _write_racing_close(run, monkeypatch, reused_w: int) -> bool:
    """Runs run.write_stdin(b"secret") with the pump's close landing inside the write: the first
    os.write call first closes stdin (as the pump does when the command ends) and puts an unrelated
    pipe's write end on the freed number (as a thread opening a file at that moment would)."""
    real_write = os.write
    old_fd = run.stdin_fd
    raced = []

    me = threading.get_ident()

    def write_after_close(fd: int, data) -> int:
        if not raced and threading.get_ident() == me:  # patched process-wide: only this thread's write
            raced.append(fd)
            run.close_stdin()
            os.dup2(reused_w, old_fd)  # the freed number now names another file
        return real_write(fd, data)

    monkeypatch.setattr(executor.os, "write", write_after_close)
    try:
        run.write_stdin(b"secret")
    except ValueError:
        return True  # the fixed method says stdin closed during the write
    return False


def _pending(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 100)
    except BlockingIOError:
        return b""


def test_write_racing_close_never_reaches_a_reused_descriptor(monkeypatch):
    r, w = os.pipe()
    other_r, other_w = os.pipe()
    run = _run_with_stdin(w)
    told = _write_racing_close(run, monkeypatch, other_w)
    try:
        assert told  # the caller hears that the command's stdin closed under it
        assert _pending(other_r) == b""  # nothing leaked into the unrelated file
        assert _pending(r) == b"secret"  # it went to the command's own pipe, now closed
        assert run.stdin_fd is None
    finally:
        for fd in (r, other_r, other_w, w):  # w: the reused number, now the other pipe's duplicate
            try:
                os.close(fd)
            except OSError:
                pass


def test_positive_control_unguarded_write_reaches_the_reused_descriptor(monkeypatch):
    """The pre-fix method (write to the shared number) under the same schedule writes into the
    unrelated file, so the test above can fail."""
    r, w = os.pipe()
    other_r, other_w = os.pipe()

    class Unguarded:
        stdin_fd = w
        _stdin_lock = threading.Lock()
        close_stdin = executor.CommandRun.close_stdin

        def write_stdin(self, data: bytes) -> None:
            if self.stdin_fd is None:
                raise ValueError("stdin is closed")
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]  # the number read before the close landed

    _write_racing_close(Unguarded(), monkeypatch, other_w)
    try:
        assert _pending(other_r) == b"secret"
    finally:
        for fd in (r, other_r, other_w, w):
            try:
                os.close(fd)
            except OSError:
                pass
