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
