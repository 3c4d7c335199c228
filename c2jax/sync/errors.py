"""Typed errors of the weight store: each names the versions involved, so a failed rebuild says
exactly which link of the chain is wrong, and nothing is ever applied silently.

    WeightSyncError                 base class
    ├── CorruptRecordError          checksum / format / leaf-hash failure of one record (full or delta)
    ├── StaleRecordError            a record that is not newer than what the reader holds, or a file
    │                               whose header names another version than its file name
    ├── BaseMismatchError           a delta applied to weights that are not its base (version or content)
    ├── MissingLinkError            a version the chain needs is not in the store (never published, pruned)
    ├── TreeMismatchError           a published tree whose paths / shapes / dtypes differ from the last upload
    └── PublishError                a background publish failed (raised by the next publish() / flush())
"""
from __future__ import annotations

from typing import Optional


class WeightSyncError(Exception):
    """Base class of every weight-store error."""


class CorruptRecordError(WeightSyncError):
    """A record's bytes do not check out: bad magic, sha256 of the body, header, or a rebuilt leaf's hash."""

    def __init__(self, version: Optional[int], reason: str, name: str = ""):
        self.version, self.reason, self.name = version, reason, name
        where = f" ({name})" if name else ""
        super().__init__(f"weight record for version {version}{where} is corrupt: {reason}")


class StaleRecordError(WeightSyncError):
    """A record that would move the reader backwards (or a file that holds another version than its name)."""

    def __init__(self, version: int, held_version: Optional[int], reason: str = ""):
        self.version, self.held_version = version, held_version
        super().__init__(f"stale weight record: version {version} is not newer than the held version "
                         f"{held_version}" + (f" ({reason})" if reason else ""))


class BaseMismatchError(WeightSyncError):
    """A delta whose base is not the weights it would be applied to."""

    def __init__(self, version: int, base_version: int, held_version: Optional[int], reason: str = ""):
        self.version, self.base_version, self.held_version = version, base_version, held_version
        super().__init__(f"delta for version {version} applies to base version {base_version}, but the reader "
                         f"holds version {held_version}" + (f" ({reason})" if reason else ""))


class MissingLinkError(WeightSyncError):
    """The chain to ``version`` needs ``missing``, which the store does not have."""

    def __init__(self, version: int, missing: int, reason: str = ""):
        self.version, self.missing = version, missing
        super().__init__(f"cannot rebuild version {version}: version {missing} is missing from the store"
                         + (f" ({reason})" if reason else ""))


class TreeMismatchError(WeightSyncError, ValueError):
    """The published tree differs (paths, shapes or dtypes) from the previous upload, or is not publishable."""


class PublishError(WeightSyncError):
    """A background publish failed; raised from the next ``publish()`` / ``flush()`` so nothing is lost."""

    def __init__(self, version: int, cause: BaseException):
        self.version, self.cause = version, cause
        super().__init__(f"background publish of version {version} failed: {type(cause).__name__}: {cause}")
