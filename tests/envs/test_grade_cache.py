"""GradeCache: one grader run per distinct (task, diff); load-dependent verdicts are never reused;
concurrent identical calls share one run; a grader exception reaches every caller's own retry."""
from __future__ import annotations

import threading
import time
import types

import pytest

from c2jax.envs.grading import GradeResult
from c2jax.envs.grade_cache import GradeCache, reusable


def _task(i: str):
    return types.SimpleNamespace(instance_id=i)


class CountingGrader:
    def __init__(self, flags=(), masked=False, delay=0.0):
        self.calls: list[tuple[str, str]] = []
        self.flags, self.masked, self.delay = list(flags), masked, delay
        self.lock = threading.Lock()

    def __call__(self, task, diff):
        with self.lock:
            self.calls.append((task.instance_id, diff))
        time.sleep(self.delay)
        ok = diff == "good"
        return GradeResult(float(ok), ok, float(ok), 0, self.masked, list(self.flags), {"t": "passed" if ok else "failed"})


def test_hits_return_the_graders_verdict_and_skip_the_run():
    g = CountingGrader()
    cache = GradeCache(g)
    a = cache(_task("t1"), "good")
    b = cache(_task("t1"), "good")
    c = cache(_task("t2"), "good")  # another task: graded again
    d = cache(_task("t1"), "bad")   # another diff: graded again
    assert (a.resolved, b.resolved, c.resolved, d.resolved) == (True, True, True, False)
    assert len(g.calls) == 3 and cache.stats()["hits"] == 1 and cache.stats()["misses"] == 3
    b.flags.append("mutated")  # a caller changing its copy leaves the cached verdict alone
    assert cache(_task("t1"), "good").flags == []


@pytest.mark.parametrize("flags,masked", [(["timeout"], False), (["infra:sandbox"], False), ([], True)])
def test_load_dependent_verdicts_are_graded_again(flags, masked):
    g = CountingGrader(flags=flags, masked=masked)
    cache = GradeCache(g)
    for _ in range(3):
        cache(_task("t"), "good")
    assert len(g.calls) == 3 and not reusable(g(_task("t"), "good"))


def test_positive_control_without_the_cache_every_duplicate_runs():
    g = CountingGrader()
    for _ in range(4):
        g(_task("t"), "good")
    assert len(g.calls) == 4  # what the cache saves: 3 of these 4 runs
    cache = GradeCache(CountingGrader())
    for _ in range(4):
        cache(_task("t"), "good")
    assert len(cache.grade_fn.calls) == 1


def test_concurrent_identical_calls_share_one_run():
    g = CountingGrader(delay=0.2)
    cache = GradeCache(g)
    out = []
    threads = [threading.Thread(target=lambda: out.append(cache(_task("t"), "good"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 8 and all(r.resolved for r in out)
    assert len(g.calls) == 1 and cache.stats()["hits"] == 7


def test_a_grader_exception_is_raised_and_not_cached():
    calls = []

    def flaky(task, diff):
        calls.append(diff)
        if len(calls) == 1:
            raise RuntimeError("sandbox died")
        return GradeResult(1.0, True, 1.0, 0)

    cache = GradeCache(flaky)
    with pytest.raises(RuntimeError):
        cache(_task("t"), "good")
    assert cache(_task("t"), "good").resolved and len(calls) == 2
