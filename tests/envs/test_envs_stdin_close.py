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

    def slow_close(fd: int) -> None:  # widens the window between the None check and the close
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
