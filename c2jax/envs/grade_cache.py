"""Memoised grading: a (task, diff) pair is graded once per run.

The toyfix grader is a deterministic function of the task and the diff (a fresh copy of the broken
repository, the diff applied, the hidden tests run), and a policy that has learned a fix repeats it:
in a held-out evaluation of 128 tasks x 8 samples about 770 samples edit something but only ~130
distinct (task, diff) pairs occur. Each sandboxed pytest run costs ~0.5-1 CPU-second, so on a 2-core
machine re-grading duplicates is most of the evaluation's grading time.

    grade_fn = GradeCache(grade_validated)
    result = grade_fn(task, diff)          # the grader's GradeResult (a copy on a hit)
    grade_fn.stats()                       # {"hits", "misses", "uncached"}

Only clean verdicts are kept: a masked result (infrastructure) or one flagged timeout / oom / crash /
no_report / infra:* depends on the machine's load, not only on the diff, so it is never reused and
the next identical diff is graded again. Concurrent calls with the same key wait for the first
(the group's samples often finish together). Thread-safe: the rollout loop grades in worker threads.
"""
from __future__ import annotations

import copy
import hashlib
import threading
from concurrent.futures import Future
from typing import Any, Callable

LOAD_DEPENDENT_FLAGS = ("timeout", "oom", "crash", "no_report")


def reusable(result: Any) -> bool:
    """Whether a GradeResult is a pure function of (task, diff) and may be served again."""
    if getattr(result, "masked", False):
        return False
    flags = list(getattr(result, "flags", []) or [])
    return not any(f in LOAD_DEPENDENT_FLAGS or str(f).startswith("infra") for f in flags)


class GradeCache:
    """A grade function (task, diff) -> GradeResult that runs `grade_fn` once per distinct pair."""

    def __init__(self, grade_fn: Callable[[Any, str], Any], max_entries: int = 200_000):
        self.grade_fn = grade_fn
        self.max_entries = int(max_entries)
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str], Any] = {}
        self._pending: dict[tuple[str, str], Future] = {}
        self.hits = self.misses = self.uncached = 0

    @staticmethod
    def key(task: Any, diff: str) -> tuple[str, str]:
        return str(task.instance_id), hashlib.sha256((diff or "").encode()).hexdigest()

    def __call__(self, task: Any, diff: str) -> Any:
        k = self.key(task, diff)
        with self._lock:
            if k in self._done:
                self.hits += 1
                return _copy(self._done[k])
            fut = self._pending.get(k)
            owner = fut is None
            if owner:
                fut = self._pending[k] = Future()
        if not owner:
            try:
                result = fut.result()
            except BaseException:  # the first caller's grading raised: grade this one ourselves
                result = None
            if result is not None and reusable(result):
                with self._lock:
                    self.hits += 1
                return _copy(result)
            return self._grade_uncached(task, diff)
        try:
            result = self.grade_fn(task, diff)
        except BaseException as e:
            with self._lock:
                self._pending.pop(k, None)
                self.misses += 1
            fut.set_exception(e)
            raise
        with self._lock:
            self._pending.pop(k, None)
            self.misses += 1
            if reusable(result) and len(self._done) < self.max_entries:
                self._done[k] = result
        fut.set_result(result)
        return _copy(result)

    def _grade_uncached(self, task: Any, diff: str) -> Any:
        with self._lock:
            self.uncached += 1
        return self.grade_fn(task, diff)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "uncached": self.uncached, "entries": len(self._done)}


def _copy(result: Any) -> Any:
    """A copy the caller may change without touching the cached verdict."""
    return copy.deepcopy(result)
