"""Sandbox backends: the `Sandbox` / `SandboxPool` protocols and the registry `config.envs.backend`
selects from.

    pool = make_pool(config.envs, max_concurrency=8)   # backend 'local' (bubblewrap) by default
    with pool.session(task.env_id) as sb:              # any SandboxLike
        sb.exec("pytest -q")

Registered: ``local`` (`c2jax.envs.pool.SandboxPool` over bubblewrap sandboxes on this machine).
Another backend (e.g. one over the Ray actors of `c2jax.envs.ray_backend`, once it offers
`acquire`/`session`) is one `SANDBOX_BACKENDS.register(name, factory)` call; the ``envs`` section
validator accepts exactly the registered names.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping, Protocol, Sequence

from c2jax.config import Checker, cfg_get, register_validator, to_plain
from c2jax.envs.limits import Limits, check_limits
from c2jax.envs.pool import SandboxPool
from c2jax.registry import Registry


class SandboxLike(Protocol):
    """What the agent tools, the grader's callers and the rollouts use of a sandbox."""

    env_id: str
    limits: Limits

    def exec(self, cmd: str | Sequence[str], timeout: float | None = None, stdin: bytes | str | None = None,
             **kwargs: Any) -> Any: ...
    def read_file(self, path: str, max_bytes: int | None = None, binary: bool = False) -> str | bytes: ...
    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None: ...
    def list_dir(self, path: str = "") -> list[dict]: ...
    def glob(self, pattern: str, limit: int = 10000) -> list[str]: ...
    def diff(self) -> str: ...
    def snapshot(self) -> str: ...
    def shell(self) -> Any: ...
    def close(self) -> None: ...


class SandboxPoolLike(Protocol):
    """A bounded source of sandboxes: what `agent.rollout` and the RL loop take as `pool`."""

    def acquire(self, env_id: str, timeout: float | None = None, **overrides: Any) -> SandboxLike: ...
    def session(self, env_id: str, timeout: float | None = None,
                **overrides: Any) -> contextlib.AbstractContextManager[SandboxLike]: ...
    def metrics(self) -> dict: ...
    def close(self) -> None: ...


# Backend name -> factory(max_concurrency=, max_queue=, warm=, warm_env=, limits=) -> SandboxPoolLike.
SANDBOX_BACKENDS: Registry[Callable[..., SandboxPoolLike]] = Registry("sandbox_backend")
SANDBOX_BACKENDS.register("local", SandboxPool)
DEFAULT_BACKEND = "local"


def make_pool(envs: Mapping[str, Any] | Any = None, **overrides: Any) -> SandboxPoolLike:
    """The sandbox pool ``config.envs`` asks for: `backend` (default 'local') picks the factory;
    `pool_size` -> max_concurrency, `warm`, `limits` are passed on; keyword `overrides` win.
    An unknown backend raises `UnknownNameError` (listing the registered ones) before any start."""
    section = to_plain(envs) or {}
    factory = SANDBOX_BACKENDS.get(cfg_get(section, "backend", DEFAULT_BACKEND))
    kwargs: dict[str, Any] = {}
    if cfg_get(section, "pool_size") is not None:
        kwargs["max_concurrency"] = int(section["pool_size"])
    if cfg_get(section, "warm") is not None:
        kwargs["warm"] = int(section["warm"])
    if cfg_get(section, "limits") is not None:
        kwargs["limits"] = Limits.from_config(section["limits"])
    kwargs.update(overrides)
    return factory(**kwargs)


@register_validator("envs")
def validate_envs(check: Checker, cfg: Any, full_cfg: Any = None) -> None:
    """Config section `envs`: `limits` (see `Limits`), `pool_size`, `warm`, `backend` (registered name)."""
    limits = check.value(cfg, "limits", default=None)
    if limits is not None:
        items = dict(limits.items()) if hasattr(limits, "items") else {}
        for name, problem in check_limits(items):
            check.error(f"limits.{name}", problem)
    check.int_range(cfg, "pool_size", lo=1, hi=4096, optional=True)
    check.int_range(cfg, "warm", lo=0, hi=4096, optional=True)
    check.choice(cfg, "backend", SANDBOX_BACKENDS.names(), optional=True)
