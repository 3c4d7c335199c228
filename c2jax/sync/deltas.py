"""Per-tensor XOR-of-bits deltas and the flat view of a parameter tree they work on.

    flat = flatten_tree(params)               # {path: array}, path = ('moe_layers', 'attn', ...)
    d = xor_bits(prev, cur)                    # uint{8,16,32,64} view of both, XORed: 0 where bit-identical
    cur2 = apply_xor_bits(prev, d)             # == cur, bit for bit (XOR is its own inverse)
    leaf_sha256(cur), tree_digest(specs)       # what every record carries, so a rebuild is verified

Why XOR of the bits rather than ``cur - prev``: it is exact for every dtype (no rounding, NaN and
-0.0 survive), an unchanged element becomes exactly 0 (zstd squeezes long zero runs to almost
nothing), and a small change of a float touches only its low mantissa bits, so the high bytes of
the XOR stay 0 too. Each array is viewed as the unsigned integer of its itemsize (bf16 -> uint16,
f32 -> uint32); arrays must be C-contiguous host (numpy) arrays.

Paths: trees are nested dicts (str keys) and lists / tuples (int indices), which is what the model's
parameters are; `unflatten_tree` rebuilds nested dicts / lists, or the exact structure of a
``like`` tree.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping, Sequence

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 names with numpy)
import numpy as np

from c2jax.sync.errors import TreeMismatchError

Path = tuple  # of str (dict key) / int (sequence index)

_UINT_OF_ITEMSIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def dtype_from_name(name: str) -> np.dtype:
    """numpy dtype for a stored name ('float32', 'bfloat16', 'float8_e4m3fn', ...)."""
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(getattr(ml_dtypes, name))


def uint_view_dtype(dtype: np.dtype) -> type:
    """The unsigned integer type an element of `dtype` is XORed as (its itemsize)."""
    dt = np.dtype(dtype)
    if dt.itemsize not in _UINT_OF_ITEMSIZE or dt.hasobject or dt.fields is not None:
        raise TreeMismatchError(f"dtype {dt} cannot be published: need a plain numeric dtype of 1, 2, 4 or 8 bytes")
    return _UINT_OF_ITEMSIZE[dt.itemsize]


def _key_of(entry: Any) -> Any:
    if isinstance(entry, jax.tree_util.DictKey):
        if not isinstance(entry.key, str):
            raise TreeMismatchError(f"dict keys must be str to be published, got {entry.key!r}")
        return entry.key
    if isinstance(entry, jax.tree_util.SequenceKey):
        return int(entry.idx)
    raise TreeMismatchError(f"only nested dicts / lists / tuples can be published, got a {type(entry).__name__} "
                            f"node ({entry})")


def flatten_tree(tree: Any) -> dict[Path, Any]:
    """{path: leaf} in jax's leaf order. Raises TreeMismatchError for leaves that are not arrays or
    containers other than dicts / lists / tuples, before anything is copied."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    out: dict[Path, Any] = {}
    for kp, leaf in flat:
        path = tuple(_key_of(e) for e in kp)
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TreeMismatchError(f"leaf {path_str(path)} is a {type(leaf).__name__}, not an array")
        uint_view_dtype(leaf.dtype)
        out[path] = leaf
    if not out:
        raise TreeMismatchError("the tree has no array leaves")
    return out


def unflatten_tree(flat: Mapping[Path, Any], like: Any = None) -> Any:
    """Inverse of `flatten_tree`: nested dicts (str keys) / lists (int keys), or ``like``'s structure."""
    if like is not None:
        want = list(flatten_tree(like))
        if want != list(flat):
            missing = sorted(set(map(path_str, want)) - set(map(path_str, flat)))
            extra = sorted(set(map(path_str, flat)) - set(map(path_str, want)))
            raise TreeMismatchError(f"rebuilt tree does not match `like`: missing {missing[:3]}, extra {extra[:3]}")
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), [flat[p] for p in want])
    root: dict = {}
    for path, leaf in flat.items():
        node = root
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = leaf
    return _lists(root)


def _lists(node: Any) -> Any:
    """Dicts whose keys are exactly 0..n-1 (ints) become lists."""
    if not isinstance(node, dict):
        return node
    out = {k: _lists(v) for k, v in node.items()}
    if out and all(isinstance(k, int) for k in out) and sorted(out) == list(range(len(out))):
        return [out[i] for i in range(len(out))]
    return out


def path_str(path: Path) -> str:
    return "/".join(str(k) for k in path)


def as_host(x: Any) -> np.ndarray:
    """A C-contiguous numpy array of `x` (a jax or numpy array); blocks until `x` is computed."""
    return np.ascontiguousarray(np.asarray(x))


def xor_bits(prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """prev, cur: same shape and dtype -> their bits XORed, as uint of the itemsize, flattened [N]."""
    if prev.shape != cur.shape or prev.dtype != cur.dtype:
        raise TreeMismatchError(f"xor_bits: {prev.shape} {prev.dtype} vs {cur.shape} {cur.dtype}")
    u = uint_view_dtype(cur.dtype)
    return np.bitwise_xor(prev.reshape(-1).view(u), cur.reshape(-1).view(u))


def apply_xor_bits(prev: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """prev [shape] (dtype), delta [N] (uint of the itemsize) -> the new array [shape] (dtype), a fresh buffer."""
    u = uint_view_dtype(prev.dtype)
    if delta.dtype != u or delta.size != prev.size:
        raise TreeMismatchError(f"apply_xor_bits: delta {delta.dtype}[{delta.size}] does not fit "
                                f"{prev.dtype}{list(prev.shape)}")
    return np.bitwise_xor(prev.reshape(-1).view(u), delta).view(prev.dtype).reshape(prev.shape)


def leaf_sha256(x: np.ndarray) -> str:
    """sha256 of a C-contiguous array's raw bytes (hex)."""
    return hashlib.sha256(raw_bytes_view(x)).hexdigest()


def raw_bytes_view(x: np.ndarray) -> np.ndarray:
    """[nbytes] uint8 view of a C-contiguous array (works for bfloat16 / float8, which have no buffer format)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def leaf_spec(path: Path, x: np.ndarray) -> dict:
    """What identifies a leaf in a record: path, dtype name, shape."""
    return {"path": list(path), "dtype": np.dtype(x.dtype).name, "shape": list(x.shape)}


def tree_digest(specs: Iterable[Mapping[str, Any]]) -> str:
    """sha256 over every leaf's (path, dtype, shape, sha256): the identity of a whole set of weights."""
    h = hashlib.sha256()
    for s in specs:
        h.update(json.dumps([s["path"], s["dtype"], s["shape"], s["sha256"]], separators=(",", ":")).encode())
    return h.hexdigest()


def tree_signature(flat: Mapping[Path, Any]) -> list[tuple]:
    """[(path, dtype name, shape)] of a flat tree: what consecutive uploads must share."""
    return [(p, np.dtype(x.dtype).name, tuple(x.shape)) for p, x in flat.items()]


def signature_diff(want: Sequence[tuple], got: Sequence[tuple]) -> str:
    """A short human description of how two tree signatures differ ('' if equal)."""
    if list(want) == list(got):
        return ""
    w = {p: (d, s) for p, d, s in want}
    g = {p: (d, s) for p, d, s in got}
    missing = [path_str(p) for p in w if p not in g]
    extra = [path_str(p) for p in g if p not in w]
    changed = [f"{path_str(p)}: {w[p]} -> {g[p]}" for p in w if p in g and w[p] != g[p]]
    parts = [f"missing {missing[:3]}" if missing else "", f"new {extra[:3]}" if extra else "",
             f"changed {changed[:3]}" if changed else ""]
    return "; ".join(p for p in parts if p) or "leaf order differs"


def count_identical(delta: np.ndarray) -> int:
    """Elements whose bits did not change (zeros of an XOR delta)."""
    return int(delta.size - np.count_nonzero(delta))


def changed_share_by_dtype(prev: Mapping[Path, np.ndarray], cur: Mapping[Path, np.ndarray]) -> dict[str, float]:
    """{dtype: share of bit-identical elements} between two flat trees of the same signature
    (a reference for the publisher's statistics, used by tests)."""
    n: dict[str, int] = {}
    same: dict[str, int] = {}
    for p, x in cur.items():
        d = np.dtype(x.dtype).name
        n[d] = n.get(d, 0) + x.size
        same[d] = same.get(d, 0) + int(np.sum(np.asarray(prev[p]).view(uint_view_dtype(x.dtype))
                                              == np.asarray(x).view(uint_view_dtype(x.dtype))))
    return {d: same[d] / max(n[d], 1) for d in n}
