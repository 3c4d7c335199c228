"""Shards: round trip, resume after a crash, corrupt or incomplete stores are refused clearly."""
import glob
import json
import os

import numpy as np
import pytest

from _data_common import numbered_docs, write_token_split
from c2jax.data.shards import ShardError, ShardReader, ShardWriter


def docs():
    return numbered_docs(25, 0, seed=5) + numbered_docs(10, 1, start=300, seed=6, chat=True)


def test_round_trip(tmp_path):
    d = str(tmp_path / "s")
    ds = docs()
    meta = write_token_split(d, ds)
    r = ShardReader(d, verify="deep")
    assert r.n_docs == len(ds) and r.n_tokens == sum(len(x[0]) for x in ds) == meta["n_tokens"]
    for i, x in enumerate(ds):
        assert np.array_equal(r.doc_tokens(i), x[0])
    code, chat = r.sources
    assert (code.name, code.kind, code.n_docs, chat.name, chat.kind, chat.n_docs) == ("code", "text", 25, "chat", "chat", 10)
    assert np.array_equal(r.package_tokens("pkg", "chat"), np.concatenate([x[0] for x in ds[25:]]))
    assert not os.path.exists(os.path.join(d, "progress.json"))
    # Tensorstore reads (not in memory) agree with the in-memory copy.
    r2 = ShardReader(d, verify="none", in_memory=False)
    assert np.array_equal(r2.read_spans([(5, 50)])[0], r.read_spans([(5, 50)])[0])


def test_resume_after_crash_matches_uninterrupted(tmp_path):
    ds = docs()
    ref = write_token_split(str(tmp_path / "ref"), ds)
    d = str(tmp_path / "crash")
    n_tok = sum(len(x[0]) for x in ds)
    w = ShardWriter(d, key="test", n_docs=len(ds), max_tokens=n_tok + 10, token_dtype="uint16", chunk_tokens=64)
    for j in range(0, 12, 3):
        part = ds[j:j + 3]
        w.write_batch([x[0] for x in part], [x[1] for x in part], [x[2] for x in part], [x[3] for x in part])
    # "Crash": garbage written past the committed point must not matter.
    w.arrays["tokens"][w.tokens_done:w.tokens_done + 20].write(np.full(20, 999, np.uint16)).result()
    del w
    with pytest.raises(ShardError, match="unfinished build"):
        ShardReader(d)
    w2 = ShardWriter(d, key="test", n_docs=len(ds), max_tokens=n_tok + 10, token_dtype="uint16", chunk_tokens=64)
    assert w2.docs_done == 12
    for j in range(12, len(ds), 3):
        part = ds[j:j + 3]
        w2.write_batch([x[0] for x in part], [x[1] for x in part], [x[2] for x in part], [x[3] for x in part])
    meta = w2.finalize({"manifest_hash": "test"}, [("code", "text"), ("chat", "chat")], ["pkg"])
    assert meta["digests"] == ref["digests"]
    ShardReader(d, verify="deep")
    # A writer with a different key starts over instead of resuming.
    w3 = ShardWriter(str(tmp_path / "crash2"), key="other", n_docs=len(ds), max_tokens=n_tok, token_dtype="uint16")
    assert w3.docs_done == 0


def test_corrupt_shards_are_refused(tmp_path):
    d = str(tmp_path / "s")
    write_token_split(d, docs(), chunk=64)
    # Flip bytes inside a token chunk (raw bytes are zstd-compressed: either decode fails or digest differs).
    chunk = sorted(glob.glob(os.path.join(d, "tokens", "c", "*")))[1]
    raw = bytearray(open(chunk, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(chunk, "wb").write(bytes(raw))
    with pytest.raises(ShardError, match="tokens"):
        ShardReader(d, verify="deep")
    d2 = str(tmp_path / "s2")
    write_token_split(d2, docs())
    meta = json.load(open(os.path.join(d2, "meta.json")))
    meta["n_tokens"] += 5
    json.dump(meta, open(os.path.join(d2, "meta.json"), "w"))
    with pytest.raises(ShardError, match="meta.json says"):
        ShardReader(d2)
    open(os.path.join(d2, "meta.json"), "w").write("{")
    with pytest.raises(ShardError, match="unreadable meta.json"):
        ShardReader(d2)
    os.remove(os.path.join(d2, "meta.json"))
    with pytest.raises(ShardError, match="meta.json missing"):
        ShardReader(d2)
    d3 = str(tmp_path / "s3")
    write_token_split(d3, docs())
    open(os.path.join(d3, "doc_offsets", "zarr.json"), "w").write("garbage")
    with pytest.raises(ShardError, match="cannot open arrays"):
        ShardReader(d3)
