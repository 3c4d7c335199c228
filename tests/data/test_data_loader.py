"""Loader: deterministic, exact resume, segments never cross documents, mix weights, host sharding."""
import numpy as np
import pytest

from _data_common import numbered_docs, write_token_split
from c2jax.data.loader import DataError, Loader, eval_batches
from c2jax.data.shards import ShardReader

S, B = 16, 8


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("split") / "train")
    docs = numbered_docs(40, 0, start=100, seed=1) + numbered_docs(30, 1, start=300, seed=2, chat=True)
    write_token_split(d, docs)
    return ShardReader(d)


def make(reader, **kw):
    args = dict(seq_len=S, batch_size=B, weights={"code": 0.75, "chat": 0.25}, seed=3)
    args.update(kw)
    return Loader(reader, **args)


def take(loader, n):
    return [loader.next_batch() for _ in range(n)]


def same(b1, b2):
    return all(np.array_equal(b1[k], b2[k]) for k in b1)


def test_shapes_and_determinism(reader):
    a, b = take(make(reader), 6), take(make(reader), 6)
    assert all(same(x, y) for x, y in zip(a, b))
    x = a[0]
    for k in ("inputs", "targets", "segment_ids", "positions", "loss_mask"):
        assert x[k].shape == (B, S), k
    assert x["source_ids"].shape == (B,)
    assert x["loss_mask"].dtype == np.float32 and x["inputs"].dtype == np.int32
    c = take(make(reader, seed=4), 6)
    assert not all(same(x, y) for x, y in zip(a, c))


def test_exact_resume_and_state_at(reader):
    ref = take(make(reader), 12)
    l1 = make(reader)
    take(l1, 5)
    st = l1.state()
    l2 = make(reader)
    l2.restore(st)
    assert all(same(x, y) for x, y in zip(ref[5:], take(l2, 7)))
    rebuilt = make(reader).state_at(5)
    assert all(np.array_equal(rebuilt[k], st[k]) for k in st)
    l3 = make(reader)
    l3.seek(9)
    assert same(l3.next_batch(), ref[9])
    with pytest.raises(DataError, match="different data build"):
        make(reader, seq_len=S * 2).restore(st)


def check_segments(batch):
    inp, tgt, seg, pos, lm = (batch[k] for k in ("inputs", "targets", "segment_ids", "positions", "loss_mask"))
    for r in range(inp.shape[0]):
        for sid in np.unique(seg[r]):
            idx = np.nonzero(seg[r] == sid)[0]
            if sid == 0:
                assert np.all(lm[r, idx] == 0)
                continue
            assert np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx)))  # contiguous
            assert np.array_equal(pos[r, idx], np.arange(len(idx)))           # positions restart
            body = inp[r, idx][inp[r, idx] != 2]
            assert len(set(body.tolist())) <= 1                                # one document
            if np.any(inp[r, idx] == 2):
                assert inp[r, idx[-1]] == 2 and np.sum(inp[r, idx] == 2) == 1  # eos ends the segment
        # A trained target always continues the input's document.
        for t in np.nonzero(lm[r])[0]:
            assert tgt[r, t] == 2 or tgt[r, t] == inp[r, t]


def test_segments_never_cross_documents(reader):
    for b in take(make(reader), 10):
        check_segments(b)


def test_stream_epoch_covers_every_target_once(reader):
    code = reader.sources[reader.source_index["code"]]
    loader = make(reader, batch_size=1, weights={"code": 1.0})
    w = loader.windows[0].count
    trained = sum(float(b["loss_mask"].sum()) for b in take(loader, w))
    lens = np.diff(reader.doc_offsets[code.doc_lo:code.doc_hi + 1])
    assert trained == float(np.sum(lens - 1))


def test_whole_packing_keeps_chat_documents_and_masks(reader):
    loader = make(reader, weights={"chat": 1.0})
    for b in take(loader, 4):
        check_segments(b)
        for r in range(B):
            for sid in np.unique(b["segment_ids"][r]):
                if sid == 0:
                    continue
                idx = np.nonzero(b["segment_ids"][r] == sid)[0]
                doc = b["inputs"][r, idx[0]] - 300
                n = int(reader.doc_offsets[40 + doc + 1] - reader.doc_offsets[40 + doc])
                if idx[-1] < S - 1:
                    assert len(idx) == n  # the whole conversation, not split
                else:  # the row's last document: its final token may sit at position S (targets only)
                    assert len(idx) in (min(n, S + 1), min(n, S + 1) - 1)
                # Targets trained only in the "assistant" half (mask from the shard), never on eos.
                m = b["loss_mask"][r, idx]
                assert m[: (n // 2) - 1].sum() == 0


def test_mix_weights_and_host_sharding(reader):
    loader = make(reader, batch_size=64)
    src = np.concatenate([b["source_ids"] for b in take(loader, 30)])
    frac = np.mean(src == reader.source_index["chat"])
    assert abs(frac - 0.25) < 3 * np.sqrt(0.25 * 0.75 / len(src))
    full = take(make(reader), 3)
    parts = [take(make(reader, process_index=p, process_count=4), 3) for p in range(4)]
    for t in range(3):
        for k in full[t]:
            assert np.array_equal(np.concatenate([parts[p][t][k] for p in range(4)]), full[t][k])


def test_bad_mixes_fail_clearly(reader, tmp_path):
    with pytest.raises(DataError, match="does not hold"):
        make(reader, weights={"nope": 1.0})
    with pytest.raises(DataError, match="no source with a positive weight"):
        make(reader, weights={"code": 0.0})
    with pytest.raises(DataError, match="not divisible"):
        make(reader, process_count=3)
    d = str(tmp_path / "t")
    write_token_split(d, numbered_docs(5, 0))
    with pytest.raises(DataError, match="no documents"):
        Loader(ShardReader(d), seq_len=S, batch_size=2, weights={"code": 1, "chat": 1})


def test_eval_batches_cover_source_in_order(reader):
    batches = list(eval_batches(reader, "code", seq_len=S, batch_size=4))
    code = reader.sources[reader.source_index["code"]]
    lens = np.diff(reader.doc_offsets[code.doc_lo:code.doc_hi + 1])
    assert sum(float(b["loss_mask"].sum()) for b in batches) == float(np.sum(lens - 1))
    for b in batches:
        check_segments(b)
    assert len(list(eval_batches(reader, "code", seq_len=S, batch_size=4, max_batches=2))) == 2
