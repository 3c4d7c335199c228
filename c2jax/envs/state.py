"""On-disk state of the environments platform and the orphan reaper.

Layout under `state_dir()` ($C2JAX_ENVS_DIR, default ~/.cache/c2jax/envs):
  images/<env_id>/       built or derived environments (see images.py)
  sandboxes/<sb_id>/     one live sandbox: owner.json, rw/ (size-capped tmpfs: upper/, work/), ctl/
  etc/                   the minimal /etc shown inside every sandbox

Every sandbox directory records its owner (pid + kernel start time of the Python process that
started it), its cgroups, its tmpfs mount and its bwrap process. `reap_orphans()` removes a sandbox
only if that owner is dead (a recycled pid has a different start time), and only paths under this
state directory and cgroups under `cgroups.PREFIX`, so several pools or Ray actors on one host never
reap each other's sandboxes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import shutil
import signal
import threading

from c2jax.atomic import atomic_path, atomic_write_json
from c2jax.envs import cgroups

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2


def state_dir() -> str:
    """Root of c2jax's environment state (created on first use)."""
    root = os.environ.get("C2JAX_ENVS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "c2jax", "envs")
    os.makedirs(root, exist_ok=True)
    return os.path.abspath(root)


def sandboxes_dir() -> str:
    path = os.path.join(state_dir(), "sandboxes")
    os.makedirs(path, exist_ok=True)
    return path


def proc_start_time(pid: int) -> int | None:
    """Kernel start time (clock ticks since boot) of `pid`, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def owner_record() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": proc_start_time(pid)}


def owner_alive(owner: dict) -> bool:
    return owner.get("start") is not None and proc_start_time(int(owner["pid"])) == owner["start"]


def mount_tmpfs(target: str, size_bytes: int) -> None:
    """Mount a size-capped tmpfs on `target` (root only); raises OSError on failure."""
    opts = f"size={int(size_bytes)},mode=0755".encode()
    if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def umount(target: str) -> None:
    """Lazily unmount `target` if it is a mount point (no error if it is not)."""
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def write_record(sb_dir: str, record: dict) -> None:
    atomic_write_json(os.path.join(sb_dir, "owner.json"), record)


def cleanup_sandbox_dir(sb_dir: str, record: dict | None) -> None:
    """Kill what is left of one sandbox and remove its cgroups, mounts and files."""
    record = record or {}
    for path in record.get("cgroups", []):
        if cgroups.PREFIX not in path.split(os.sep):
            continue  # never touch a cgroup outside our prefix
        procs = os.path.join(path, "cgroup.procs")
        for _ in range(100):
            try:
                with open(procs) as f:
                    pids = [int(x) for x in f.read().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    bw = record.get("bwrap")
    if bw and proc_start_time(int(bw["pid"])) == bw.get("start"):
        try:
            os.kill(int(bw["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    for path in record.get("cgroups", []):
        if cgroups.PREFIX in path.split(os.sep):
            try:
                cgroups.remove_dir(path)
            except OSError as e:
                log.warning("could not remove cgroup %s: %s", path, e)
    rw = os.path.join(sb_dir, "rw")
    try:
        umount(rw)
    except OSError as e:
        log.warning("could not unmount %s: %s", rw, e)
    shutil.rmtree(sb_dir, ignore_errors=True)


_reap_lock = threading.Lock()


def reap_orphans() -> list[str]:
    """Remove sandboxes whose owning process is dead; returns the reaped sandbox ids."""
    reaped = []
    with _reap_lock:
        root = sandboxes_dir()
        for name in sorted(os.listdir(root)):
            sb_dir = os.path.join(root, name)
            try:
                with open(os.path.join(sb_dir, "owner.json")) as f:
                    record = json.load(f)
            except FileNotFoundError:
                # A directory without a record: created by a start that died before writing it.
                # Its owner pid is the first field of the id; reap only if that process is gone.
                try:
                    pid = int(name.split("-")[0])
                except ValueError:
                    continue
                if proc_start_time(pid) is not None:
                    continue
                record = None
            except (OSError, ValueError):
                continue
            if record is not None and owner_alive(record.get("owner", {})):
                continue
            cleanup_sandbox_dir(sb_dir, record)
            reaped.append(name)
    if reaped:
        log.info("reaped %d orphaned sandbox(es): %s", len(reaped), reaped)
    return reaped


def empty_file() -> str:
    """An empty read-only host file, bound over paths an environment hides (`images.hide_paths_env`)."""
    path = os.path.join(state_dir(), "empty")
    if not os.path.exists(path) or os.path.getsize(path):
        with atomic_path(path) as tmp:  # unique per call: threads race here
            open(tmp, "w").close()
            os.chmod(tmp, 0o444)
    return path


def minimal_etc() -> str:
    """Directory shown as /etc in every sandbox (one bind mount): no host secrets, no resolver.

    It holds synthetic passwd/group/hosts/nsswitch/resolv files plus copies of what programs need
    from the host's /etc: the dynamic linker cache, `alternatives` symlinks into /usr, localtime.
    Built once per distinct host input (content-keyed directory name), atomically.
    """
    files = {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                  "user:x:1000:1000:sandbox user:/tmp:/bin/sh\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        # The sandbox's own loopback: nothing listens there, so every lookup fails fast.
        "resolv.conf": "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        "hostname": "sandbox\n",
    }
    stamp = []
    for name in ("ld.so.cache", "alternatives", "localtime"):
        try:
            st = os.lstat(f"/etc/{name}")
            stamp.append(f"{name}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            pass
    key = hashlib.sha256(json.dumps([files, stamp]).encode()).hexdigest()[:16]
    path = os.path.join(state_dir(), f"etc-{key}")
    if os.path.isdir(path):
        return path
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, text in files.items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    if os.path.isfile("/etc/ld.so.cache"):
        shutil.copyfile("/etc/ld.so.cache", os.path.join(tmp, "ld.so.cache"))
    if os.path.islink("/etc/localtime"):
        os.symlink(os.readlink("/etc/localtime"), os.path.join(tmp, "localtime"))
    if os.path.isdir("/etc/alternatives"):
        os.mkdir(os.path.join(tmp, "alternatives"))
        for name in os.listdir("/etc/alternatives"):
            src = os.path.join("/etc/alternatives", name)
            if os.path.islink(src) and os.readlink(src).startswith("/usr/"):
                os.symlink(os.readlink(src), os.path.join(tmp, "alternatives", name))
    for d, _, names in os.walk(tmp):
        os.chmod(d, 0o755)
        for n in names:
            if not os.path.islink(os.path.join(d, n)):
                os.chmod(os.path.join(d, n), 0o644)
    try:
        os.rename(tmp, path)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return path
