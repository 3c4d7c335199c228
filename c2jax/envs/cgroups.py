"""Per-sandbox cgroups: memory, process count and CPU limits, usage, OOM/pids events, kill-all.

Two implementations with one interface (`SandboxCgroup`):
- `CgroupV1`: one directory per controller hierarchy (`memory`, `pids`, `cpu`/`cpuacct`, `freezer`),
  which is what the development and CI machines have (hybrid v1; the v2 mount has no controllers).
- `CgroupV2`: one directory in the unified hierarchy (`memory.max`, `pids.max`, `cpu.max`,
  `cgroup.kill`). Unit-tested against a fake cgroup filesystem.

Sandbox cgroups nest under the caller's own cgroup (read from /proc/self/cgroup) in a directory
named `PREFIX`, so a sandbox can never get more than its caller's limits, and the orphan reaper only
ever touches directories under that prefix. Limits that no mounted controller can enforce are listed
in `report()` as "unavailable: <why>", never silently skipped.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import signal
import time
from typing import Iterable

PREFIX = "c2jax-sandboxes"

# Limit name (as in Limits) -> controller that enforces it.
CONTROLLER_OF = {"memory_bytes": "memory", "pids": "pids", "cpus": "cpu"}


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _keyed(path: str) -> dict[str, int]:
    """Parse a flat keyed file ('key value' lines) such as memory.events or pids.events."""
    out = {}
    try:
        for line in _read(path).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


@dataclasses.dataclass
class Mounts:
    """Where each cgroup hierarchy is mounted and where the caller sits in it."""

    v1: dict[str, str]  # controller -> mount point
    v2: str | None  # unified mount point
    v2_controllers: set[str]
    self_paths: dict[str, str]  # controller (v1) or "" (v2) -> caller's cgroup path

    @classmethod
    def detect(cls, mountinfo: str = "/proc/self/mountinfo", self_cgroup: str = "/proc/self/cgroup",
               root: str = "") -> "Mounts":
        """Read the mount table and the caller's cgroup membership (paths under `root` for tests)."""
        v1: dict[str, str] = {}
        v2 = None
        try:
            lines = _read(root + mountinfo).splitlines()
        except OSError:
            lines = []
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            mnt, fstype, opts = fields[4], rfields[0], rfields[2].split(",")
            if fstype == "cgroup":
                for opt in opts:
                    if opt in ("memory", "pids", "cpu", "cpuacct", "freezer"):
                        v1.setdefault(opt, root + mnt)
            elif fstype == "cgroup2" and v2 is None:
                v2 = root + mnt
        v2_controllers: set[str] = set()
        if v2:
            try:
                v2_controllers = set(_read(os.path.join(v2, "cgroup.controllers")).split())
            except OSError:
                pass
        self_paths: dict[str, str] = {}
        try:
            for line in _read(root + self_cgroup).splitlines():
                hid, ctrls, path = line.split(":", 2)
                for c in (ctrls.split(",") if ctrls else [""]):
                    self_paths[c] = path
        except OSError:
            pass
        return cls(v1=v1, v2=v2, v2_controllers=v2_controllers, self_paths=self_paths)


class SandboxCgroup:
    """Interface: create, enforce limits, add a process, list/kill processes, read usage, remove."""

    report: dict[str, str]
    paths: list[str]

    def procs_files(self) -> list[str]:
        """cgroup.procs files a new process must be written into (one per hierarchy)."""
        raise NotImplementedError

    def pids(self) -> set[int]:
        raise NotImplementedError

    def kill_all(self, timeout: float = 5.0) -> bool:
        raise NotImplementedError

    def oom_kills(self) -> int:
        raise NotImplementedError

    def pids_limit_hits(self) -> int:
        raise NotImplementedError

    def cpu_seconds(self) -> float | None:
        raise NotImplementedError

    def memory_peak(self) -> int | None:
        raise NotImplementedError

    def freeze(self, frozen: bool) -> bool:
        raise NotImplementedError

    def remove(self) -> None:
        for path in sorted(self.paths, key=len, reverse=True):
            remove_dir(path)


def remove_dir(path: str, timeout: float = 2.0) -> None:
    """rmdir a cgroup, retrying while the kernel finishes tearing down its (killed) tasks."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class CgroupV1(SandboxCgroup):
    """One directory per v1 hierarchy: memory, pids, cpu(+cpuacct), freezer."""

    def __init__(self, mounts: Mounts, name: str, limits) -> None:
        self.dirs: dict[str, str] = {}
        self.report = {}
        self.paths = []
        seen_mounts: dict[str, str] = {}
        for ctrl in ("memory", "pids", "cpu", "cpuacct", "freezer"):
            mnt = mounts.v1.get(ctrl)
            if mnt is None:
                continue
            if mnt in seen_mounts:  # cpu,cpuacct co-mounted: same directory
                self.dirs[ctrl] = self.dirs[seen_mounts[mnt]]
                continue
            base = os.path.join(mnt, mounts.self_paths.get(ctrl, "/").lstrip("/"), PREFIX)
            path = os.path.join(base, name)
            os.makedirs(base, exist_ok=True)
            os.mkdir(path)
            self.paths.append(path)
            self.dirs[ctrl] = path
            seen_mounts[mnt] = ctrl
        self._limit("memory_bytes", "memory", limits.memory_bytes, self._set_memory)
        self._limit("pids", "pids", limits.pids, lambda d, v: _write(f"{d}/pids.max", str(v)))
        self._limit("cpus", "cpu", limits.cpus, self._set_cpu)

    def _limit(self, name: str, ctrl: str, value, setter) -> None:
        if ctrl not in self.dirs:
            self.report[name] = f"unavailable: no cgroup v1 '{ctrl}' controller mounted"
            return
        try:
            setter(self.dirs[ctrl], value)
            self.report[name] = "enforced (cgroup v1)"
        except OSError as e:
            self.report[name] = f"unavailable: {e}"

    @staticmethod
    def _set_memory(d: str, value: int) -> None:
        _write(f"{d}/memory.limit_in_bytes", str(value))
        if os.path.exists(f"{d}/memory.memsw.limit_in_bytes"):  # include swap so it cannot dodge
            _write(f"{d}/memory.memsw.limit_in_bytes", str(value))
        if os.path.exists(f"{d}/memory.swappiness"):
            try:
                _write(f"{d}/memory.swappiness", "0")
            except OSError:
                pass

    @staticmethod
    def _set_cpu(d: str, cpus: float) -> None:
        period = 100_000
        _write(f"{d}/cpu.cfs_period_us", str(period))
        _write(f"{d}/cpu.cfs_quota_us", str(max(1000, int(cpus * period))))

    def procs_files(self) -> list[str]:
        return [os.path.join(p, "cgroup.procs") for p in self.paths]

    def pids(self) -> set[int]:
        out: set[int] = set()
        for p in self.paths:
            try:
                out.update(int(x) for x in _read(os.path.join(p, "cgroup.procs")).split())
            except OSError:
                pass
        return out

    def freeze(self, frozen: bool) -> bool:
        d = self.dirs.get("freezer")
        if d is None:
            return False
        _write(f"{d}/freezer.state", "FROZEN" if frozen else "THAWED")
        if frozen:  # wait until the kernel reports every task stopped
            deadline = time.monotonic() + 2.0
            while _read(f"{d}/freezer.state").strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.001)
        return True

    def kill_all(self, timeout: float = 5.0) -> bool:
        if not self.pids():  # the common case: the pid namespace already took everything down
            return True
        deadline = time.monotonic() + timeout
        frozen = False
        try:  # freeze first so a fork bomb cannot outrun the kill loop
            frozen = self.freeze(True)
        except OSError:
            pass
        while True:
            pids = self.pids()
            _kill_pids(pids)
            if frozen:
                try:
                    self.freeze(False)  # SIGKILL is delivered once thawed
                    frozen = False
                except OSError:
                    pass
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def oom_kills(self) -> int:
        d = self.dirs.get("memory")
        return _keyed(f"{d}/memory.oom_control").get("oom_kill", 0) if d else 0

    def pids_limit_hits(self) -> int:
        d = self.dirs.get("pids")
        return _keyed(f"{d}/pids.events").get("max", 0) if d else 0

    def cpu_seconds(self) -> float | None:
        d = self.dirs.get("cpuacct")
        try:
            return int(_read(f"{d}/cpuacct.usage")) / 1e9 if d else None
        except OSError:
            return None

    def memory_peak(self) -> int | None:
        d = self.dirs.get("memory")
        try:
            return int(_read(f"{d}/memory.max_usage_in_bytes")) if d else None
        except OSError:
            return None


class CgroupV2(SandboxCgroup):
    """One directory in the unified hierarchy; controllers enabled via cgroup.subtree_control."""

    def __init__(self, mounts: Mounts, name: str, limits) -> None:
        assert mounts.v2 is not None
        self.report = {}
        caller = os.path.join(mounts.v2, mounts.self_paths.get("", "/").lstrip("/"))
        base = os.path.join(caller, PREFIX)
        os.makedirs(base, exist_ok=True)
        self.path = os.path.join(base, name)
        enabled = {c for c in ("memory", "pids", "cpu") if c in mounts.v2_controllers}
        for parent in (caller, base):  # controllers must be delegated level by level
            for c in sorted(enabled):
                try:
                    _write(os.path.join(parent, "cgroup.subtree_control"), f"+{c}")
                except OSError:
                    enabled.discard(c)
        os.mkdir(self.path)
        self.paths = [self.path]
        avail = enabled & mounts.v2_controllers
        self._limit("memory_bytes", "memory", avail, lambda: self._set_memory(limits.memory_bytes))
        self._limit("pids", "pids", avail, lambda: _write(f"{self.path}/pids.max", str(limits.pids)))
        self._limit("cpus", "cpu", avail,
                    lambda: _write(f"{self.path}/cpu.max", f"{max(1000, int(limits.cpus * 100000))} 100000"))

    def _limit(self, name: str, ctrl: str, avail: set[str], setter) -> None:
        if ctrl not in avail:
            self.report[name] = f"unavailable: cgroup v2 controller '{ctrl}' not delegated"
            return
        try:
            setter()
            self.report[name] = "enforced (cgroup v2)"
        except OSError as e:
            self.report[name] = f"unavailable: {e}"

    def _set_memory(self, value: int) -> None:
        _write(f"{self.path}/memory.max", str(value))
        if os.path.exists(f"{self.path}/memory.swap.max"):
            _write(f"{self.path}/memory.swap.max", "0")

    def procs_files(self) -> list[str]:
        return [os.path.join(self.path, "cgroup.procs")]

    def pids(self) -> set[int]:
        try:
            return {int(x) for x in _read(os.path.join(self.path, "cgroup.procs")).split()}
        except OSError:
            return set()

    def freeze(self, frozen: bool) -> bool:
        f = os.path.join(self.path, "cgroup.freeze")
        if not os.path.exists(f):
            return False
        _write(f, "1" if frozen else "0")
        return True

    def kill_all(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        kill_file = os.path.join(self.path, "cgroup.kill")
        while True:
            pids = self.pids()
            if not pids:
                return True
            if os.path.exists(kill_file):
                try:
                    _write(kill_file, "1")
                except OSError:
                    _kill_pids(pids)
            else:
                _kill_pids(pids)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def oom_kills(self) -> int:
        return _keyed(f"{self.path}/memory.events").get("oom_kill", 0)

    def pids_limit_hits(self) -> int:
        return _keyed(f"{self.path}/pids.events").get("max", 0)

    def cpu_seconds(self) -> float | None:
        usec = _keyed(f"{self.path}/cpu.stat").get("usage_usec")
        return usec / 1e6 if usec is not None else None

    def memory_peak(self) -> int | None:
        try:
            return int(_read(f"{self.path}/memory.peak"))
        except (OSError, ValueError):
            return None


class NoCgroup(SandboxCgroup):
    """No usable controller (not root, or none mounted): every cgroup limit is reported unavailable."""

    def __init__(self, reason: str) -> None:
        self.report = {name: f"unavailable: {reason}" for name in CONTROLLER_OF}
        self.paths = []

    def procs_files(self) -> list[str]:
        return []

    def pids(self) -> set[int]:
        return set()

    def kill_all(self, timeout: float = 5.0) -> bool:
        return True

    def oom_kills(self) -> int:
        return 0

    def pids_limit_hits(self) -> int:
        return 0

    def cpu_seconds(self) -> float | None:
        return None

    def memory_peak(self) -> int | None:
        return None

    def freeze(self, frozen: bool) -> bool:
        return False


def create(name: str, limits, mounts: Mounts | None = None) -> SandboxCgroup:
    """Create the cgroup(s) of sandbox `name` with `limits`; v1 if its controllers are mounted."""
    mounts = mounts or Mounts.detect()
    try:
        if mounts.v1.get("memory") or mounts.v1.get("pids"):
            return CgroupV1(mounts, name, limits)
        if mounts.v2 and mounts.v2_controllers & {"memory", "pids", "cpu"}:
            return CgroupV2(mounts, name, limits)
    except PermissionError as e:
        return NoCgroup(f"cannot create cgroups ({e}); run as root or delegate a cgroup")
    return NoCgroup("no cgroup controller (memory/pids/cpu) is mounted")
