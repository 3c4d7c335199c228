"""XOR-of-bits deltas, the record format and the codec (c2jax/sync/deltas.py, records.py, codec.py)."""
from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest

from c2jax.sync import deltas
from c2jax.sync.codec import apply_record, encode_version
from c2jax.sync.errors import BaseMismatchError, CorruptRecordError, StaleRecordError, TreeMismatchError
from c2jax.sync.records import decode_record, encode_record, parse_name, record_name

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16, np.float64, np.int32, np.int8, np.uint8, np.bool_,
          ml_dtypes.float8_e4m3fn]


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes()


def _random(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Arbitrary bit patterns of `dtype` (NaNs, infinities, -0.0 included)."""
    itemsize = np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * itemsize, dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw = raw & 1
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_xor_roundtrip_is_bit_exact_for_every_dtype(dtype):
    rng = np.random.default_rng(0)
    prev, cur = _random(rng, (5, 7), dtype), _random(rng, (5, 7), dtype)
    cur.reshape(-1)[:10] = prev.reshape(-1)[:10]  # some identical elements
    d = deltas.xor_bits(prev, cur)
    assert d.dtype == deltas.uint_view_dtype(np.dtype(dtype)) and d.shape == (35,)
    back = deltas.apply_xor_bits(prev, d)
    assert back.dtype == np.dtype(dtype) and back.shape == cur.shape
    assert _bits(back) == _bits(cur)
    # zeros of the delta are exactly the bit-identical elements (brute force)
    u = deltas.uint_view_dtype(np.dtype(dtype))
    same = int(np.sum(prev.reshape(-1).view(u) == cur.reshape(-1).view(u)))
    assert deltas.count_identical(d) == same >= 10


def test_special_float_values_survive_where_subtraction_would_not():
    prev = np.array([0.0, 1.0, np.inf, 3.0], np.float32)
    cur = np.array([-0.0, np.nan, np.inf, 3.0], np.float32)
    back = deltas.apply_xor_bits(prev, deltas.xor_bits(prev, cur))
    assert _bits(back) == _bits(cur)
    # control: an arithmetic delta loses -0.0 and NaN
    with np.errstate(invalid="ignore"):
        assert _bits(prev + (cur - prev)) != _bits(cur)


def test_unsupported_dtype_and_tree_are_rejected():
    with pytest.raises(TreeMismatchError, match="cannot be published"):
        deltas.uint_view_dtype(np.dtype(np.complex128))  # 16 bytes
    with pytest.raises(TreeMismatchError, match="not an array"):
        deltas.flatten_tree({"a": np.zeros(2), "b": 3.0})
    with pytest.raises(TreeMismatchError, match="no array leaves"):
        deltas.flatten_tree({})
    with pytest.raises(TreeMismatchError, match="apply_xor_bits"):
        deltas.apply_xor_bits(np.zeros(4, np.float32), np.zeros(3, np.uint32))


def test_flatten_unflatten_roundtrip_dicts_lists_and_like():
    tree = {"b": [np.zeros(2), np.ones(3)], "a": {"x": np.arange(4)}}
    flat = deltas.flatten_tree(tree)
    assert list(flat) == [("a", "x"), ("b", 0), ("b", 1)]
    back = deltas.unflatten_tree(flat)
    assert isinstance(back["b"], list) and np.array_equal(back["a"]["x"], tree["a"]["x"])
    like = {"b": (np.zeros(2), np.zeros(3)), "a": {"x": np.zeros(4)}}
    back2 = deltas.unflatten_tree(flat, like=like)
    assert isinstance(back2["b"], tuple)
    with pytest.raises(TreeMismatchError, match="does not match `like`"):
        deltas.unflatten_tree(flat, like={"a": {"x": np.zeros(4)}})


def test_record_names_roundtrip():
    assert parse_name(record_name(42, "full")).kind == "full"
    r = parse_name(record_name(43, "delta", 42))
    assert (r.version, r.kind, r.base_version) == (43, "delta", 42)
    assert parse_name("notes.txt") is None and parse_name(".tmp-abc") is None
    with pytest.raises(ValueError):
        record_name(3, "delta")


def test_record_checksum_catches_any_flipped_byte():
    data = encode_record({"version": 1, "kind": "full", "digest": "0", "leaves": []}, b"payload")
    decode_record(data)  # control: intact record decodes
    for i in (0, 9, 45, len(data) - 1):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecordError):
            decode_record(bytes(bad))
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_record(data[:20])
    with pytest.raises(CorruptRecordError, match="checksum"):
        decode_record(data[:-1])


def _flat(rng, scale: float = 1.0) -> dict:
    return {("w",): (rng.standard_normal((16, 8)) * scale).astype(np.float32),
            ("h",): rng.standard_normal((8,)).astype(ml_dtypes.bfloat16),
            ("i",): rng.integers(0, 9, (3,)).astype(np.int32)}


def test_codec_full_then_delta_rebuilds_bit_exact_and_counts_identical():
    rng = np.random.default_rng(1)
    a = _flat(rng)
    b = {k: v.copy() for k, v in a.items()}
    b[("w",)][:4] += 1.0  # 32 of 128 f32 elements change
    rec_a, st_a, held_a = encode_version(a, 1, None)
    rec_b, st_b, held_b = encode_version(b, 2, held_a)
    assert st_a.kind == "full" and st_a.identical is None and st_a.raw_bytes == sum(x.nbytes for x in a.values())
    assert st_b.kind == "delta" and st_b.base_version == 1
    assert st_b.identical_share == deltas.changed_share_by_dtype(a, b)
    assert st_b.identical_share["float32"] == pytest.approx(96 / 128) and st_b.identical_share["bfloat16"] == 1.0
    assert st_b.stored_bytes < st_a.stored_bytes
    r1 = apply_record(rec_a, None)
    r2 = apply_record(rec_b, r1)
    assert r2.version == 2 and r2.digest == held_b.digest
    for k in b:
        assert _bits(r2.flat[k]) == _bits(b[k]) and not r2.flat[k].flags.writeable
        assert hashlib.sha256(_bits(r2.flat[k])).hexdigest() == deltas.leaf_sha256(b[k])


def test_codec_rejects_wrong_base_stale_and_forged_labels():
    rng = np.random.default_rng(2)
    a, other = _flat(rng), _flat(rng)
    b = {k: v.copy() for k, v in a.items()}
    b[("w",)] *= 2
    rec_a, _, held_a = encode_version(a, 1, None)
    rec_b, _, _ = encode_version(b, 2, held_a)
    rec_o, _, held_o = encode_version(other, 1, None)  # another run's version 1
    assert apply_record(rec_b, apply_record(rec_a, None)).version == 2  # control
    with pytest.raises(BaseMismatchError, match="holds version None"):
        apply_record(rec_b, None)
    with pytest.raises(BaseMismatchError, match="base digest differs") as e:
        apply_record(rec_b, apply_record(rec_o, None))
    assert (e.value.version, e.value.base_version, e.value.held_version) == (2, 1, 1)
    with pytest.raises(StaleRecordError) as e2:
        apply_record(rec_a, apply_record(rec_b, apply_record(rec_a, None)))
    assert (e2.value.version, e2.value.held_version) == (1, 2)
    # Forged labels: re-encode the delta with the other run's base digest and a valid checksum. The
    # label checks pass; the per-leaf sha256 of the rebuilt weights does not.
    h, payload = decode_record(rec_b)
    forged = encode_record(dict(h, base_digest=held_o.digest), bytes(payload))
    wrong = deltas.apply_xor_bits(other[("w",)], deltas.xor_bits(a[("w",)], b[("w",)]))
    assert _bits(wrong) != _bits(b[("w",)])  # control: blindly applied, the weights would be wrong
    with pytest.raises(CorruptRecordError, match="sha256 mismatch"):
        apply_record(forged, held_o)


def test_codec_refuses_a_delta_between_different_trees():
    rng = np.random.default_rng(3)
    a = _flat(rng)
    _, _, held = encode_version(a, 1, None)
    b = dict(a)
    b[("w",)] = np.zeros((16, 9), np.float32)
    with pytest.raises(TreeMismatchError, match="changed"):
        encode_version(b, 2, held)


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_byteplanes_roundtrip(itemsize):
    b = np.random.default_rng(itemsize).integers(0, 256, 12 * itemsize, dtype=np.uint8)
    planes = deltas.to_byteplanes(b, itemsize)
    assert planes.shape == b.shape and np.array_equal(deltas.from_byteplanes(planes, itemsize), b)
    if itemsize > 1:
        assert np.array_equal(planes[:12], b.reshape(12, itemsize)[:, 0])  # plane 0 = byte 0 of every element


def test_byteplanes_filter_rebuilds_the_same_weights_and_shrinks_low_bit_deltas():
    rng = np.random.default_rng(5)
    w = rng.standard_normal(4096).astype(ml_dtypes.bfloat16)
    u = w.view(np.uint16).copy()
    moved = rng.random(u.size) < 0.1
    u[moved] ^= rng.integers(1, 4, int(moved.sum())).astype(np.uint16)  # last mantissa bits flip (an lr-sized step)
    a, b = {("w",): w}, {("w",): u.view(ml_dtypes.bfloat16)}
    sizes = {}
    for planes in (False, True):
        rec_a, _, held = encode_version(a, 1, None, byteplanes=planes)
        rec_b, st, _ = encode_version(b, 2, held, byteplanes=planes)
        got = apply_record(rec_b, apply_record(rec_a, None))
        assert _bits(got.flat[("w",)]) == _bits(b[("w",)])
        assert decode_record(rec_b)[0]["filter"] == ("byteplanes" if planes else "none")
        sizes[planes] = st.stored_bytes
    assert sizes[True] < sizes[False]
    h, payload = decode_record(rec_b)
    with pytest.raises(CorruptRecordError, match="unknown filter"):
        apply_record(encode_record(dict(h, filter="rot13"), bytes(payload)), held)


def test_parallel_encode_and_decode_give_the_same_record_and_weights():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(9)
    a = {(f"w{i}",): rng.standard_normal((64, 32)).astype(np.float32) for i in range(12)}
    b = {k: (v + (rng.random(v.shape) < 0.2) * 1e-3).astype(np.float32) for k, v in a.items()}
    rec_a, _, held = encode_version(a, 1, None)
    serial, st_s, _ = encode_version(b, 2, held)
    with ThreadPoolExecutor(4) as pool:
        parallel, st_p, _ = encode_version(b, 2, held, executor=pool)
        got = apply_record(parallel, apply_record(rec_a, None, executor=pool), executor=pool)
    h_s, h_p = decode_record(serial)[0], decode_record(parallel)[0]
    assert h_s["leaves"] == h_p["leaves"] and st_s.identical == st_p.identical
    assert all(_bits(got.flat[k]) == _bits(b[k]) for k in b)
