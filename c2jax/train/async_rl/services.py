"""Services behind futures, one interface and two backends (embedded threads, or Ray actors).

    backend = make_backend("local")                    # or make_backend("ray", address="127.0.0.1:6379")
    svc = backend.spawn("rollout", factory, workers=4) # factory() builds the service object once
    fut = svc.submit("run_group", task, batch)         # concurrent.futures.Future of the method's result
    svc.alive(); svc.restart()                         # health check; replace a dead worker

The driver (`runner.AsyncRL`) only sees `Service` handles and futures, so the same code path runs on
both backends. On the embedded backend a service is its object plus a thread pool in this process;
`restart` rebuilds the object from its factory (what a health check does when a worker's thread or
the engine's loop died). The Ray backend (`c2jax.train.async_rl.ray_backend`) puts each service in
an actor; results wait for the driver in Ray's object store.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable, Protocol


class Service(Protocol):
    name: str

    def submit(self, method: str, *args: Any, **kw: Any) -> cf.Future: ...

    def call(self, method: str, *args: Any, **kw: Any) -> Any: ...

    def alive(self) -> bool: ...

    def restart(self) -> None: ...

    def shutdown(self) -> None: ...


class LocalService:
    """A service object in this process; `submit` runs its methods on `workers` threads."""

    def __init__(self, name: str, factory: Callable[[], Any], workers: int = 1) -> None:
        self.name, self.factory, self.workers = name, factory, int(workers)
        self._lock = threading.Lock()
        self.obj = factory()
        self.pool = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"c2jax-{name}")
        self.restarts = 0

    def submit(self, method: str, *args: Any, **kw: Any) -> cf.Future:
        with self._lock:
            return self.pool.submit(getattr(self.obj, method), *args, **kw)

    def call(self, method: str, *args: Any, **kw: Any) -> Any:
        """Run `method` in the caller's thread (cheap queries: versions, health)."""
        return getattr(self.obj, method)(*args, **kw)

    def alive(self) -> bool:
        probe = getattr(self.obj, "healthy", None)
        return bool(probe()) if callable(probe) else True

    def restart(self) -> None:
        with self._lock:
            old = self.obj
            close = getattr(old, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - a dead service may fail to close; it is replaced anyway
                    pass
            self.obj = self.factory()
            self.restarts += 1

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()


class LocalBackend:
    """The embedded backend (default): every service in this process, behind thread pools."""

    name = "local"

    def spawn(self, name: str, factory: Callable[[], Any], workers: int = 1) -> LocalService:
        return LocalService(name, factory, workers)

    def put(self, obj: Any) -> Any:
        return obj

    def shutdown(self) -> None:
        pass


BACKENDS = ("local", "ray")


def make_backend(name: str, address: str | None = None, **kw: Any) -> Any:
    """The named backend; 'ray' connects to `address` (clear error when Ray or the cluster is missing)."""
    if name == "local":
        return LocalBackend()
    if name == "ray":
        from c2jax.train.async_rl.ray_backend import RayBackend

        return RayBackend(address=address, **kw)
    raise ValueError(f"services backend must be one of {list(BACKENDS)}, got {name!r}")
