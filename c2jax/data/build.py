"""The data pipeline: corpus -> tokenizer -> shards, content-addressed, idempotent and resumable.

    built = build(config.data)            # or: python -m c2jax.data build --config CONFIG.py
    tok = built.tokenizer()
    train = built.reader("train")         # ShardReader, verified
    loader = built.loader(seq_len=256, batch_size=8, seed=0)

Every artefact lives under ``data.dir`` in a directory named by the hash of what it depends on:

    corpus/<manifest_hash[:16]>/           manifest.json, train.jsonl, heldout.jsonl
    tokenizer/<tok_key[:16]>/tokenizer.json   trained on the train split (key: manifest + settings)
    shards/<shard_key[:16]>/{train,heldout}/  tensorstore stores (key: manifest + tokenizer + format)

A second `build` with the same config finds everything and returns at once (the corpus is
re-listed to compute its hash, reading only the capped files). A build killed midway resumes:
finished stages are found by their hash, and the shard writer continues from its last committed
batch. `BuiltData.save(path)` pins the exact artefacts of a run (a resumed run reloads them with
`BuiltData.load(path)` instead of re-listing the installed packages, which may have changed).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from c2jax.atomic import atomic_write_json
from c2jax.data import tokenizer as T
from c2jax.data.chat_format import ChatFormat, Message
from c2jax.data.corpus import SPLITS, Corpus, CorpusError, build_corpus, cfg_get, source_order
from c2jax.data.shards import FORMAT_VERSION, ShardError, ShardReader, ShardWriter, read_meta
from c2jax.data.documents import Document

TOKENIZER_FORMAT = 1
BATCH_DOCS = 512  # documents tokenised and committed per shard batch (the resume granularity)
BATCH_BYTES = 8 << 20


@dataclass
class BuiltData:
    """Paths and hashes of a built dataset; JSON-serialisable (`save`/`load`) to pin a run's data."""

    root: str
    corpus_dir: str
    manifest_hash: str
    tokenizer_path: str
    shards_dir: str
    shard_key: str
    vocab_size: int
    sources: list[str]
    source_kinds: dict[str, str]
    tokens: dict[str, dict[str, int]]  # split -> source -> token count
    default_weights: dict | None = None  # data.sources.<name>.weight at build time
    default_packing: dict | None = None  # data.packing at build time

    def tokenizer(self) -> T.Tokenizer:
        return T.Tokenizer.load(self.tokenizer_path)

    def reader(self, split: str = "train", verify: str = "auto") -> ShardReader:
        return ShardReader(os.path.join(self.shards_dir, split), verify=verify)

    def loader(self, *, seq_len: int, batch_size: int, seed: int = 0, weights: dict | None = None,
               split: str = "train", packing: dict | None = None, process_index: int | None = None,
               process_count: int | None = None, reader: ShardReader | None = None):
        """A `Loader` over `split`; weights default to the ones recorded at build time."""
        from c2jax.data.loader import Loader

        if process_index is None or process_count is None:
            process_index, process_count = _process_info()
        return Loader(reader or self.reader(split), seq_len=seq_len, batch_size=batch_size,
                      weights=weights if weights is not None else self.default_weights, seed=seed,
                      packing=packing if packing is not None else self.default_packing,
                      process_index=process_index, process_count=process_count,
                      pad_id=T.ALL_SPECIAL_TOKENS.index(T.PAD))

    def save(self, path: str) -> str:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return atomic_write_json(path, asdict(self), indent=1, sort_keys=True)

    @classmethod
    def load(cls, path: str) -> "BuiltData":
        with open(path) as f:
            d = json.load(f)
        b = cls(**d)
        for p in (b.tokenizer_path, os.path.join(b.shards_dir, "train", "meta.json")):
            if not os.path.exists(p):
                raise ShardError(f"pinned data {path} refers to {p}, which no longer exists; rebuild with "
                                 f"`python -m c2jax.data build` and start a new run")
        return b


def _process_info() -> tuple[int, int]:
    try:
        import jax

        return jax.process_index(), jax.process_count()
    except Exception:  # jax not initialised or not installed: single process
        return 0, 1


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def mix_weights(data_cfg: Any) -> dict[str, float]:
    return {n: float(cfg_get(s, "weight", 0.0)) for n, s in cfg_get(data_cfg, "sources", {}).items()}


# ---- tokenizer -----------------------------------------------------------------------------------
def chat_texts(doc: Document) -> list[str]:
    """The strings of a chat document that the tokenizer will see as text."""
    obj = json.loads(doc.text)
    out = []
    for m in obj["messages"]:
        out.append(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c)
            a = fn.get("arguments", "")
            out.append(a if isinstance(a, str) else json.dumps(a, ensure_ascii=False))
    if obj.get("tools"):
        out.append(json.dumps(obj["tools"], ensure_ascii=False))
    return out


def tokenizer_texts(corpus: Corpus, max_bytes: int) -> Iterator[str]:
    """Training texts for the tokenizer: the train split, all sources, up to `max_bytes`."""
    used = 0
    for d in corpus.documents("train"):
        for t in ([d.text] if d.kind == "text" else chat_texts(d)):
            if used >= max_bytes:
                return
            used += len(t.encode())
            yield t


def build_tokenizer(corpus: Corpus, data_cfg: Any, root: str, progress: bool = False) -> str:
    tcfg = cfg_get(data_cfg, "tokenizer", {})
    given = cfg_get(tcfg, "path", "")
    if given:
        T.Tokenizer.load(given)  # validates the specials layout
        return os.path.abspath(given) if not os.path.isdir(given) else os.path.join(os.path.abspath(given), "tokenizer.json")
    vocab = int(cfg_get(tcfg, "vocab_size", 4096))
    train_bytes = int(cfg_get(tcfg, "train_bytes", 50_000_000))
    min_freq = int(cfg_get(tcfg, "min_frequency", 2))
    key = _key("tokenizer", TOKENIZER_FORMAT, corpus.manifest_hash, vocab, train_bytes, min_freq)
    path = os.path.join(root, "tokenizer", key[:16], "tokenizer.json")
    if os.path.exists(path):
        return path
    tok = T.train_tokenizer(tokenizer_texts(corpus, train_bytes), vocab_size=vocab, min_frequency=min_freq,
                            show_progress=progress)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tok.save(path)
    return path


# ---- shards --------------------------------------------------------------------------------------
def tokenize_docs(docs: list[Document], tok: T.Tokenizer, fmt: ChatFormat) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token ids (+ eos) and loss masks of documents: text with specials disabled, chat via the template."""
    ids_out: list[np.ndarray] = [None] * len(docs)  # type: ignore[list-item]
    mask_out: list[np.ndarray] = [None] * len(docs)  # type: ignore[list-item]
    text_idx = [i for i, d in enumerate(docs) if d.kind == "text"]
    for i, ids in zip(text_idx, tok.encode_batch([docs[i].text for i in text_idx])):
        ids_out[i] = np.asarray(ids + [tok.eos_id], np.int64)
        mask_out[i] = np.ones(len(ids) + 1, np.uint8)
    for i, d in enumerate(docs):
        if d.kind == "chat":
            obj = json.loads(d.text)
            r = fmt.render([Message.from_openai(m) if isinstance(m, dict) else m for m in obj["messages"]],
                           tools=obj.get("tools") or None)
            ids_out[i] = np.concatenate([r.ids.astype(np.int64), [tok.eos_id]])
            mask_out[i] = np.concatenate([r.loss_mask, [0]]).astype(np.uint8)
        elif d.kind != "text":
            raise ShardError(f"document {d.path}: unknown kind {d.kind!r}")
    return ids_out, mask_out


def _batches(docs: Iterable[Document], max_docs: int, max_bytes: int) -> Iterator[list[Document]]:
    cur, size = [], 0
    for d in docs:
        cur.append(d)
        size += len(d.text)
        if len(cur) >= max_docs or size >= max_bytes:
            yield cur
            cur, size = [], 0
    if cur:
        yield cur


def build_split(corpus: Corpus, split: str, tok: T.Tokenizer, out_dir: str, key: str, sources: list[str],
                kinds: dict[str, str], chunk_tokens: int, compression: str, progress: bool) -> dict:
    """Tokenise one split into `out_dir` (resuming a crashed build); returns its meta."""
    if os.path.exists(os.path.join(out_dir, "meta.json")):
        try:
            meta = read_meta(out_dir)
            if meta.get("key") == key:
                ShardReader(out_dir, verify="auto", in_memory=False)  # a damaged store is rebuilt
                return meta
        except ShardError as e:
            aside = f"{out_dir}.corrupt-{int(time.time())}"
            os.replace(out_dir, aside)  # keep the damaged store for inspection; build a fresh one
            warnings.warn(f"{e}; moved it to {aside} and rebuilding", stacklevel=2)
    recs = corpus.manifest["documents"][split]
    n_docs = len(recs)
    max_tokens = sum(r["bytes"] + 16 for r in recs) + 1
    writer = ShardWriter(out_dir, key=key, n_docs=n_docs, max_tokens=max_tokens,
                         token_dtype=str(T.token_dtype(tok.vocab_size)), chunk_tokens=chunk_tokens,
                         compression=compression)
    src_id = {n: i for i, n in enumerate(sources)}
    packages = sorted({r["package"] for r in recs})
    pkg_id = {p: i for i, p in enumerate(packages)}
    fmt = ChatFormat(tok)
    from tqdm.auto import tqdm

    bar = tqdm(total=n_docs, initial=writer.docs_done, desc=f"shards {split}", unit="doc", disable=not progress,
               file=sys.stderr)
    done = writer.docs_done
    docs_iter = (d for j, d in enumerate(corpus.documents(split)) if j >= done)
    for batch in _batches(docs_iter, BATCH_DOCS, BATCH_BYTES):
        ids, masks = tokenize_docs(batch, tok, fmt)
        writer.write_batch(ids, masks, [src_id[d.source] for d in batch], [pkg_id[d.package] for d in batch])
        bar.update(len(batch))
    bar.close()
    return writer.finalize({"split": split, "manifest_hash": corpus.manifest_hash,
                            "tokenizer_fingerprint": tok.fingerprint(), "vocab_size": tok.vocab_size},
                           [(n, kinds[n]) for n in sources], packages)


def build(data_cfg: Any, root: str | None = None, progress: bool = True) -> BuiltData:
    """Build (or find) corpus, tokenizer and shards for ``config.data``; see the module docstring."""
    root = os.path.abspath(root or cfg_get(data_cfg, "dir", "runs/data"))
    os.makedirs(root, exist_ok=True)
    corpus = build_corpus(data_cfg, root, progress=progress)
    weights = mix_weights(data_cfg)
    sources = source_order(data_cfg)
    for n in sources:
        if weights.get(n, 0) > 0 and corpus.manifest["sources"][n]["train"]["docs"] == 0:
            raise CorpusError(
                f"data.sources.{n} has weight {weights[n]} but produced no training documents "
                f"(drops so far: {corpus.manifest['dropped']}); check its packages/paths or set its weight to 0")
    tok_path = build_tokenizer(corpus, data_cfg, root, progress)
    tok = T.Tokenizer.load(tok_path)
    scfg = cfg_get(data_cfg, "shards", {})
    chunk = int(cfg_get(scfg, "chunk_tokens", 65536))
    comp = cfg_get(scfg, "compression", "zstd")
    key = _key("shards", FORMAT_VERSION, corpus.manifest_hash, tok.fingerprint(), chunk, comp)
    shards_dir = os.path.join(root, "shards", key[:16])
    kinds = dict(corpus.manifest["source_kinds"])
    tokens: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        meta = build_split(corpus, split, tok, os.path.join(shards_dir, split), key, sources, kinds, chunk, comp,
                           progress)
        tokens[split] = {s["name"]: s["tok_hi"] - s["tok_lo"] for s in meta["sources"]}
    return BuiltData(root=root, corpus_dir=corpus.dir, manifest_hash=corpus.manifest_hash, tokenizer_path=tok_path,
                     shards_dir=shards_dir, shard_key=key, vocab_size=tok.vocab_size, sources=sources,
                     source_kinds=kinds, tokens=tokens, default_weights=weights,
                     default_packing={str(k): str(v) for k, v in dict(cfg_get(data_cfg, "packing", {})).items()})
