"""Evaluation helpers: rolling-window probe coverage, spread held-out windows, bigram baseline vs
brute force (small split stores written by tests/_data_common.py)."""
import numpy as np
import pytest

from _data_common import numbered_docs, write_token_split
from c2jax.data.shards import ShardReader
from c2jax.train import evaluation as E


@pytest.mark.parametrize("n,W", [(2, 8), (9, 8), (37, 8), (100, 16), (17, 16)])
def test_rolling_windows_score_every_target_once_with_half_window_context(n, W):
    stream = np.arange(1000, 1000 + n)
    inp, tgt, m = E.rolling_windows(stream, W)
    assert sorted(tgt[m > 0].tolist()) == stream[1:].tolist()
    for j in range(len(inp)):
        idx = np.nonzero(m[j])[0]
        np.testing.assert_array_equal(tgt[j, idx] - 1, inp[j, idx])  # target follows its input
        if j:
            assert idx.min() >= W // 2 - 1


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("evalsplit") / "train")
    rng = np.random.default_rng(0)
    docs = []
    for k in range(30):
        n = int(rng.integers(5, 60))
        ids = rng.integers(3, 40, n)
        ids[-1] = 2
        mask = np.ones(n, np.uint8)
        mask[: n // 5] = 0  # some tokens are not targets
        docs.append((ids, mask, 0, k % 2))
    docs += numbered_docs(5, source=1, start=50, package=0)
    write_token_split(d, docs, sources=(("a_code", "text"), ("b", "text")), packages=("p0", "p1"))
    return ShardReader(d), docs


def test_bigram_counts_match_bruteforce_within_documents_and_mask(split):
    reader, docs = split
    V = 64
    counts = E.bigram_counts(reader, V, ["a_code"])
    want = np.zeros((V, V))
    for ids, mask, src, _ in docs:
        if src != 0:
            continue
        for i in range(len(ids) - 1):
            if mask[i + 1]:
                want[ids[i], ids[i + 1]] += 1
    np.testing.assert_array_equal(counts, want)
    pairs = np.array([[3, 4], [5, 6], [39, 2]])
    uni = (want.sum(0) + 1) / (want.sum() + V)
    p = [(want[a, b] + 10 * uni[b]) / (want[a].sum() + 10) for a, b in pairs]
    assert E.bigram_nll(counts, pairs, 10.0) == pytest.approx(-np.mean(np.log(p)))


def test_spread_eval_batches_cover_the_source_evenly(split):
    reader, _ = split
    s = reader.sources[reader.source_index["a_code"]]
    S = 8
    all_rows = sum(int((b["loss_mask"].sum(1) > 0).sum()) for b in E.spread_eval_batches(reader, "a_code", seq_len=S, batch_size=4))
    capped = list(E.spread_eval_batches(reader, "a_code", seq_len=S, batch_size=4, max_batches=2))
    assert len(capped) == 2 and all_rows > 8
    first = capped[0]["inputs"][0]
    last_rows = [r for r in capped[-1]["inputs"] if r.any()]
    tok = reader.read_spans([(s.tok_lo, s.tok_hi)])[0]
    np.testing.assert_array_equal(first, tok[:S])  # starts at the beginning ...
    last = last_rows[-1]
    n_windows = len(range(s.tok_lo, s.tok_hi - 1, S))
    lo = (n_windows - 1) * S
    np.testing.assert_array_equal(last[: len(tok[lo:lo + S])], tok[lo:lo + S])  # ... and ends at the end
