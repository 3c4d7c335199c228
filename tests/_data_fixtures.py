"""Shared helpers for tests/test_data_*.py: small tokenizers and corpora made from local files."""
from __future__ import annotations

import functools
import glob
import os
import sysconfig

STDLIB = sysconfig.get_paths()["stdlib"]


def stdlib_texts(pattern: str = "json/*.py", limit: int = 20) -> list[str]:
    files = sorted(glob.glob(os.path.join(STDLIB, pattern)))[:limit]
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out.append(fh.read())
    return out


@functools.lru_cache(maxsize=None)
def small_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE trained on a few stdlib modules (well under a second)."""
    from c2jax.data.tokenizer import train_tokenizer

    texts = stdlib_texts("json/*.py") + stdlib_texts("email/*.py", 8)
    return train_tokenizer(texts, vocab_size=vocab_size)


def write_token_split(split_dir: str, docs, sources=(("code", "text"), ("chat", "chat")), packages=("pkg",),
                      key: str = "test", batch: int = 3, chunk: int = 64):
    """Write a split store from `docs` = [(ids, mask, source_idx, package_idx)] (grouped by source)."""
    import numpy as np
    from c2jax.data.shards import ShardWriter

    n_tok = sum(len(d[0]) for d in docs)
    w = ShardWriter(split_dir, key=key, n_docs=len(docs), max_tokens=n_tok + 10, token_dtype="uint16",
                    chunk_tokens=chunk)
    for j in range(0, len(docs), batch):
        part = docs[j:j + batch]
        w.write_batch([np.asarray(d[0]) for d in part], [np.asarray(d[1], np.uint8) for d in part],
                      [d[2] for d in part], [d[3] for d in part])
    return w.finalize({"manifest_hash": key}, list(sources), list(packages))


def numbered_docs(n_docs: int, source: int, start: int = 100, min_len: int = 3, max_len: int = 40, seed: int = 0,
                  package: int = 0, chat: bool = False):
    """Docs whose tokens encode (doc number, position) so tests can check packing: token = start + doc."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for d in range(n_docs):
        n = int(rng.integers(min_len, max_len + 1))
        ids = np.full(n, start + d, np.int64)
        ids[-1] = 2  # eos
        mask = np.ones(n, np.uint8)
        if chat:
            mask[: n // 2] = 0  # "prompt" half
            mask[-1] = 0
        out.append((ids, mask, source, package))
    return out
