"""SandboxPool: a concurrency cap, a bounded queue with backpressure, a warm pool, health checks,
orphan reaping at start-up and metrics, over the local sandbox backend.

    pool = SandboxPool(max_concurrency=2, max_queue=64, warm=2, warm_env=env)
    with pool.session(env) as sb:          # blocks while 2 sandboxes are out; PoolFull past 64 waiters
        sb.exec("pytest -q")
    pool.metrics()                         # start latency p50/p99, active, queued, failures by reason
    pool.close()

The cap counts leased sandboxes (the expensive part is the commands they run). Warm sandboxes
(started ahead with default limits over `warm_env`) are extra, bounded by `warm`, and are handed out
first when a request matches, so bursty demand does not pay the start latency; a background thread
refills them. Every lease is a proxy whose `close()` returns the slot.
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from typing import Any, Iterator

from c2jax.envs import state
from c2jax.envs.errors import PoolFull, SandboxError
from c2jax.envs.limits import Limits
from c2jax.envs.sandbox import ExecResult, Sandbox, start


class Lease:
    """A pooled sandbox: the `Sandbox` interface; `close()` kills it and frees the pool slot."""

    def __init__(self, pool: "SandboxPool", sb: Sandbox) -> None:
        self._pool, self._sb, self._closed = pool, sb, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    def exec(self, *args: Any, **kwargs: Any):
        try:
            result = self._sb.exec(*args, **kwargs)
        except SandboxError as e:
            self._pool._count_failure(f"exec:{type(e).__name__}")
            raise
        if isinstance(result, ExecResult) and result.killed_reason:
            self._pool._count_failure(f"killed:{result.killed_reason}")
        return result

    def fork(self, timeout: float | None = None, **overrides: Any) -> "Lease":
        """A pooled sandbox from this one's current workspace (counts against the cap)."""
        return self._pool.acquire(self._sb.snapshot(), timeout, **overrides)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._sb.close(wait=False)
            finally:
                self._pool._release()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SandboxPool:
    """Local pool of sandboxes; see the module docstring."""

    def __init__(self, max_concurrency: int | None = None, max_queue: int = 256, warm: int = 0,
                 warm_env: str | None = None, limits: Limits | dict | None = None,
                 health_interval_s: float = 30.0) -> None:
        self.max_concurrency = max_concurrency or os.cpu_count() or 1
        if self.max_concurrency < 1 or max_queue < 0 or warm < 0:
            raise ValueError("max_concurrency >= 1, max_queue >= 0 and warm >= 0 are required")
        if warm and not warm_env:
            raise ValueError("a warm pool needs warm_env")
        self.max_queue = max_queue
        self.limits = limits if isinstance(limits, Limits) else Limits.from_config(limits)
        self.warm_target, self.warm_env = warm, warm_env
        self._cond = threading.Condition()
        self._active = 0
        self._queued = 0
        self._closed = False
        self._warm: collections.deque[Sandbox] = collections.deque()
        self._latencies: collections.deque[float] = collections.deque(maxlen=10000)
        self._failures: collections.Counter[str] = collections.Counter()
        self._started = 0
        self.reaped = state.reap_orphans()  # sandboxes left by crashed processes
        self._health_interval = health_interval_s
        self._refill_event = threading.Event()
        self._bg = None
        if warm:
            self._bg = threading.Thread(target=self._background, daemon=True, name="c2jax-pool-warm")
            self._bg.start()
            self._refill_event.set()

    # ---- leasing ----
    def acquire(self, env_id: str, timeout: float | None = None, **overrides: Any) -> Lease:
        """A started sandbox over `env_id`; waits for a free slot (PoolFull when the queue is full
        or `timeout` passes)."""
        with self._cond:
            if self._closed:
                raise SandboxError("pool is closed")
            if self._active >= self.max_concurrency:
                if self._queued >= self.max_queue:
                    self._failures["pool_full"] += 1
                    raise PoolFull(f"{self._queued} requests already queued (max_queue={self.max_queue})")
                self._queued += 1
                try:
                    ok = self._cond.wait_for(lambda: self._active < self.max_concurrency or self._closed,
                                             timeout)
                finally:
                    self._queued -= 1
                if not ok:
                    self._failures["queue_timeout"] += 1
                    raise PoolFull(f"no sandbox slot within {timeout} s")
                if self._closed:
                    raise SandboxError("pool is closed")
            self._active += 1
        try:
            return Lease(self, self._take_or_start(env_id, overrides))
        except BaseException:
            self._release()
            raise

    @contextlib.contextmanager
    def session(self, env_id: str, timeout: float | None = None, **overrides: Any) -> Iterator[Lease]:
        lease = self.acquire(env_id, timeout, **overrides)
        try:
            yield lease
        finally:
            lease.close()

    def _take_or_start(self, env_id: str, overrides: dict) -> Sandbox:
        if env_id == self.warm_env and not overrides:
            while True:
                with self._cond:
                    sb = self._warm.popleft() if self._warm else None
                if sb is None:
                    break
                self._refill_event.set()
                if sb.alive:
                    return sb
                self._failures["warm_dead"] += 1
                sb.close(wait=False)
        return self._start(env_id, overrides)

    def _start(self, env_id: str, overrides: dict) -> Sandbox:
        t0 = time.perf_counter()
        try:
            sb = start(env_id, self.limits, **overrides)
        except SandboxError as e:
            self._count_failure(f"start:{type(e).__name__}")
            raise
        with self._cond:
            self._latencies.append(time.perf_counter() - t0)
            self._started += 1
        return sb

    def _release(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify()

    def _count_failure(self, reason: str) -> None:
        with self._cond:
            self._failures[reason] += 1

    # ---- warm pool and health ----
    def _background(self) -> None:
        last_health = time.monotonic()
        while not self._closed:
            self._refill_event.wait(timeout=min(1.0, self._health_interval))
            self._refill_event.clear()
            while not self._closed:
                with self._cond:
                    need = len(self._warm) < self.warm_target
                if not need:
                    break
                try:
                    sb = self._start(self.warm_env, {})
                except SandboxError:
                    time.sleep(0.5)
                    continue
                with self._cond:
                    if self._closed:
                        sb.close(wait=False)
                        return
                    self._warm.append(sb)
            if time.monotonic() - last_health > self._health_interval:
                self.health_check()
                last_health = time.monotonic()

    def health_check(self) -> dict:
        """Run `true` in every warm sandbox; drop (and count) the ones that fail."""
        with self._cond:
            warm = list(self._warm)
            self._warm.clear()
        healthy, bad = [], 0
        for sb in warm:
            try:
                ok = sb.alive and sb.exec("true", timeout=10).ok
            except SandboxError:
                ok = False
            if ok:
                healthy.append(sb)
            else:
                bad += 1
                self._count_failure("health_check")
                sb.close(wait=False)
        with self._cond:
            self._warm.extendleft(reversed(healthy))
        if bad:
            self._refill_event.set()
        return {"healthy": len(healthy), "removed": bad}

    def wait_warm(self, timeout: float = 30.0) -> bool:
        """Block until the warm pool is full (for tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if len(self._warm) >= self.warm_target:
                    return True
            time.sleep(0.01)
        return False

    # ---- metrics and shutdown ----
    def metrics(self) -> dict:
        with self._cond:
            lat = sorted(self._latencies)
            return {
                "active": self._active, "queued": self._queued, "warm": len(self._warm),
                "started": self._started, "max_concurrency": self.max_concurrency,
                "start_latency_p50_s": lat[len(lat) // 2] if lat else None,
                "start_latency_p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
                "failures": dict(self._failures), "reaped_at_start": len(self.reaped),
            }

    def close(self) -> None:
        """Close warm sandboxes and refuse new requests (leased ones are closed by their holders)."""
        with self._cond:
            self._closed = True
            warm = list(self._warm)
            self._warm.clear()
            self._cond.notify_all()
        self._refill_event.set()
        if self._bg is not None:
            self._bg.join(timeout=30)
        for sb in warm:
            sb.close(wait=True)
        with self._cond:
            late = list(self._warm)
            self._warm.clear()
        for sb in late:
            sb.close(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
