"""Versioned weight publishing: the trainer publishes every version as an XOR-of-bits delta against
its previous upload (a full snapshot every ``full_every`` uploads), zstd-compressed, in a background
thread; the inference side rebuilds any version by applying the chain from the nearest full
snapshot, verified leaf by leaf (sha256) against what the trainer published.

    pub = WeightPublisher("runs/rl/weights", full_every=10, wire_dtype="bfloat16")   # or None: in memory
    fut = pub.publish(params, version)        # returns at once; fut.result() -> PublishStats
    pub.flush(); pub.close()                  # wait for the queue; re-raise a failed publish
    pub.publish_stats                         # the last PublishStats (.identical_share, .stored_over_raw, .metrics())

    sub = WeightSubscriber("runs/rl/weights")  # or WeightSubscriber(pub.store) for an in-memory store
    sub.latest() -> int | None                 # newest complete version in the store
    params = sub.rebuild(version=None)         # nested dicts of read-only numpy arrays (latest if None)
    sub.version                                # the version it holds; rebuilding a later one applies only the new deltas

    publish_to_engine(engine, sub, version=None)   # rebuild + engine.update_weights(params, version)

What crosses the thread boundary: `publish` validates the tree (clear errors before any compute),
then snapshots every leaf — a device-side copy (cast to ``wire_dtype`` if given) for jax arrays,
so the trainer may donate or overwrite its buffers at once; a host copy for numpy arrays — and
queues it. The worker pulls the snapshot to host, XORs it with the previous upload, compresses,
hashes and writes one record (records.py) atomically. At most ``max_pending`` publishes are
queued; a further `publish` waits for a slot (back-pressure instead of unbounded memory).

Rebuilt weights are bit-identical to what was published or an error is raised (errors.py): a
corrupt record (checksum), a stale record (not newer than what the reader holds, or a file holding
another version than its name), a delta applied to another base (version or content), a missing
link in the chain. A failed step leaves the reader holding its previous, intact weights.

``wire_dtype``: the dtype the engine receives (e.g. ``bfloat16`` while the trainer keeps f32
masters); floating leaves are cast to it, others are sent as they are. The ``share of bit-identical
elements`` statistics are per dtype of the published (wire) arrays.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import zstandard

from c2jax.sync import deltas
from c2jax.sync.codec import Held, PublishStats, apply_record, encode_version
from c2jax.sync.errors import MissingLinkError, PublishError, StaleRecordError, TreeMismatchError
from c2jax.sync.records import RecordName, parse_name, record_name
from c2jax.sync.stores import Store, open_store

StoreLike = Union[str, "os.PathLike[str]", Store, None]  # noqa: F821


def store_index(store: Store) -> dict[int, RecordName]:
    """{version: RecordName} of every record in `store` (a full snapshot wins over a delta of the same
    version)."""
    out: dict[int, RecordName] = {}
    for n in store.names():
        r = parse_name(n)
        if r is not None and (r.version not in out or r.kind == "full"):
            out[r.version] = r
    return out


class WeightPublisher:
    """The trainer's side: see the module docstring."""

    def __init__(self, store: StoreLike = None, *, full_every: int = 10, wire_dtype: Optional[str] = None,
                 level: int = 3, threads: int = 0, max_pending: int = 2, keep_full: Optional[int] = 2,
                 replace_newer: bool = False) -> None:
        if not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1, got {full_every!r}")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        if keep_full is not None and (not isinstance(keep_full, int) or keep_full < 1):
            raise ValueError(f"keep_full must be None or an int >= 1, got {keep_full!r}")
        if not -7 <= int(level) <= 22:
            raise ValueError(f"zstd level must be in [-7, 22], got {level!r}")
        self.wire_dtype = None if wire_dtype is None else deltas.dtype_from_name(str(wire_dtype))
        if self.wire_dtype is not None and not jnp.issubdtype(self.wire_dtype, jnp.floating):
            raise ValueError(f"wire_dtype must be a floating dtype, got {wire_dtype!r}")
        self.store = open_store(store)
        self.full_every, self.keep_full, self.replace_newer = full_every, keep_full, replace_newer
        self._compressor = zstandard.ZstdCompressor(level=int(level), threads=int(threads))
        self._device_copy = jax.jit(self._copy_leaves)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="c2jax-weight-publish")
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._prev: Optional[Held] = None  # worker-owned: the last successful upload
        self._last_version: Optional[int] = None  # caller-owned: the last version accepted by publish()
        self._signature: Optional[list] = None
        self._uploads = 0
        self._failure: Optional[PublishError] = None
        self._futures: list[concurrent.futures.Future] = []
        self.history: list[PublishStats] = []
        self._closed = False

    # caller side ----------------------------------------------------------------------------
    def publish(self, params: Any, version: int) -> "concurrent.futures.Future[PublishStats]":
        """Queue `params` (a pytree of jax / numpy arrays) as `version` (> every earlier one)."""
        if self._closed:
            raise RuntimeError("publish() on a closed WeightPublisher")
        self._raise_failure()
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        version = int(version)
        if self._last_version is not None and version <= self._last_version:
            raise StaleRecordError(version, self._last_version, "publish: versions must increase")
        flat = deltas.flatten_tree(params)
        sig = [(p, np.dtype(self._wire_of(x.dtype)).name, tuple(x.shape)) for p, x in flat.items()]
        if self._signature is not None:
            why = deltas.signature_diff(self._signature, sig)
            if why:
                raise TreeMismatchError(f"publish of version {version}: the tree differs from the previous "
                                        f"upload {self._last_version}: {why}")
        if self._last_version is None:
            self._check_store(version)
        snapshot = self._snapshot(flat)
        full = self._uploads % self.full_every == 0
        self._signature, self._last_version = sig, version
        self._uploads += 1
        self._slots.acquire()
        fut = self._executor.submit(self._work, snapshot, version, full, time.monotonic())
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + [fut]
        return fut

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until every queued publish is written; raise PublishError if one failed."""
        with self._lock:
            pending = list(self._futures)
        concurrent.futures.wait(pending, timeout=timeout)
        self._raise_failure()

    def close(self) -> None:
        """flush(), then stop the worker. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)

    def __enter__(self) -> "WeightPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def publish_stats(self) -> Optional[PublishStats]:
        """The last completed publish's statistics (None before the first)."""
        with self._lock:
            return self.history[-1] if self.history else None

    def _wire_of(self, dtype: Any) -> np.dtype:
        dt = np.dtype(dtype)
        if self.wire_dtype is not None and jnp.issubdtype(dt, jnp.floating):
            return self.wire_dtype
        return dt

    def _snapshot(self, flat: dict) -> dict:
        """Copies of every leaf the trainer cannot touch any more, cast to the wire dtype: numpy leaves
        copied on host; jax leaves copied on device by ONE jitted call (async, a single dispatch), then
        their transfer to host started."""
        out = {p: np.array(x, dtype=self._wire_of(x.dtype), copy=True, order="C")
               for p, x in flat.items() if not isinstance(x, jax.Array)}
        paths = [p for p, x in flat.items() if isinstance(x, jax.Array)]
        if paths:
            leaves = [flat[p] for p in paths]
            try:
                copies = self._device_copy(leaves)
            except ValueError:  # leaves committed to different devices: one dispatch per leaf
                copies = [self._device_copy([x])[0] for x in leaves]
            for p, y in zip(paths, copies):
                y.copy_to_host_async()
                out[p] = y
        return {p: out[p] for p in flat}

    def _copy_leaves(self, leaves: list) -> list:
        """Traced by `jax.jit`: a fresh buffer per leaf (``jnp.copy`` is never forwarded as the input)."""
        return [x.astype(self._wire_of(x.dtype)) if self._wire_of(x.dtype) != np.dtype(x.dtype) else jnp.copy(x)
                for x in leaves]

    def _check_store(self, version: int) -> None:
        """A new publisher must not interleave with newer versions a previous run left in the store."""
        newer = sorted(v for v in store_index(self.store) if v >= version)
        if not newer:
            return
        if not self.replace_newer:
            raise StaleRecordError(version, newer[-1], "the store already holds versions "
                                   f"{newer[:3]}{'...' if len(newer) > 3 else ''} from an earlier run; "
                                   "pass replace_newer=True to drop them")
        for r in store_index(self.store).values():
            if r.version >= version:
                self.store.delete(r.name)

    def _raise_failure(self) -> None:
        with self._lock:
            err, self._failure = self._failure, None
        if err is not None:
            raise err

    # worker side -------------------------------------------------------------------------------
    def _work(self, snapshot: dict, version: int, full: bool, t_submit: float) -> PublishStats:
        t_start = time.monotonic()
        try:
            flat = {p: deltas.as_host(x) for p, x in snapshot.items()}
            del snapshot
            data, st, held = encode_version(flat, version, None if full else self._prev, self._compressor)
            t0 = time.monotonic()
            self.store.put(record_name(version, st.kind, st.base_version), data)
            st.write_s = time.monotonic() - t0
            st.queued_s = t_start - t_submit
            st.encode_s = t0 - t_start
            self._prev = held
            if st.kind == "full" and self.keep_full is not None:
                self._prune()
            with self._lock:
                self.history.append(st)
            return st
        except BaseException as e:
            self._prev = None  # the next upload is a full snapshot: readers cannot chain through this one
            with self._lock:
                self._failure = self._failure or PublishError(version, e)
            raise
        finally:
            self._slots.release()

    def _prune(self) -> None:
        """Drop every record older than the ``keep_full``-th newest full snapshot."""
        idx = store_index(self.store)
        fulls = sorted(v for v, r in idx.items() if r.kind == "full")
        if len(fulls) <= self.keep_full:
            return
        cutoff = fulls[-self.keep_full]
        for v, r in idx.items():
            if v < cutoff:
                self.store.delete(r.name)


class WeightSubscriber:
    """The inference side: see the module docstring. Thread-safe."""

    def __init__(self, store: StoreLike) -> None:
        if store is None:
            raise ValueError("a WeightSubscriber reads an existing store: pass a directory or the publisher's .store")
        self.store = open_store(store)
        self._held: Optional[Held] = None
        self._decompressor = zstandard.ZstdDecompressor()
        self._lock = threading.Lock()

    @property
    def version(self) -> Optional[int]:
        """The version currently held (None before the first rebuild)."""
        return None if self._held is None else self._held.version

    def versions(self) -> list[int]:
        return sorted(store_index(self.store))

    def latest(self) -> Optional[int]:
        """Newest version in the store (None if empty)."""
        vs = self.versions()
        return vs[-1] if vs else None

    def rebuild(self, version: Optional[int] = None, like: Any = None) -> Any:
        """The weights of `version` (latest if None) as nested dicts of read-only numpy arrays (or
        ``like``'s tree structure). Applies only the records between the held version and `version`
        when the chain passes through it, else starts from the nearest full snapshot."""
        return deltas.unflatten_tree(self.rebuild_flat(version).flat, like=like)

    def rebuild_flat(self, version: Optional[int] = None) -> Held:
        """Like `rebuild`, as the verified `Held` (version, {path: array}, digest)."""
        with self._lock:
            idx = store_index(self.store)
            if version is None:
                if not idx:
                    raise MissingLinkError(-1, -1, "the store holds no weights yet")
                version = max(idx)
            version = int(version)
            held = self._held
            if held is not None and held.version == version:
                return held
            for r in reversed(self._plan(idx, version, held)):
                try:
                    data = self.store.get(r.name)
                except KeyError:
                    raise MissingLinkError(version, r.version, f"{r.name} disappeared (pruned?)") from None
                start = None if r.kind == "full" else held
                held = apply_record(data, start, self._decompressor, name=r.name, expect=r)
                self._held = held
            return held

    def apply(self, data: bytes, name: str = "") -> int:
        """Push transport: apply one record's bytes to the held weights; returns the new version."""
        with self._lock:
            r = parse_name(name) if name else None
            self._held = apply_record(data, self._held, self._decompressor, name=name, expect=r)
            return self._held.version

    @staticmethod
    def _plan(idx: dict[int, RecordName], version: int, held: Optional[Held]) -> list[RecordName]:
        """Records to apply, newest first: back from `version` to a full snapshot or to the held version."""
        chain: list[RecordName] = []
        v = version
        while True:
            r = idx.get(v)
            if r is None:
                why = "never published or pruned" if not chain else f"the base of version {chain[-1].version}"
                raise MissingLinkError(version, v, why)
            chain.append(r)
            if r.kind == "full":
                return chain
            if held is not None and r.base_version == held.version:
                return chain
            if r.base_version >= r.version:
                raise MissingLinkError(version, r.base_version, f"{r.name} names a base that is not older")
            v = r.base_version


def publish_to_engine(engine: Any, subscriber: WeightSubscriber, version: Optional[int] = None,
                      like: Any = None) -> int:
    """Rebuild `version` (latest if None) and hand it to ``engine.update_weights``; returns the version.
    The engine checks shapes and dtypes (publish with ``wire_dtype`` = the engine's param dtype)."""
    params = subscriber.rebuild(version, like=like)
    v = subscriber.version
    engine.update_weights(params, v)
    return v
