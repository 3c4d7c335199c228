"""Ray backend: the same sandbox interface over many machines.

Each Ray actor (`SandboxActor`, one per node or per share of a node) owns a local `SandboxPool`
(its concurrency cap, queue, warm pool, reaper and metrics); `RayPool.start()` picks the least
loaded actor and returns a `RaySandbox`, a handle with the `Sandbox` methods that forwards every
call to the actor owning the sandbox. Environments are built on every actor (`RayPool.build_env`;
content-hashed, so actors sharing a host or a state directory reuse one build).

Failures: a `SandboxError` raised in an actor arrives as a `SandboxError` (Ray re-raises it as an
instance of its cause); a dead actor becomes `SandboxError` too, so callers mask both the same way.
A snapshot's layer lives on the actor's machine: fork it there (`RaySandbox.fork`) or share the
state directory between machines.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import uuid
from typing import Any, Sequence

from c2jax.envs.errors import SandboxError
from c2jax.envs.limits import Limits


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SandboxError("the Ray backend needs ray: pip install 'c2jax[ray]'") from e
    return ray


class SandboxActor:
    """Actor body: a local SandboxPool plus tables of leased sandboxes, processes and shells."""

    def __init__(self, max_concurrency: int | None, max_queue: int, warm: int, warm_env: str | None,
                 limits: dict | None, state_dir: str | None) -> None:
        if state_dir:
            os.environ["C2JAX_ENVS_DIR"] = state_dir
        from c2jax.envs.pool import SandboxPool

        self.pool = SandboxPool(max_concurrency=max_concurrency, max_queue=max_queue, warm=warm,
                                warm_env=warm_env, limits=limits)
        self.leases: dict[str, Any] = {}
        self.procs: dict[str, Any] = {}
        self.shells: dict[str, Any] = {}
        self.lock = threading.Lock()

    def ping(self) -> dict:
        import socket

        return {"host": socket.gethostname(), "pid": os.getpid(), "active": len(self.leases)}

    def build_env(self, repo_dir: str, requirements: Any, kwargs: dict) -> str:
        from c2jax.envs.env_build import build_env

        return build_env(repo_dir, requirements, **kwargs)

    def derive_env(self, env_id: str, patch: str | bytes) -> str:
        from c2jax.envs.derive import derive_env

        return derive_env(env_id, patch)

    def start(self, env_id: str, overrides: dict, timeout: float | None) -> str:
        lease = self.pool.acquire(env_id, timeout, **overrides)
        sid = uuid.uuid4().hex
        with self.lock:
            self.leases[sid] = lease
        return sid

    def _lease(self, sid: str):
        try:
            return self.leases[sid]
        except KeyError:
            raise SandboxError(f"no sandbox {sid} on this actor (closed?)") from None

    def call(self, sid: str, method: str, args: tuple, kwargs: dict) -> Any:
        if method not in RaySandbox.FORWARDED:
            raise SandboxError(f"method {method!r} is not forwarded")
        return getattr(self._lease(sid), method)(*args, **kwargs)

    def attr(self, sid: str, name: str) -> Any:
        if name not in ("limits_report", "limits", "env_id", "id", "alive"):
            raise SandboxError(f"attribute {name!r} is not forwarded")
        return getattr(self._lease(sid), name)

    def exec_background(self, sid: str, args: tuple, kwargs: dict) -> str:
        proc = self._lease(sid).exec(*args, background=True, **kwargs)
        pid = uuid.uuid4().hex
        with self.lock:
            self.procs[pid] = proc
        return pid

    def proc_call(self, pid: str, method: str, args: tuple) -> Any:
        if method not in ("read", "write_stdin", "close_stdin", "poll", "wait", "kill"):
            raise SandboxError(f"method {method!r} is not forwarded")
        return getattr(self.procs[pid], method)(*args)

    def shell_run(self, sid: str, shell_id: str, cmd: str, timeout: float | None) -> Any:
        with self.lock:
            shell = self.shells.get(shell_id)
            if shell is None:
                shell = self.shells[shell_id] = self._lease(sid).shell()
        return shell.run(cmd, timeout)

    def fork(self, sid: str, overrides: dict, timeout: float | None) -> str:
        env_id = self._lease(sid).snapshot()
        return self.start(env_id, overrides, timeout)

    def close(self, sid: str) -> None:
        with self.lock:
            lease = self.leases.pop(sid, None)
        if lease is not None:
            lease.close()

    def metrics(self) -> dict:
        return {**self.pool.metrics(), "leases": len(self.leases)}

    def shutdown(self) -> None:
        from c2jax.envs.sandbox import flush_cleanup

        for sid in list(self.leases):
            self.close(sid)
        self.pool.close()
        flush_cleanup()  # the actor may be killed right after: finish removing files and cgroups


class RaySandbox:
    """A sandbox on a Ray actor; same methods as `Sandbox` (calls block until the actor answers)."""

    FORWARDED = ("exec", "read_file", "write_file", "list_dir", "glob", "diff", "snapshot", "host_pids")

    def __init__(self, pool: "RayPool", actor: Any, sid: str) -> None:
        self._pool, self._actor, self.sid, self._closed = pool, actor, sid, False

    def _get(self, ref: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise SandboxError(f"the actor owning sandbox {self.sid} died: {e}") from e

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._get(self._actor.call.remote(self.sid, method, args, kwargs))

    def exec(self, cmd: str | Sequence[str], timeout: float | None = None, stdin: bytes | str | None = None,
             env: dict | None = None, cwd: str | None = None, background: bool = False):
        kwargs = {"timeout": timeout, "stdin": stdin, "env": env, "cwd": cwd}
        if background:
            return RayProcess(self, self._get(self._actor.exec_background.remote(self.sid, (cmd,), kwargs)))
        return self._call("exec", cmd, **kwargs)

    def read_file(self, path: str, max_bytes: int | None = None, binary: bool = False):
        return self._call("read_file", path, max_bytes, binary)

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        return self._call("write_file", path, data, mode)

    def list_dir(self, path: str = "") -> list[dict]:
        return self._call("list_dir", path)

    def glob(self, pattern: str, limit: int = 10000) -> list[str]:
        return self._call("glob", pattern, limit)

    def diff(self) -> str:
        return self._call("diff")

    def snapshot(self) -> str:
        return self._call("snapshot")

    def host_pids(self) -> set[int]:
        return self._call("host_pids")

    def fork(self, timeout: float | None = None, **overrides: Any) -> "RaySandbox":
        """A sandbox on the same actor from this one's workspace (waits for a slot up to `timeout`)."""
        return RaySandbox(self._pool, self._actor,
                          self._get(self._actor.fork.remote(self.sid, overrides, timeout)))

    def shell(self) -> "RayShell":
        return RayShell(self)

    @property
    def limits_report(self) -> dict:
        return self._get(self._actor.attr.remote(self.sid, "limits_report"))

    @property
    def alive(self) -> bool:
        return not self._closed and self._get(self._actor.attr.remote(self.sid, "alive"))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._get(self._actor.close.remote(self.sid))

    def __enter__(self) -> "RaySandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RayProcess:
    """A background command in a RaySandbox (same methods as `Process`)."""

    def __init__(self, sb: RaySandbox, pid: str) -> None:
        self._sb, self._pid = sb, pid

    def _call(self, method: str, *args: Any) -> Any:
        return self._sb._get(self._sb._actor.proc_call.remote(self._pid, method, args))

    def read(self, timeout: float = 0.0):
        return self._call("read", timeout)

    def write_stdin(self, data: bytes | str) -> None:
        self._call("write_stdin", data)

    def close_stdin(self) -> None:
        self._call("close_stdin")

    def poll(self):
        return self._call("poll")

    def wait(self, timeout: float | None = None):
        return self._call("wait", timeout)

    def kill(self):
        return self._call("kill")


class RayShell:
    """A persistent shell in a RaySandbox (same `run` as `ShellSession`)."""

    def __init__(self, sb: RaySandbox) -> None:
        self._sb, self._id = sb, uuid.uuid4().hex

    def run(self, cmd: str, timeout: float | None = None):
        return self._sb._get(self._sb._actor.shell_run.remote(self._sb.sid, self._id, cmd, timeout))


class RayPool:
    """Sandboxes on a Ray cluster: `num_actors` actors, each with its own local pool.

    Args:
      num_actors: actors to create (e.g. one per node; add `actor_options` such as resources or a
        scheduling strategy to place them).
      per_actor_concurrency: each actor's sandbox cap (default: that machine's cores).
      warm, warm_env: a warm pool of started sandboxes on every actor for bursty demand.
      limits: default limits (a `Limits` or a mapping); state_dir: the state directory on workers.
    """

    def __init__(self, num_actors: int = 1, per_actor_concurrency: int | None = None, max_queue: int = 256,
                 warm: int = 0, warm_env: str | None = None, limits: Limits | dict | None = None,
                 state_dir: str | None = None, actor_options: dict | None = None) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise SandboxError("call ray.init(...) before creating a RayPool")
        limits_dict = dataclasses.asdict(limits) if isinstance(limits, Limits) else (dict(limits) if limits else None)
        threads = (per_actor_concurrency or os.cpu_count() or 1) * 4 + 16
        cls = ray.remote(SandboxActor).options(max_concurrency=threads, num_cpus=0, **(actor_options or {}))
        self.actors = [cls.remote(per_actor_concurrency, max_queue, warm, warm_env, limits_dict,
                                  state_dir or os.environ.get("C2JAX_ENVS_DIR"))
                       for _ in range(num_actors)]
        ray.get([a.ping.remote() for a in self.actors])
        self._rr = itertools.count()

    def build_env(self, repo_dir: str, requirements: Any = None, **kwargs: Any) -> str:
        """Build (or reuse) the environment on every actor; returns its env_id."""
        ids = set(_ray().get([a.build_env.remote(repo_dir, requirements, kwargs) for a in self.actors]))
        if len(ids) != 1:
            raise SandboxError(f"actors built different environments: {sorted(ids)}")
        return ids.pop()

    def derive_env(self, env_id: str, patch: str | bytes) -> str:
        ids = set(_ray().get([a.derive_env.remote(env_id, patch) for a in self.actors]))
        return ids.pop()

    def start(self, env_id: str, timeout: float | None = None, **overrides: Any) -> RaySandbox:
        """A sandbox on the least loaded actor (ties broken round-robin)."""
        ray = _ray()
        loads = ray.get([a.metrics.remote() for a in self.actors])
        offset = next(self._rr)
        order = sorted(range(len(self.actors)),
                       key=lambda i: (loads[i]["active"] + loads[i]["queued"], (i - offset) % len(self.actors)))
        actor = self.actors[order[0]]
        try:
            sid = ray.get(actor.start.remote(env_id, overrides, timeout))
        except ray.exceptions.RayActorError as e:
            raise SandboxError(f"sandbox actor died: {e}") from e
        return RaySandbox(self, actor, sid)

    def metrics(self) -> list[dict]:
        return _ray().get([a.metrics.remote() for a in self.actors])

    def close(self) -> None:
        ray = _ray()
        ray.get([a.shutdown.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)
        self.actors = []

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
