"""Resource limits of one sandbox: every limit has a safe, finite default and comes from config.

`Limits` is a frozen dataclass so a sandbox's limits cannot drift after start. `Limits.from_config`
reads the `envs.limits` section of an ml_collections config (or any mapping); `check_limits` is
what the `envs` config validator (`c2jax.envs.backends`) runs on it before anything is started.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


MiB = 1 << 20
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Limits:
    """Hard limits of one sandbox (all finite; zero or negative values are rejected).

    Attributes:
      timeout_s: default wall-clock limit of one `exec` (a call may pass its own `timeout`).
      lifetime_s: wall-clock lifetime of the whole sandbox; past it every process is killed.
      cpu_s: CPU seconds per command (RLIMIT_CPU; SIGXCPU ends the command).
      memory_bytes: memory (+swap) of the whole sandbox, cgroup `memory` (v1) / `memory.max` (v2).
      pids: number of processes/threads of the whole sandbox, cgroup `pids`.
      cpus: CPU bandwidth of the whole sandbox in cores (cfs quota), cgroup `cpu`.
      file_size_bytes: largest file a command may write (RLIMIT_FSIZE; SIGXFSZ).
      disk_bytes: size of the writable layer (a size-capped tmpfs holding the overlay's upper dir).
      tmp_bytes: size of the sandbox's private `/tmp` tmpfs.
      output_bytes: stdout and stderr kept per stream and command; the rest is dropped (truncated).
      output_kill_bytes: total output after which a command is killed (`killed_reason="output"`).
      nofile: open file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 300.0
    lifetime_s: float = 4 * 3600.0
    cpu_s: int = 600
    memory_bytes: int = 2 * GiB
    pids: int = 256
    cpus: float = 1.0
    file_size_bytes: int = 1 * GiB
    disk_bytes: int = 1 * GiB
    tmp_bytes: int = 256 * MiB
    output_bytes: int = 1 * MiB
    output_kill_bytes: int = 64 * MiB
    nofile: int = 1024

    def __post_init__(self) -> None:
        problems = check_limits(dataclasses.asdict(self))
        if problems:
            raise ValueError("invalid sandbox limits: " + "; ".join(f"{k}: {m}" for k, m in problems))

    def replace(self, **changes: Any) -> "Limits":
        """A copy with some limits changed (unknown names raise TypeError)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | Any | None) -> "Limits":
        """Limits from a mapping / ConfigDict holding any subset of the field names."""
        if cfg is None:
            return cls()
        items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        unknown = set(items) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown sandbox limits: {sorted(unknown)}")
        return cls(**items)


_BOUNDS: dict[str, tuple[float, float]] = {
    "timeout_s": (0.01, 7 * 86400),
    "lifetime_s": (0.1, 30 * 86400),
    "cpu_s": (1, 30 * 86400),
    "memory_bytes": (16 * MiB, 1 << 44),
    "pids": (8, 1 << 22),
    "cpus": (0.01, 4096),
    "file_size_bytes": (4096, 1 << 44),
    "disk_bytes": (1 * MiB, 1 << 44),
    "tmp_bytes": (64 * 1024, 1 << 44),
    "output_bytes": (1024, 1 << 34),
    "output_kill_bytes": (1024, 1 << 40),
    "nofile": (16, 1 << 20),
}


def check_limits(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, problem) for every limit that is missing its type or outside its finite range."""
    problems = []
    for name, value in values.items():
        if name not in _BOUNDS:
            problems.append((name, "unknown limit"))
            continue
        lo, hi = _BOUNDS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append((name, f"must be a number, got {value!r}"))
        elif not lo <= value <= hi:
            problems.append((name, f"must be in [{lo:g}, {hi:g}], got {value!r}"))
    if not problems and values.get("output_kill_bytes", 1 << 30) < values.get("output_bytes", 0):
        problems.append(("output_kill_bytes", "must be >= output_bytes"))
    return problems
