"""The Ray backend of the asynchronous RL services: each service is an actor, results wait for the
driver in Ray's object store, a killed actor process is restarted by Ray.

    backend = RayBackend(address=None)           # None: a local cluster bound to 127.0.0.1
    svc = backend.spawn("rollout", factory, workers=4)   # one actor, 4 concurrent calls
    fut = svc.submit("run_group", task, batch)   # concurrent.futures.Future (ObjectRef.future())

Same `Service` interface as the embedded backend (`services.LocalService`), so `runner.AsyncRL`
drives both with the same code. Actors are created with ``max_restarts=-1``: when an actor process
dies (SIGKILL, OOM) Ray starts a new one from the same factory, calls in flight fail with
``RayActorError`` and the driver rolls their groups out again (`Reconciler.lost`) after the
publisher re-sends the latest weights (``republish``: a restarted actor starts from its factory's
weights; tokens it samples before the update lands carry the old version and are masked 'stale' if
beyond the bound, so they are counted, never trained silently). Per-sample
``rolling_out`` / ``grading`` transitions are not streamed back from actors (the ledger records
them at group level); everything else is identical.

`ray_rollout_service` builds the rollout + inference actor of the ``rl`` stage: the engine, harness,
policy and a sandbox pool live in the actor; `RayEnginePublisher` sends new weights through the
object store (``ray.put`` once per version) and reports the version the actor's engine serves.

Errors before any compute: Ray not installed (install the ``ray`` extra), or an ``address`` that
does not accept a TCP connection within 5 s (named, with the address).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import threading
from typing import Any, Callable


def _ray():
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("rl.services.backend='ray' needs Ray: pip install 'c2jax[ray]' (ray>=2.40)") from e
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise a clear error unless `address` ('host:port', optionally 'ray://host:port') accepts TCP."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"rl.services.ray_address must be 'host:port', got {address!r}")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise RuntimeError(f"Ray cluster at {address} is unreachable ({type(e).__name__}: {e}); start it with "
                           f"`ray start --head --node-ip-address 127.0.0.1` or set rl.services.ray_address=None "
                           f"for a local one") from None


class _ServiceActor:
    """The actor body: builds the service object from its factory, runs its methods on request."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.obj = factory()

    def call(self, method: str, args: tuple, kw: dict) -> Any:
        return getattr(self.obj, method)(*args, **kw)

    def ping(self) -> int:
        probe = getattr(self.obj, "healthy", None)
        if callable(probe) and not probe():
            raise RuntimeError("service unhealthy")
        return os.getpid()


class RayService:
    def __init__(self, backend: "RayBackend", name: str, factory: Callable[[], Any], workers: int) -> None:
        self.backend, self.name, self.factory, self.workers = backend, name, factory, int(workers)
        self._lock = threading.Lock()
        self.restarts = 0
        self.actor = self._new()

    def _new(self) -> Any:
        ray = self.backend.ray
        cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=self.workers)(_ServiceActor)
        return cls.remote(self.factory)

    def submit(self, method: str, *args: Any, **kw: Any) -> cf.Future:
        kw.pop("on_state", None)
        if len(args) >= 3 and callable(args[-1]):
            args = args[:-1]  # per-sample callbacks stay in the driver's process (see module docstring)
        with self._lock:
            return self.actor.call.remote(method, args, kw).future()

    def call(self, method: str, *args: Any, **kw: Any) -> Any:
        return self.backend.ray.get(self.actor.call.remote(method, args, kw))

    def pid(self, timeout: float = 60.0) -> int:
        return int(self.backend.ray.get(self.actor.ping.remote(), timeout=timeout))

    def alive(self) -> bool:
        try:
            self.pid(timeout=30.0)
            return True
        except Exception:  # noqa: BLE001 - any failure to answer is unhealthy
            return False

    def restart(self) -> None:
        with self._lock:
            try:
                self.backend.ray.kill(self.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - it may be dead already
                pass
            self.actor = self._new()
            self.restarts += 1

    def shutdown(self) -> None:
        try:
            self.backend.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        if address:
            check_reachable(address)  # before importing Ray: a wrong address fails fast and clearly
        ray = _ray()
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            env = {"env_vars": {"PYTHONPATH": root, "RAY_USAGE_STATS_ENABLED": "0", "JAX_PLATFORMS": "cpu"}}
            if address:
                ray.init(address=address, log_to_driver=False, runtime_env=env)
            else:
                ray.init(num_cpus=num_cpus or 2, include_dashboard=False, _node_ip_address="127.0.0.1",
                         log_to_driver=False, runtime_env=env)
            self.started = True

    def spawn(self, name: str, factory: Callable[[], Any], workers: int = 1) -> RayService:
        return RayService(self, name, factory, workers)

    def put(self, obj: Any) -> Any:
        return self.ray.put(obj)

    def shutdown(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False


class RolloutInference:
    """Inside the rollout actor: an engine (inference service) and the rollout worker over it."""

    def __init__(self, params: Any, model_cfg: Any, rl: dict, tokenizer: Any, harness: Any, fmt: Any,
                 temperature: float, top_p: float, seed: int, version: int, grade_fn: Any = None) -> None:
        from c2jax.agent.policies import EnginePolicy
        from c2jax.envs import SandboxPool
        from c2jax.sampling import Engine, EngineConfig
        from c2jax.train.async_rl.workers import RolloutWorker

        ecfg = EngineConfig(max_slots=int(rl["max_in_flight"]), max_len=int(rl["max_len"]),
                            recompute_cache_on_update=True)
        self.engine = Engine(params, model_cfg, ecfg, tokenizer=tokenizer, version=version).start()
        policy = EnginePolicy(self.engine, fmt, temperature=temperature, top_p=top_p, seed=seed)
        self.pool = SandboxPool(max_concurrency=int(rl["max_in_flight"]))
        self.worker = RolloutWorker(harness, policy, self.pool, rl, grade_fn=grade_fn, seed=seed)

    def run_group(self, task: Any, batch: int) -> list:
        return self.worker.run_group(task, batch)

    def update_weights(self, params: Any, version: int) -> int:
        """Returns once the engine serves `version` (the publisher's acknowledgement)."""
        import time

        self.engine.update_weights(params, int(version))
        while self.engine.version < int(version):
            time.sleep(0.001)
        return int(version)

    def version(self) -> int:
        return int(self.engine.version)

    def healthy(self) -> bool:
        return self.worker.healthy()

    def close(self) -> None:
        self.engine.shutdown()
        self.pool.close()


class RayEnginePublisher:
    """`WeightPublisher` for the rollout actor's engine: weights via the object store, non-blocking."""

    def __init__(self, service: RayService, version: int) -> None:
        self.service, self.published, self._live = service, int(version), int(version)
        self.publish_s = 0.0
        self._acks: list[tuple[int, cf.Future]] = []

    def publish(self, params: Any, version: int) -> None:
        import time

        import jax
        import numpy as np

        t0 = time.monotonic()
        ref = self.service.backend.put(jax.tree_util.tree_map(np.asarray, params))
        self._last = (ref, int(version))
        self._acks.append((int(version), self.service.submit("update_weights", ref, int(version))))
        self.published = int(version)
        self.publish_s += time.monotonic() - t0

    def republish(self) -> None:
        """Send the last published weights again (a restarted actor starts from its factory's)."""
        if getattr(self, "_last", None) is not None:
            ref, version = self._last
            self._acks.append((version, self.service.submit("update_weights", ref, version)))

    def live_version(self) -> int:
        """The newest version the actor acknowledged (its engine serves it); a failed ack re-raises."""
        for v, f in [a for a in self._acks if a[1].done()]:
            f.result()
            self._live = max(self._live, v)
        self._acks = [a for a in self._acks if not a[1].done()]
        return self._live

    def wait_live(self, version: int, timeout: float | None = None) -> bool:
        import time

        t_end = None if timeout is None else time.monotonic() + timeout
        while self.live_version() < int(version):
            if t_end is not None and time.monotonic() > t_end:
                return False
            time.sleep(0.01)
        return True


def ray_rollout_service(backend: RayBackend, ctx: Any, params: Any, version: int, workers: int) -> RayService:
    """The rl stage's rollout + inference actor built from the stage's context; its ``publisher``
    attribute is the matching `RayEnginePublisher`."""
    import jax
    import numpy as np

    eng, pol = ctx.engine, ctx.policy
    host = jax.tree_util.tree_map(np.asarray, params)
    fmt = ctx.harness.fmt
    args = (host, eng.model_cfg, dict(ctx.rl), fmt.tok, ctx.harness, fmt, float(pol.temperature), float(pol.top_p),
            int(ctx.seed), int(version), ctx.grade_fn)
    svc = backend.spawn("rollout", lambda: RolloutInference(*args), workers=workers)
    svc.publisher = RayEnginePublisher(svc, version)
    return svc
