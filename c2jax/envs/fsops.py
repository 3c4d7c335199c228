"""Host-side file operations confined to a directory: no symlink, `..` or mount escapes.

Every path is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`
relative to a directory fd of the sandbox's merged `/workspace` view, so the kernel itself refuses
any resolution that would leave it (absolute symlinks, `..` past the root, /proc magic links,
crossing into another mount). Final components are opened with O_NOFOLLOW, and anything that is not
a regular file, directory or symlink (FIFOs, sockets, devices) is refused before it is read or
written: opening a FIFO could block the host, a device could be anything.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fnmatch
import os
import stat
from typing import Iterator

from c2jax.envs.errors import UnsafePath

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
SYS_openat2 = 437  # x86_64 and aarch64 share this number
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0,
            resolve: int = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) -> int:
    """openat2(2): open `path` beneath `dirfd`; raises UnsafePath on an escape, OSError otherwise."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(SYS_openat2, dirfd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EXDEV:
            raise UnsafePath(f"{path!r} resolves outside /workspace (symlink, '..' or mount escape)")
        if err in (errno.ENXIO, errno.ENODEV):  # a socket, FIFO without writer, or device
            raise UnsafePath(f"{path!r} is not a regular file")
        if err == errno.ELOOP:
            raise UnsafePath(f"{path!r}: refusing to follow a symlink")
        raise OSError(err, os.strerror(err), path)
    return fd


def normalize(path: str) -> str:
    """A path relative to /workspace ('' for the root); absolute paths must be under /workspace."""
    if "\0" in path:
        raise UnsafePath("path contains a NUL byte")
    if path.startswith("/"):
        if path == "/workspace" or path.startswith("/workspace/"):
            path = path[len("/workspace"):]
        else:
            raise UnsafePath(f"{path!r} is outside /workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"{path!r}: '..' is not allowed")
    return "/".join(parts)


def _split(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    if not name:
        raise UnsafePath("the workspace root is not a file")
    return head or ".", name


def read_bytes(root_fd: int, path: str, max_bytes: int | None = None) -> bytes:
    rel = normalize(path)
    # Symlinks inside the workspace are followed; RESOLVE_BENEATH refuses any that leave it.
    fd = openat2(root_fd, rel or ".", os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path!r} is not a regular file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total >= max_bytes:
                break
        data = b"".join(chunks)
        return data if max_bytes is None else data[:max_bytes]
    finally:
        os.close(fd)


def _open_dir(root_fd: int, rel: str, create: bool) -> int:
    """fd of directory `rel` beneath root; with `create`, make missing components (mkdir -p)."""
    if not create or rel in ("", "."):
        return openat2(root_fd, rel or ".", os.O_PATH | os.O_DIRECTORY)
    fd = os.dup(root_fd)
    try:
        for part in rel.split("/"):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = openat2(fd, part, os.O_PATH | os.O_DIRECTORY)  # BENEATH: in-tree links only
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_bytes(root_fd: int, path: str, data: bytes, mode: int = 0o644, make_dirs: bool = True) -> None:
    rel = normalize(path)
    head, name = _split(rel)
    dfd = _open_dir(root_fd, head if head != "." else "", make_dirs)
    try:
        try:  # an existing FIFO, socket or device is refused before it is opened for writing
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePath(f"{path!r} is a symlink; write to its target path instead")
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{path!r} is not a regular file")
        except FileNotFoundError:
            pass
        try:
            fd = openat2(dfd, name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP, errno.EISDIR):
                raise UnsafePath(f"{path!r} is not a regular file") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{path!r} is not a regular file")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def list_dir(root_fd: int, path: str = "") -> list[dict]:
    """Entries of a directory: name, type (file|dir|symlink|other), size, mode.

    A symlink to a directory inside the workspace is followed; one leading out is refused.
    """
    rel = normalize(path)
    fd = openat2(root_fd, rel or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = []
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            out.append({"name": name, "type": kind(st.st_mode), "size": st.st_size,
                        "mode": stat.S_IMODE(st.st_mode)})
        return out
    finally:
        os.close(fd)


def kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def walk(root_fd: int, path: str = "") -> Iterator[tuple[str, list[str], list[str]]]:
    """(relative dir, dirnames, non-dir names) for a tree, never following symlinks (os.fwalk)."""
    rel = normalize(path)
    fd = openat2(root_fd, rel or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for dirpath, dirnames, filenames, _ in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            dirnames.sort()
            d = os.path.normpath(os.path.join(rel, dirpath)) if rel else os.path.normpath(dirpath)
            yield ("" if d == "." else d), dirnames, sorted(filenames)
    finally:
        os.close(fd)


def glob(root_fd: int, pattern: str, limit: int = 10000) -> list[str]:
    """Workspace-relative paths matching a glob (`**` matches any number of directories)."""
    pat = normalize(pattern) if pattern.startswith("/") else pattern.lstrip("./") or "*"
    if ".." in pat.split("/"):
        raise UnsafePath("'..' is not allowed in a glob")
    regex = _glob_regex(pat)
    out = []
    for d, dirnames, filenames in walk(root_fd, ""):
        for name in dirnames + filenames:
            rel = f"{d}/{name}" if d else name
            if regex.fullmatch(rel):
                out.append(rel)
                if len(out) >= limit:
                    return sorted(out)
    return sorted(out)


def _glob_regex(pattern: str):
    import re

    parts = []
    for i, seg in enumerate(pattern.split("/")):
        if seg == "**":
            parts.append("(?:[^/]+/)*")
            continue
        parts.append(fnmatch.translate(seg).replace("\\Z", "").replace("(?s:", "(?:")
                     .replace(".*", "[^/]*") + ("/" if i < len(pattern.split("/")) - 1 else ""))
    regex = "".join(parts)
    if regex.endswith("(?:[^/]+/)*"):
        regex = regex[: -len("(?:[^/]+/)*")] + "(?:[^/]+/)*[^/]+"
    return re.compile(regex)
