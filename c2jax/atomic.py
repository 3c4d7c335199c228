"""Atomic file writes: readers see the old file or the whole new one, never a torn write.

    with atomic_open(path) as f:            # or mode="wb"; fsync=True for crash durability
        f.write(...)
    atomic_write_json(path, obj, indent=1)
    with atomic_path(path, suffix=".png") as tmp:   # for writers that take a path (savefig, HF save)
        fig.savefig(tmp)

The data goes to a temporary file beside `path` (unique per process, thread and call, so concurrent
writers never share one) and replaces `path` with `os.replace` only when the block finishes without
an exception; on an exception the temporary file is removed and `path` is left as it was.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from typing import IO, Any, Iterator


def _temp_name(path: str, suffix: str) -> str:
    return f"{path}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp{suffix}"


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = "") -> Iterator[str]:
    """Yield a temporary path beside `path` (ending in `suffix`); on success it replaces `path`."""
    tmp = _temp_name(os.fspath(path), suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", *, fsync: bool = False, **open_kwargs: Any) -> Iterator[IO]:
    """`open(path, mode)` whose contents appear at `path` all at once when the block succeeds.
    `fsync`: flush to disk before the rename (survives a machine crash, not only a process kill)."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a whole file: mode must start with 'w', got {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())


def atomic_write_json(path: str, obj: Any, *, fsync: bool = False, **dump_kwargs: Any) -> str:
    """`json.dump(obj, **dump_kwargs)` to `path` atomically; returns `path`."""
    with atomic_open(path, "w", fsync=fsync) as f:
        json.dump(obj, f, **dump_kwargs)
    return path
