"""The sandboxes' background threads and clean-up: one spawner thread that starts every bwrap (so
`--die-with-parent` means the process, not a worker thread), one thread enforcing lifetimes, one
janitor removing closed sandboxes' cgroups, mounts and files, orphan reaping (`reap_once`), and
closing every live sandbox at interpreter exit.
"""
from __future__ import annotations

import atexit
import heapq
import itertools
import os
import shutil
import subprocess
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from c2jax.envs import cgroups, state

if TYPE_CHECKING:
    from c2jax.envs.sandbox import Sandbox

LIVE_SANDBOXES: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()
_reaped_once = threading.Lock()
last_reap: float | bool = False

REAP_INTERVAL_S = 300.0


def reap_once() -> None:
    """Reap orphans on the first start in this process, then at most every REAP_INTERVAL_S."""
    global last_reap
    with _reaped_once:
        now = time.monotonic()
        if last_reap is False or now - last_reap > REAP_INTERVAL_S:
            state.reap_orphans()
            last_reap = now


class Deadlines:
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


DEADLINES = Deadlines()


class Spawner:
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


SPAWNER = Spawner()


def remove_sandbox_files(cg: cgroups.SandboxCgroup, sb_dir: str) -> None:
    try:
        cg.remove()
    except OSError:
        pass
    try:
        state.umount(os.path.join(sb_dir, "rw"))
    except OSError:
        pass
    shutil.rmtree(sb_dir, ignore_errors=True)


class Janitor:
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
                remove_sandbox_files(*item)
            finally:
                with self.cond:
                    self.busy -= 1
                    self.cond.notify_all()

    def flush(self, timeout: float | None = 30.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.queue and not self.busy, timeout)


JANITOR = Janitor()


def flush_cleanup(timeout: float | None = 30.0) -> bool:
    """Wait until every `close(wait=False)` sandbox's files, mount and cgroups are removed."""
    return JANITOR.flush(timeout)


@atexit.register
def _close_all_at_exit() -> None:
    for sb in list(LIVE_SANDBOXES):
        try:
            sb.close()
        except Exception:  # noqa: BLE001
            pass
    JANITOR.flush(10.0)
