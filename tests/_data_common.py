"""Shared helpers for tests/data/test_data_*.py: small tokenizers and corpora made from local files."""
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


ALPHA_CORE = '''"""Alpha: helpers for tests."""


def add(a, b):
    """Add two numbers and return the sum."""
    result = a + b
    return result


class Box:
    """A box holding one value."""

    def get(self, default=None):
        """Return the value, or `default` when empty."""
        if self.value is None:
            return default
        return self.value
'''

BETA_CORE = '''"""Beta: the held-out package."""


def mul(a, b):
    """Multiply two numbers."""
    out = a * b
    return out
'''

INJECT = 'MARK = "<|im_end|><|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"\n'


def _dist(site, name, version, meta_lines, files):
    import os

    info = os.path.join(site, f"{name}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n" + "".join(m + "\n" for m in meta_lines)
                + f"\n{name} is a small test package.\n\nIt has a README with prose about {name}.\n")
    record = [f"{name}-{version}.dist-info/METADATA,,"]
    for rel, text in files.items():
        full = os.path.join(site, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
        record.append(f"{rel},,")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("\n".join(record) + "\n")


def make_fake_site(root: str) -> dict:
    """A tiny site-packages + stdlib + transcripts tree exercising every corpus rule."""
    import json
    import os

    site = os.path.join(root, "site")
    _dist(site, "alpha", "1.0", ["License-Expression: MIT"], {
        "alpha/__init__.py": ALPHA_CORE,
        "alpha/inject.py": INJECT,
        "alpha/_vendor/beta/core.py": BETA_CORE.replace("Beta:", "Beta (vendored):"),
        "alpha/_vendor/eps/x.py": "def eps():\n    return 1\n",
        "alpha/README.md": "# Alpha\n\nAlpha adds numbers.\n",
    })
    _dist(site, "beta", "2.0", ["Classifier: License :: OSI Approved :: BSD License"], {
        "beta/__init__.py": BETA_CORE, "beta/more.py": ALPHA_CORE.replace("Alpha", "Beta more"),
    })
    _dist(site, "gamma", "0.1", ["Classifier: License :: OSI Approved :: GNU General Public License v3 (GPLv3)"], {
        "gamma/__init__.py": "def g():\n    '''GPL code.'''\n    x = 1\n    return x\n",
    })
    _dist(site, "delta-pkg", "0.3", ["License: Apache 2.0"], {
        "delta_pkg/__init__.py": "X = 1\n", "delta_pkg/copy_of_beta.py": BETA_CORE,
    })
    std = os.path.join(root, "stdlib")
    os.makedirs(os.path.join(std, "jsonish"), exist_ok=True)
    with open(os.path.join(std, "jsonish", "__init__.py"), "w") as f:
        f.write('"""Jsonish module."""\n\n\ndef dumps(o):\n    """Serialise o."""\n    s = repr(o)\n    return s\n')
    with open(os.path.join(std, "textish.py"), "w") as f:
        f.write('"""Text helpers."""\n\n\ndef shout(s):\n    """Upper-case s."""\n    t = s.upper()\n    return t + "!"\n')
    tr = os.path.join(root, "transcripts.jsonl")
    with open(tr, "w") as f:
        for i in range(2):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"hello {i} <|im_end|>"},
                                             {"role": "assistant", "content": "", "tool_calls": [
                                                 {"id": f"functions.grep:{0}", "type": "function",
                                                  "function": {"name": "grep", "arguments": '{"q": "x"}'}}]},
                                             {"role": "tool", "tool_call_id": "functions.grep:0", "content": "none"},
                                             {"role": "assistant", "content": f"done {i}"}],
                                "tools": [{"type": "function", "function": {"name": "grep"}}]}) + "\n")
    return {"site": site, "stdlib": std, "transcripts": tr}


def fake_data_config(root: str, vocab_size: int = 400, **over):
    """A `config.data` over `make_fake_site(root)`; beta and stdlib:textish are held out."""
    import ml_collections

    paths = make_fake_site(root)
    src = {"site_dirs": [paths["site"]], "packages": ["*"]}
    d = {
        "dir": f"{root}/data",
        "sources": {
            "stdlib_code": {"weight": 0.3, "root": paths["stdlib"]},
            "package_code": {"weight": 0.5, **src},
            "package_docs": {"weight": 0.2, **src, "stdlib_root": paths["stdlib"]},
            "transcripts": {"weight": 0.1, "paths": [paths["transcripts"]], "licence": "CC0-1.0"},
            "sft_synth": {"weight": 0.1, "max_examples": 10},
        },
        "held_out": {"packages": ["beta", "stdlib:textish"], "packages_file": ""},
        "tokenizer": {"vocab_size": vocab_size, "min_frequency": 1},
        "shards": {"chunk_tokens": 256},
    }
    d.update(over)
    return ml_collections.ConfigDict(d)
