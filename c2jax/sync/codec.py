"""Encode one version as a record (full snapshot or XOR delta against the previous upload) and apply
a record to the weights a reader holds, verifying every step.

    rec, stats, held = encode_version(flat, version, prev=held_or_None, compressor=zstd.ZstdCompressor())
    held2 = apply_record(rec, held, decompressor, name=..., expect=RecordName(...))

`Held` is a verified set of weights: version, {path: read-only host array}, and its `tree_digest`.
`apply_record` never mutates its input: it returns a new `Held` only after the record's checksum,
its labels (version, kind, base version, base digest) and the sha256 of every rebuilt leaf check
out; otherwise it raises (errors.py) and the caller still holds the old, intact weights.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Optional

import numpy as np
import zstandard

from c2jax.sync import deltas
from c2jax.sync.errors import BaseMismatchError, CorruptRecordError, StaleRecordError, TreeMismatchError
from c2jax.sync.records import RecordName, decode_record, encode_record


@dataclasses.dataclass(frozen=True)
class Held:
    """Weights a publisher last uploaded or a reader rebuilt."""

    version: int
    flat: Mapping[tuple, np.ndarray]  # path -> read-only C-contiguous host array
    digest: str  # deltas.tree_digest of the leaves


@dataclasses.dataclass
class PublishStats:
    """What one publish wrote. ``identical_share[dtype]``: share of elements whose bits did not change
    since the previous upload (deltas only; None for a full snapshot). ``stored_over_raw``: record
    payload bytes / uncompressed bytes of the whole tree (for a delta: the delta's size as a share of
    a full snapshot)."""

    version: int
    kind: str  # 'full' | 'delta'
    base_version: Optional[int]
    raw_bytes: int  # uncompressed size of every leaf
    stored_bytes: int  # compressed payload (what goes over the wire, headers excluded)
    record_bytes: int = 0  # the whole record incl. header and checksum
    elements: dict = dataclasses.field(default_factory=dict)  # dtype -> elements
    identical: Optional[dict] = None  # dtype -> bit-identical elements (deltas)
    raw_bytes_by_dtype: dict = dataclasses.field(default_factory=dict)
    stored_bytes_by_dtype: dict = dataclasses.field(default_factory=dict)
    encode_s: float = 0.0  # host copy + XOR + zstd + hashing (in the background worker)
    write_s: float = 0.0  # store.put
    queued_s: float = 0.0  # publish() call -> worker start

    @property
    def stored_over_raw(self) -> float:
        return self.stored_bytes / max(self.raw_bytes, 1)

    @property
    def identical_share(self) -> Optional[dict]:
        if self.identical is None:
            return None
        return {d: self.identical[d] / max(self.elements[d], 1) for d in self.elements}

    def metrics(self, prefix: str = "weight_sync/") -> dict[str, float]:
        """Flat float metrics for a metrics logger."""
        m = {f"{prefix}version": float(self.version), f"{prefix}is_full": float(self.kind == "full"),
             f"{prefix}raw_bytes": float(self.raw_bytes), f"{prefix}stored_bytes": float(self.stored_bytes),
             f"{prefix}stored_over_raw": self.stored_over_raw, f"{prefix}encode_s": self.encode_s,
             f"{prefix}write_s": self.write_s, f"{prefix}queued_s": self.queued_s}
        for d, share in (self.identical_share or {}).items():
            m[f"{prefix}identical_share/{d}"] = share
        return m

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(stored_over_raw=self.stored_over_raw, identical_share=self.identical_share)
        return d


def freeze(flat: Mapping[tuple, Any]) -> dict[tuple, np.ndarray]:
    """Host, C-contiguous, read-only copies-or-views of every leaf (the arrays a Held may share)."""
    out = {}
    for p, x in flat.items():
        a = deltas.as_host(x)
        if a.flags.writeable:
            a = a.copy() if a.base is not None else a
            a.flags.writeable = False
        out[p] = a
    return out


def encode_version(flat: Mapping[tuple, np.ndarray], version: int, prev: Optional[Held],
                   compressor: zstandard.ZstdCompressor) -> tuple[bytes, PublishStats, Held]:
    """flat: host arrays of the new upload (owned by the caller's worker; frozen here). ``prev`` None
    -> full snapshot, else an XOR delta against ``prev`` (same signature required)."""
    t0 = time.monotonic()
    cur = freeze(flat)
    if prev is not None:
        why = deltas.signature_diff(deltas.tree_signature(prev.flat), deltas.tree_signature(cur))
        if why:
            raise TreeMismatchError(f"version {version} differs from the previous upload {prev.version}: {why}")
    kind = "full" if prev is None else "delta"
    leaves, chunks, offset = [], [], 0
    st = PublishStats(version=version, kind=kind, base_version=None if prev is None else prev.version,
                      raw_bytes=0, stored_bytes=0, identical=None if prev is None else {})
    for path, x in cur.items():
        d = np.dtype(x.dtype).name
        if prev is None:
            body = deltas.raw_bytes_view(x)
        else:
            xd = deltas.xor_bits(prev.flat[path], x)  # [N] uint
            st.identical[d] = st.identical.get(d, 0) + deltas.count_identical(xd)
            body = xd.view(np.uint8)
        blob = compressor.compress(body)
        spec = dict(deltas.leaf_spec(path, x), sha256=deltas.leaf_sha256(x), offset=offset, length=len(blob))
        leaves.append(spec)
        chunks.append(blob)
        offset += len(blob)
        st.elements[d] = st.elements.get(d, 0) + int(x.size)
        st.raw_bytes_by_dtype[d] = st.raw_bytes_by_dtype.get(d, 0) + int(x.nbytes)
        st.stored_bytes_by_dtype[d] = st.stored_bytes_by_dtype.get(d, 0) + len(blob)
    st.raw_bytes, st.stored_bytes = sum(st.raw_bytes_by_dtype.values()), offset
    digest = deltas.tree_digest(leaves)
    header = {"version": int(version), "kind": kind, "base_version": st.base_version,
              "base_digest": None if prev is None else prev.digest, "digest": digest,
              "compression": "zstd", "leaves": leaves}
    st.encode_s = time.monotonic() - t0
    header["stats"] = st.to_dict()
    data = encode_record(header, b"".join(chunks))
    st.record_bytes = len(data)
    return data, st, Held(int(version), cur, digest)


def apply_record(data: bytes, held: Optional[Held], decompressor: zstandard.ZstdDecompressor, *,
                 name: str = "", expect: Optional[RecordName] = None) -> Held:
    """The weights `data` rebuilds from ``held`` (None: only a full snapshot applies). Checks, in
    order and before any leaf is written: checksum and header (CorruptRecordError), the labels the
    file name promised (``expect``; StaleRecordError if the file holds another version), staleness
    (StaleRecordError), the delta's base version and digest against ``held`` (BaseMismatchError);
    then, per leaf, the sha256 of the rebuilt array (CorruptRecordError)."""
    v_expect = expect.version if expect is not None else None
    h, payload = decode_record(data, name=name, expect_version=v_expect)
    version, kind = int(h["version"]), h["kind"]
    base = None if h.get("base_version") is None else int(h["base_version"])
    if expect is not None and (version, kind, base) != (expect.version, expect.kind, expect.base_version):
        raise StaleRecordError(version, None if held is None else held.version,
                               f"file {name or '?'} should hold version {expect.version} ({expect.kind}"
                               f"{'' if expect.base_version is None else f' from {expect.base_version}'}) but holds "
                               f"version {version} ({kind}{'' if base is None else f' from {base}'})")
    if held is not None and version <= held.version:
        raise StaleRecordError(version, held.version)
    if kind == "delta":
        if held is None or held.version != base:
            raise BaseMismatchError(version, base, None if held is None else held.version)
        if held.digest != h["base_digest"]:
            raise BaseMismatchError(version, base, held.version,
                                    "same version number but different weights (base digest differs)")
    out: dict[tuple, np.ndarray] = {}
    for leaf in h["leaves"]:
        path = tuple(leaf["path"])
        dt, shape = deltas.dtype_from_name(leaf["dtype"]), tuple(leaf["shape"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        blob = payload[leaf["offset"]:leaf["offset"] + leaf["length"]]
        try:
            raw = decompressor.decompress(blob, max_output_size=nbytes)
        except zstandard.ZstdError as e:
            raise CorruptRecordError(version, f"leaf {deltas.path_str(path)}: zstd: {e}", name) from None
        if len(raw) != nbytes:
            raise CorruptRecordError(version, f"leaf {deltas.path_str(path)} decompressed to {len(raw)} bytes, "
                                              f"expected {nbytes}", name)
        if kind == "full":
            x = np.frombuffer(raw, dtype=dt).reshape(shape)
        else:
            prev = held.flat.get(path)
            if prev is None or prev.dtype != dt or prev.shape != shape:
                raise BaseMismatchError(version, base, held.version,
                                        f"leaf {deltas.path_str(path)} is not in the held weights with "
                                        f"dtype {dt} and shape {shape}")
            x = deltas.apply_xor_bits(prev, np.frombuffer(raw, dtype=deltas.uint_view_dtype(dt)))
        if deltas.leaf_sha256(x) != leaf["sha256"]:
            raise CorruptRecordError(version, f"leaf {deltas.path_str(path)} rebuilt to different bytes than "
                                              f"the publisher's (sha256 mismatch)", name)
        x.flags.writeable = False
        out[path] = x
    if kind == "delta" and set(out) != set(held.flat):
        raise BaseMismatchError(version, base, held.version, "the delta does not cover every held leaf")
    if deltas.tree_digest(dict(leaf, path=list(leaf["path"])) for leaf in h["leaves"]) != h["digest"]:
        raise CorruptRecordError(version, "tree digest does not match its leaves", name)
    return Held(version, out, h["digest"])
