"""The on-disk (or in-memory) record of one published version, and its file name.

A record is one file::

    b"C2WSYNC1" | sha256(body) [32 bytes] | body
    body = header length [uint32 little-endian] | header (JSON, utf-8) | payload

    header = {"format": 1, "version": v, "kind": "full" | "delta",
              "base_version": b | null, "base_digest": hex | null,   # delta: the upload it is XORed against
              "digest": hex,                                          # tree_digest of the weights it rebuilds
              "compression": "zstd", "leaves": [{"path", "dtype", "shape", "offset", "length", "sha256"}],
              "stats": {...}}                                         # PublishStats as a dict (informative)

Each leaf's payload slice ``[offset, offset + length)`` is zstd of the raw bytes (full) or of the
XOR-of-bits delta (`deltas.xor_bits`). ``sha256`` is of the leaf the record rebuilds, so applying a
delta to the wrong base is caught even if its base labels were right.

File names carry the chain, so a reader plans a rebuild from a directory listing alone:
``v000000000042.full.c2w`` and ``v000000000043.delta-from-000000000042.c2w``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from typing import Any, Optional

from c2jax.sync.errors import CorruptRecordError

MAGIC = b"C2WSYNC1"
FORMAT = 1
SUFFIX = ".c2w"
_NAME = re.compile(r"^v(\d{12})\.(full|delta-from-(\d{12}))\.c2w$")


@dataclasses.dataclass(frozen=True)
class RecordName:
    """What a record's file name says: its version, kind and (deltas) base version."""

    version: int
    kind: str  # 'full' | 'delta'
    base_version: Optional[int]

    @property
    def name(self) -> str:
        return record_name(self.version, self.kind, self.base_version)


def record_name(version: int, kind: str, base_version: Optional[int] = None) -> str:
    if kind == "full":
        return f"v{version:012d}.full{SUFFIX}"
    if kind == "delta" and base_version is not None:
        return f"v{version:012d}.delta-from-{base_version:012d}{SUFFIX}"
    raise ValueError(f"record kind must be 'full' or 'delta' (with a base version), got {kind!r}, {base_version!r}")


def parse_name(name: str) -> Optional[RecordName]:
    """The RecordName of a record file name, or None for any other file."""
    m = _NAME.match(name)
    if m is None:
        return None
    if m.group(2) == "full":
        return RecordName(int(m.group(1)), "full", None)
    return RecordName(int(m.group(1)), "delta", int(m.group(3)))


def encode_record(header: dict, payload: bytes) -> bytes:
    """Header (without offsets' validation) + payload -> the record's bytes, checksummed."""
    head = json.dumps(dict(header, format=FORMAT), separators=(",", ":"), sort_keys=True).encode()
    body = struct.pack("<I", len(head)) + head + payload
    return MAGIC + hashlib.sha256(body).digest() + body


def decode_record(data: bytes, *, name: str = "", expect_version: Optional[int] = None) -> tuple[dict, memoryview]:
    """Record bytes -> (header, payload). Raises CorruptRecordError on any mismatch (magic, checksum,
    header fields, leaf slices) before anything is decompressed."""
    v = expect_version
    if len(data) < len(MAGIC) + 32 + 4 or data[:len(MAGIC)] != MAGIC:
        raise CorruptRecordError(v, "not a weight record (bad magic or truncated)", name)
    digest, body = data[len(MAGIC):len(MAGIC) + 32], memoryview(data)[len(MAGIC) + 32:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptRecordError(v, "sha256 of the record does not match its checksum (corrupt or truncated)", name)
    (n,) = struct.unpack("<I", body[:4])
    try:
        header = json.loads(bytes(body[4:4 + n]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptRecordError(v, f"unreadable header: {e}", name) from None
    payload = body[4 + n:]
    _check_header(header, len(payload), name, v)
    return header, payload


def _check_header(h: Any, payload_len: int, name: str, v: Optional[int]) -> None:
    def bad(why: str) -> CorruptRecordError:
        return CorruptRecordError(v, why, name)

    if not isinstance(h, dict) or h.get("format") != FORMAT:
        raise bad(f"unsupported header format {h.get('format') if isinstance(h, dict) else h!r}")
    for k in ("version", "kind", "digest", "leaves"):
        if k not in h:
            raise bad(f"header has no {k!r}")
    if h["kind"] not in ("full", "delta"):
        raise bad(f"kind must be 'full' or 'delta', got {h['kind']!r}")
    if h["kind"] == "delta" and (h.get("base_version") is None or h.get("base_digest") is None):
        raise bad("a delta record must name its base_version and base_digest")
    for leaf in h["leaves"]:
        off, ln = leaf.get("offset"), leaf.get("length")
        if not (isinstance(off, int) and isinstance(ln, int) and 0 <= off and 0 <= ln and off + ln <= payload_len):
            raise bad(f"leaf {leaf.get('path')} slice [{off}, +{ln}) is outside the payload of {payload_len} bytes")
