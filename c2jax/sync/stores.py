"""Where weight records live: a directory (shared file system between trainer and inference) or
process memory (trainer and engine in one process, tests). Both hold named byte blobs.

    store = open_store("runs/rl/weights")   # DirStore; open_store(None) -> MemoryStore
    store.put(name, data); store.get(name); store.names(); store.delete(name)

A put is atomic: a reader sees either the whole record or none of it (DirStore writes a hidden
temporary file and renames it into place; a crash leaves only a ``.tmp-*`` file, never a partial
record). A missing name raises KeyError.
"""
from __future__ import annotations

import os
import tempfile
import threading
from typing import Optional, Protocol, Union, runtime_checkable


@runtime_checkable
class Store(Protocol):
    def put(self, name: str, data: bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def names(self) -> list[str]: ...
    def delete(self, name: str) -> None: ...


class MemoryStore:
    """Records in a dict (thread-safe)."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, name: str, data: bytes) -> None:
        with self._lock:
            self._blobs[name] = bytes(data)

    def get(self, name: str) -> bytes:
        with self._lock:
            return self._blobs[name]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._blobs)

    def delete(self, name: str) -> None:
        with self._lock:
            self._blobs.pop(name, None)


class DirStore:
    """Records as files in one directory (created if needed). ``fsync=True`` also makes each put durable
    across a machine crash (slower)."""

    def __init__(self, path: Union[str, os.PathLike], fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        os.makedirs(self.path, exist_ok=True)

    def _full(self, name: str) -> str:
        if os.sep in name or name.startswith("."):
            raise ValueError(f"record names are plain file names, got {name!r}")
        return os.path.join(self.path, name)

    def put(self, name: str, data: bytes) -> None:
        target = self._full(name)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get(self, name: str) -> bytes:
        try:
            with open(self._full(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise KeyError(name) from None

    def names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.path) if not n.startswith("."))

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._full(name))
        except FileNotFoundError:
            pass


def open_store(where: Optional[Union[str, os.PathLike, Store]]) -> Store:
    """A Store for a directory path, a new MemoryStore for None, or `where` itself if it is a Store."""
    if where is None:
        return MemoryStore()
    if isinstance(where, (str, os.PathLike)):
        return DirStore(where)
    if isinstance(where, Store):
        return where
    raise TypeError(f"a weight store is a directory path, None (in memory) or a Store, got {type(where).__name__}")
