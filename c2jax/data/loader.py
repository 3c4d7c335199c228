"""Deterministic, resumable, multi-host loader: mixes sources by weight, packs documents with segment ids.

Every batch is a pure function of (data, seed, step, loader state), and the state is tiny:
``{"step": int64[], "cursors": int64[n_sources], "fingerprint": uint64[]}`` (numpy arrays, so an
Orbax checkpoint carries it as-is). `state_at(step)` recomputes the state of any step from scratch by
replaying the (cheap) source choices, so even a checkpoint without loader state resumes exactly.

How a batch is made (global batch of B rows, S+1 tokens each):
1. Sources: `rng(seed, step).choice(n_sources, B, p=weights)` picks a source per row.
2. Windows: each source is cut into "windows" (rows of <= S+1 tokens). Row r taking source s uses
   window number `cursors[s]` of s, then `cursors[s] += 1`; window k lives in epoch k // W_s at
   position perm(seed, s, epoch)[k % W_s] (a fresh permutation per epoch).
   - packing 'stream' (code, docs): the source's documents back to back, cut every S tokens
     (stride S, length S+1, so every token is a target exactly once per epoch; the last window is
     padded); a document may span windows.
   - packing 'whole' (chat/SFT): whole documents packed greedily into rows in a seeded order;
     a document longer than S+1 tokens is left out (`Loader.skipped_long` counts them; truncating
     would cut off the assistant answer). No conversation is split across rows.
3. Segments: each document piece in a row gets its own segment id (1, 2, ...; 0 = padding), and
   positions restart at 0 for each segment, so attention (masked by segment id) never crosses a
   document boundary. A target is trained only when it is in the same segment as its input and
   the shard's loss mask allows it (all text tokens; assistant tokens of chat documents).
4. Hosts: every process computes the same global choice; process p keeps rows
   [p * B / P, (p + 1) * B / P).

Batch (numpy, local rows b = B / process_count):
    inputs [b, S] int32, targets [b, S] int32, segment_ids [b, S] int32, positions [b, S] int32,
    loss_mask [b, S] float32, source_ids [b] int32
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from c2jax.data.shards import ShardError, ShardReader

PACKINGS = ("stream", "whole")


class DataError(ValueError):
    """Data cannot be served as configured (empty source, bad weights, state mismatch...)."""


def fingerprint_int(key: str) -> np.uint64:
    """A 64-bit integer form of a build key (stored in loader state to catch data mismatches)."""
    return np.uint64(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))


@dataclass
class _Windows:
    """Windows of one source: rows as lists of token spans, plus per-span segment semantics."""

    packing: str
    count: int
    # 'stream': window j = [lo + j*S, min(hi, lo + j*S + S + 1))
    lo: int = 0
    hi: int = 0
    # 'whole': window j = docs row_docs[row_ptr[j]:row_ptr[j+1]]
    row_ptr: np.ndarray | None = None
    row_docs: np.ndarray | None = None


class Loader:
    """Packed, source-mixed batches from a split store (see module docstring)."""

    def __init__(self, reader: ShardReader, *, seq_len: int, batch_size: int,
                 weights: Mapping[str, float], seed: int = 0, packing: Mapping[str, str] | None = None,
                 process_index: int = 0, process_count: int = 1, pad_id: int = 0):
        if seq_len < 1 or batch_size < 1:
            raise DataError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise DataError(f"bad process_index/process_count {process_index}/{process_count}")
        if batch_size % process_count:
            raise DataError(f"global batch_size {batch_size} is not divisible by process_count {process_count}")
        self.reader = reader
        self.S = int(seq_len)
        self.B = int(batch_size)
        self.seed = int(seed)
        self.pid, self.pcount = int(process_index), int(process_count)
        self.pad_id = int(pad_id)
        unknown = [k for k in weights if k not in reader.source_index]
        if unknown:
            raise DataError(f"data mix names source(s) {unknown} that the shard {reader.dir} does not hold; "
                            f"it holds {list(reader.source_index)}")
        w = np.zeros(len(reader.sources), np.float64)
        for k, v in weights.items():
            if not np.isfinite(v) or v < 0:
                raise DataError(f"mix weight of {k!r} must be a finite number >= 0, got {v}")
            w[reader.source_index[k]] = float(v)
        for i, s in enumerate(reader.sources):
            if w[i] > 0 and s.n_tokens == 0:
                raise DataError(f"source {s.name!r} has weight {w[i]} but no documents in {reader.dir}")
        if w.sum() <= 0:
            raise DataError(f"data mix has no source with a positive weight: {dict(weights)}")
        self.weights = w / w.sum()
        packing = dict(packing or {})
        self.skipped_long: dict[str, int] = {}
        self.windows: list[_Windows | None] = []
        for i, s in enumerate(reader.sources):
            p = packing.get(s.name, "whole" if s.kind == "chat" else "stream")
            if p not in PACKINGS:
                raise DataError(f"packing of {s.name!r} must be one of {PACKINGS}, got {p!r}")
            self.windows.append(self._make_windows(i, p) if self.weights[i] > 0 else None)
        self.fingerprint = fingerprint_int(f"{reader.meta['key']}:{self.S}:{self.B}:{self.seed}:{self.weights.tolist()}:"
                                           f"{[w.packing if w else None for w in self.windows]}")
        self._perm_cache: dict[tuple[int, int], np.ndarray] = {}
        self.step = 0
        self.cursors = np.zeros(len(reader.sources), np.int64)

    # ---- windows --------------------------------------------------------------------------
    def _make_windows(self, i: int, packing: str) -> _Windows:
        s = self.reader.sources[i]
        S = self.S
        if packing == "stream":
            n = max(1, -(-(s.n_tokens - 1) // S))  # ceil: the last, partial window is padded
            return _Windows("stream", n, lo=s.tok_lo, hi=s.tok_hi)
        off = self.reader.doc_offsets
        lens = off[s.doc_lo + 1:s.doc_hi + 1] - off[s.doc_lo:s.doc_hi]
        order = np.random.default_rng([self.seed, 7919, i]).permutation(s.n_docs)
        fits = lens[order] <= S + 1
        self.skipped_long[s.name] = int((~fits).sum())
        order = order[fits]
        if len(order) == 0:
            raise DataError(f"no document of source {s.name!r} fits in seq_len + 1 = {S + 1} tokens (longest "
                            f"needs {int(lens.max())}); raise seq_len or use packing 'stream' for it")
        row_ptr = [0]
        fill = 0
        for j, d in enumerate(order):  # next-fit packing: O(docs), once per loader
            if fill and fill + lens[d] > S + 1:
                row_ptr.append(j)
                fill = 0
            fill += int(lens[d])
        row_ptr.append(len(order))
        return _Windows("whole", len(row_ptr) - 1, row_ptr=np.asarray(row_ptr, np.int64),
                        row_docs=(order + s.doc_lo).astype(np.int64))

    def _perm(self, i: int, epoch: int) -> np.ndarray:
        key = (i, epoch)
        p = self._perm_cache.get(key)
        if p is None:
            if len(self._perm_cache) > 4 * len(self.windows):
                self._perm_cache.clear()
            p = np.random.default_rng([self.seed, 104729, i, epoch]).permutation(self.windows[i].count)
            self._perm_cache[key] = p
        return p

    def _row_spans(self, i: int, k: int) -> list[tuple[int, int, bool]]:
        """Token spans of window k of source i: (a, b, starts_new_segment_only_at_doc_starts)."""
        w = self.windows[i]
        j = int(self._perm(i, k // w.count)[k % w.count])
        if w.packing == "stream":
            a = w.lo + j * self.S
            return [(a, min(w.hi, a + self.S + 1), True)]
        off = self.reader.doc_offsets
        docs = w.row_docs[w.row_ptr[j]:w.row_ptr[j + 1]]
        return [(int(off[d]), int(off[d + 1]), False) for d in docs]

    # ---- choices and state ----------------------------------------------------------------
    def choices(self, step: int) -> np.ndarray:
        """Source index of each global row at `step` [B] (same on every process)."""
        rng = np.random.default_rng([self.seed, 15485863, int(step)])
        return rng.choice(len(self.weights), size=self.B, p=self.weights)

    def state(self) -> dict[str, np.ndarray]:
        """The loader state to store in a checkpoint (small numpy arrays)."""
        return {"step": np.asarray(self.step, np.int64), "cursors": self.cursors.copy(),
                "fingerprint": np.asarray(self.fingerprint, np.uint64)}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Continue from a saved `state()`; refuses a state saved for different data or settings."""
        fp = np.uint64(np.asarray(state["fingerprint"]).item())
        if fp != self.fingerprint:
            raise DataError("loader state was saved for a different data build, mix, seq_len, batch_size "
                            "or seed; refusing to resume with it (use state_at(step) to rebuild it)")
        cursors = np.asarray(state["cursors"], np.int64)
        if cursors.shape != self.cursors.shape:
            raise DataError(f"loader state has {cursors.shape[0]} source cursors, expected {self.cursors.shape[0]}")
        self.step = int(np.asarray(state["step"]).item())
        self.cursors = cursors.copy()

    def state_at(self, step: int) -> dict[str, np.ndarray]:
        """The state before `step`, recomputed by replaying the source choices (no data read)."""
        cursors = np.zeros_like(self.cursors)
        for t in range(int(step)):
            cursors += np.bincount(self.choices(t), minlength=len(self.weights))
        return {"step": np.asarray(step, np.int64), "cursors": cursors,
                "fingerprint": np.asarray(self.fingerprint, np.uint64)}

    def seek(self, step: int) -> None:
        self.restore(self.state_at(step))

    # ---- batches --------------------------------------------------------------------------
    def next_batch(self) -> dict[str, np.ndarray]:
        """The batch of the current step (this process's rows); advances the state."""
        ch = self.choices(self.step)
        ks = np.empty(self.B, np.int64)
        for i in np.unique(ch):
            rows = np.nonzero(ch == i)[0]
            ks[rows] = self.cursors[i] + np.arange(len(rows))
            self.cursors[i] += len(rows)
        b = self.B // self.pcount
        lo = self.pid * b
        batch = self._assemble(ch[lo:lo + b], ks[lo:lo + b])
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        while True:
            yield self.next_batch()

    def _assemble(self, srcs: np.ndarray, ks: np.ndarray) -> dict[str, np.ndarray]:
        rows = [self._row_spans(int(i), int(k)) for i, k in zip(srcs, ks)]
        return pack_rows(self.reader, rows, self.S, self.pad_id, srcs)


def pack_rows(reader: ShardReader, rows: list[list[tuple[int, int, bool]]], S: int, pad_id: int,
              source_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Assemble rows of token spans into the batch dict (see module docstring)."""
    flat = [(a, b) for r in rows for a, b, _ in r]
    toks = reader.read_spans(flat, "tokens")
    masks = reader.read_spans(flat, "loss_mask")
    nb = len(rows)
    tok = np.full((nb, S + 1), pad_id, np.int32)   # [b, S+1]
    seg = np.zeros((nb, S + 1), np.int32)          # [b, S+1]
    pos = np.zeros((nb, S + 1), np.int32)          # [b, S+1]
    allow = np.zeros((nb, S + 1), bool)            # [b, S+1]
    off = reader.doc_offsets
    it = 0
    for r, spans in enumerate(rows):
        fill, nseg = 0, 0
        for a, b, stream in spans:
            t, m = toks[it], masks[it]
            it += 1
            n = min(b - a, S + 1 - fill)
            tok[r, fill:fill + n] = t[:n]
            allow[r, fill:fill + n] = m[:n].astype(bool)
            if stream:  # segments start at every document start inside [a, a + n)
                starts = off[np.searchsorted(off, a, side="right"):np.searchsorted(off, a + n, side="left")]
                cuts = np.concatenate([[a], starts]) - a  # piece starts relative to the span
                ends = np.concatenate([cuts[1:], [n]])
                for c0, c1 in zip(cuts, ends):
                    nseg += 1
                    seg[r, fill + c0:fill + c1] = nseg
                    pos[r, fill + c0:fill + c1] = np.arange(c1 - c0)
            else:
                nseg += 1
                seg[r, fill:fill + n] = nseg
                pos[r, fill:fill + n] = np.arange(n)
            fill += n
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
    return {
        "inputs": tok[:, :-1],
        "targets": tok[:, 1:],
        "segment_ids": seg[:, :-1],
        "positions": pos[:, :-1],
        "loss_mask": (same & allow[:, 1:]).astype(np.float32),
        "source_ids": np.asarray(source_ids, np.int32),
    }


def eval_batches(reader: ShardReader, source: str, *, seq_len: int, batch_size: int,
                 max_batches: int | None = None, pad_id: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Held-out batches of one source: consecutive stride-S windows in shard order (no sampling).

    Deterministic and the same on every process (evaluation is cheap; shard it outside if needed).
    The last batch is padded with rows whose loss mask is zero.
    """
    if source not in reader.source_index:
        raise ShardError(f"shard {reader.dir} has no source {source!r}; it holds {list(reader.source_index)}")
    i = reader.source_index[source]
    s = reader.sources[i]
    if s.n_tokens == 0:
        return
    S = int(seq_len)
    starts = list(range(s.tok_lo, max(s.tok_lo + 1, s.tok_hi - 1), S))
    nb = 0
    for j in range(0, len(starts), batch_size):
        if max_batches is not None and nb >= max_batches:
            return
        chunk = starts[j:j + batch_size]
        rows = [[(a, min(s.tok_hi, a + S + 1), True)] for a in chunk]
        rows += [[] for _ in range(batch_size - len(rows))]
        yield pack_rows(reader, rows, S, pad_id, np.full(batch_size, i, np.int32))
        nb += 1
