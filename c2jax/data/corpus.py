"""Corpus assembly: sources -> licence filter -> held-out split by package -> dedup -> caps -> manifest.

    corpus = build_corpus(config.data, root="runs/data")    # -> Corpus(dir, manifest_hash, ...)

Rules, in order, for every candidate of every source named in ``data.sources``:
1. licence: the package's licence expression must be permissive under ``data.licences``
   (default `licences.PERMISSIVE`); otherwise dropped (``licence:<expr>`` in the manifest's counts);
2. files larger than ``data.max_file_bytes`` are dropped (generated tables, data blobs);
3. split: a package matching ``data.held_out.packages`` (names or globs, PEP 503 normalised) or a
   name exported by the tasks engineer in ``data.held_out.packages_file`` (.txt one per line,
   .json list or {"packages": [...]}, .jsonl task records with ``source.package``) is held out;
4. exact duplicates (sha256 of the text) are removed, and a held-out document always wins: a
   training copy of a held-out file (e.g. vendored, or the same module shipped twice), or text
   derived from one (its docstrings, SFT examples made from it), is dropped. Vendored directories
   are attributed to the vendored package (`sources.vendored_package`), and dropped entirely
   unless ``data.vendored = 'attribute'``;
5. caps: ``max_bytes`` (train) and ``held_out_max_bytes`` per source, filled in a deterministic
   hash order of paths so a capped corpus still samples many packages.
Derived sources (``sft_synth``) then run on the accepted documents and pass rules 1-5.
Accepted documents stream to spool files (held-out first, so they claim their hashes before any
training document is considered); memory holds hashes and small indexes, never the corpus.

Output (content-addressed, written atomically, skipped when already present):
``<root>/corpus/<manifest_hash[:16]>/{manifest.json, train.jsonl, heldout.jsonl}``; documents are
grouped by source (config order) so each source is one contiguous range of the shards. The manifest
lists every document (source, package, path relative to its root, licence, sha256, bytes, split)
plus drop counts and per-source totals; its sha256 (`manifest_hash`) keys the tokenizer and shards
and is recorded with each run.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from c2jax.config import cfg_get
from c2jax.data import licences
from c2jax.data.pins import check_pins
from c2jax.data.sources import (SOURCES, Candidate, Document, SourceContext, matches_any,
                                normalize_package)

CORPUS_FORMAT = 1
SPLITS = ("train", "heldout")


class CorpusError(ValueError):
    """The corpus cannot be built as configured (unknown source, empty source, bad held-out file)."""


def _to_plain(x: Any) -> Any:
    if hasattr(x, "to_dict"):
        x = x.to_dict()
    if isinstance(x, dict):
        return {str(k): _to_plain(v) for k, v in sorted(x.items())}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


def read_held_out_file(path: str) -> list[str]:
    """Package names from an exported held-out list (.txt, .json or task .jsonl)."""
    if not os.path.exists(path):
        raise CorpusError(f"data.held_out.packages_file: {path} does not exist")
    names: list[str] = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith(".jsonl"):
            for n, line in enumerate(text.splitlines()):
                if line.strip():
                    rec = json.loads(line)
                    src = rec.get("source") if isinstance(rec.get("source"), dict) else {}
                    name = src.get("package") or rec.get("package") or src.get("codebase") or rec.get("codebase")
                    if not name:
                        raise CorpusError(f"{path}:{n + 1}: task record has no source.package")
                    names.append(name)
        elif path.endswith(".json"):
            obj = json.loads(text)
            obj = obj.get("packages", obj.get("held_out", [])) if isinstance(obj, dict) else obj
            if not isinstance(obj, list):
                raise CorpusError(f"{path}: expected a JSON list of package names or {{'packages': [...]}}")
            names = [str(x) for x in obj]
        else:
            names = [ln.split("#")[0].strip() for ln in text.splitlines() if ln.split("#")[0].strip()]
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}: not valid JSON ({e})") from None
    return sorted({normalize_package(n) for n in names})


def held_out_patterns(data_cfg: Any) -> list[str]:
    ho = cfg_get(data_cfg, "held_out", {})
    pats = [normalize_package(p) for p in cfg_get(ho, "packages", [])]
    f = cfg_get(ho, "packages_file", "")
    if f:
        pats += read_held_out_file(f)
    return sorted(set(pats))


def source_order(data_cfg: Any) -> list[str]:
    """Source names in build order: plain sources in config order, then derived ones."""
    names = list(cfg_get(data_cfg, "sources", {}).keys())
    for n in names:
        if n not in SOURCES:
            raise CorpusError(f"data.sources: unknown source {n!r}; known: {SOURCES.names()}")
    return [n for n in names if not SOURCES.get(n).derived] + [n for n in names if SOURCES.get(n).derived]


@dataclass
class Corpus:
    """A built corpus: its directory, manifest and hash."""

    dir: str
    manifest_hash: str
    manifest: dict

    def documents(self, split: str) -> Iterable[Document]:
        with open(os.path.join(self.dir, f"{split}.jsonl"), encoding="utf-8") as f:
            for line in f:
                yield Document.from_record(json.loads(line))

    @classmethod
    def load(cls, path: str) -> "Corpus":
        mpath = os.path.join(path, "manifest.json")
        if not os.path.exists(mpath):
            raise CorpusError(f"corpus {path}: manifest.json missing (rerun `python -m c2jax.data build`)")
        with open(mpath) as f:
            m = json.load(f)
        return cls(path, m["hash"], m)


def corpus_config(data_cfg: Any) -> dict:
    """The part of ``config.data`` that determines the corpus (hashed into the manifest)."""
    keys = ("sources", "held_out", "licences", "max_file_bytes", "vendored", "pins")
    d = {k: _to_plain(cfg_get(data_cfg, k)) for k in keys}
    # Mix weights do not change the corpus, only how the loader samples it.
    for s in (d.get("sources") or {}).values():
        if isinstance(s, dict):
            s.pop("weight", None)
    return d


def manifest_digest(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class _Spool:
    """Accepted documents of one (source, split), appended to a JSONL file with a small index
    (package, path, offset, length), so the corpus is never held in memory."""

    def __init__(self, path: str):
        self.path = path
        self.f = open(path, "w+b")
        self.index: list[tuple[str, str, int, int]] = []

    def add(self, doc: Document) -> None:
        line = (json.dumps(doc.record(), ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        self.f.seek(0, 2)
        self.index.append((doc.package, doc.path, self.f.tell(), len(line)))
        self.f.write(line)

    def documents(self) -> Iterator[Document]:
        self.f.flush()
        with open(self.path, "rb") as g:
            for line in g:
                yield Document.from_record(json.loads(line))

    def sorted_lines(self) -> Iterator[bytes]:
        """Records ordered by (package, path)."""
        self.f.flush()
        for _, _, off, n in sorted(self.index):
            self.f.seek(off)
            yield self.f.read(n)

    def close(self) -> None:
        self.f.close()


@dataclass
class Collected:
    """Result of `collect`: per (source, split) spools, drop counts, held-out patterns."""

    names: list[str]
    spools: dict[tuple[str, str], _Spool]
    dropped: Counter
    held: list[str]

    def documents(self, split: str) -> Iterator[Document]:
        for name in self.names:
            yield from self.spools[(name, split)].documents()

    def close(self) -> None:
        for sp in self.spools.values():
            sp.close()


def collect(data_cfg: Any, spool_dir: str, progress: bool = True) -> Collected:
    """Run every source and apply the rules, streaming accepted documents to `spool_dir`.

    Held-out documents of all plain sources are taken first (they claim their hashes), then the
    training documents, then derived sources (SFT synthesis) reading the accepted documents back.
    """
    allowed = list(cfg_get(data_cfg, "licences", licences.PERMISSIVE))
    max_file = int(cfg_get(data_cfg, "max_file_bytes", 200_000))
    vendored = cfg_get(data_cfg, "vendored", "drop")
    if vendored not in ("drop", "attribute"):
        raise CorpusError(f"data.vendored must be 'drop' or 'attribute', got {vendored!r}")
    held = held_out_patterns(data_cfg)
    ctx = SourceContext(max_file_bytes=max_file, vendored=vendored)
    names = source_order(data_cfg)
    os.makedirs(spool_dir, exist_ok=True)
    spools = {(n, sp): _Spool(os.path.join(spool_dir, f"{n}.{sp}.jsonl")) for n in names for sp in SPLITS}
    col = Collected(names, spools, ctx.dropped, held)
    ctx.documents = lambda name: itertools.chain(spools[(name, "train")].documents(),
                                                 spools[(name, "heldout")].documents())
    state = _DedupState()
    bar = _bar(len(names), progress, "corpus sources")
    plain = [n for n in names if not SOURCES.get(n).derived]
    listed = {n: _list_candidates(n, data_cfg, ctx, allowed, max_file, held) for n in plain}
    for split in ("heldout", "train"):
        for n in plain:
            _take(n, listed[n][split], split, data_cfg, ctx, state, spools)
            if split == "train":
                bar.update(1)
    del listed
    for n in names:
        if SOURCES.get(n).derived:
            scfg = cfg_get(data_cfg, "sources")[n]
            try:
                items = SOURCES.get(n).list_fn(scfg, ctx)
                by_split = ((d, _split_of(d, held, allowed, max_file, ctx.dropped)) for d in items)
                _take(n, ((d, sp) for d, sp in by_split if sp is not None), None, data_cfg, ctx, state, spools)
            except (OSError, ValueError) as e:
                raise CorpusError(f"data.sources.{n}: {e}") from e
            bar.update(1)
    bar.close()
    return col


@dataclass
class _DedupState:
    seen: set = field(default_factory=set)  # sha256 of every accepted document
    held_hashes: set = field(default_factory=set)  # held-out documents and the files they derive from


def _split_of(c: Any, held: list[str], allowed: list[str], max_file: int, dropped: Counter) -> str | None:
    """'train' / 'heldout' for a candidate or derived document, or None (dropped, counted)."""
    if not licences.is_permissive(c.licence, allowed):
        dropped[f"licence:{c.licence}"] += 1
        return None
    if c.vendored_in is not None and matches_any(c.package, held):
        dropped["vendored copy of a held-out package"] += 1
        return None
    size = len(c.text.encode("utf-8", "surrogatepass")) if isinstance(c, Document) else c.size
    if size > max_file:
        dropped["larger than max_file_bytes"] += 1
        return None
    return "heldout" if matches_any(c.package, held) else "train"


def _list_candidates(name: str, data_cfg: Any, ctx: SourceContext, allowed: list[str], max_file: int,
                     held: list[str]) -> dict[str, list[Candidate]]:
    """A plain source's candidates by split, in a deterministic hash order of (package, path)."""
    scfg = cfg_get(data_cfg, "sources")[name]
    try:
        items = list(SOURCES.get(name).list_fn(scfg, ctx))
    except (OSError, ValueError) as e:
        raise CorpusError(f"data.sources.{name}: {e}") from e
    items.sort(key=lambda c: hashlib.sha256(f"{c.package}/{c.path}".encode()).hexdigest())
    out: dict[str, list[Candidate]] = {sp: [] for sp in SPLITS}
    for c in items:
        sp = _split_of(c, held, allowed, max_file, ctx.dropped)
        if sp is not None:
            out[sp].append(c)
    return out


def _take(name: str, items: Iterable[Any], split: str | None, data_cfg: Any, ctx: SourceContext,
          state: _DedupState, spools: dict) -> None:
    """Load, cap and dedup `items` (candidates of `split`, or (document, split) pairs) into spools."""
    scfg = cfg_get(data_cfg, "sources")[name]
    caps = {"train": int(cfg_get(scfg, "max_bytes", 1 << 62)),
            "heldout": int(cfg_get(scfg, "held_out_max_bytes", cfg_get(scfg, "max_bytes", 1 << 62)))}
    used = {"train": 0, "heldout": 0}
    dropped = ctx.dropped
    for it in items:
        c, sp = (it, split) if split is not None else it
        if used[sp] >= caps[sp]:
            dropped[f"cap:{sp}"] += 1
            continue
        d = c if isinstance(c, Document) else _load(c)
        if d is None:
            dropped["unreadable, not UTF-8, or nothing to extract"] += 1
            continue
        if sp == "train" and (d.sha256 in state.held_hashes or d.origin_sha256 in state.held_hashes):
            dropped["duplicate of (or derived from) a held-out document"] += 1
            continue
        if d.sha256 in state.seen:
            dropped["exact duplicate"] += 1
            continue
        state.seen.add(d.sha256)
        if sp == "heldout":
            state.held_hashes.update(h for h in (d.sha256, d.origin_sha256) if h)
        d.split = sp
        used[sp] += len(d.text.encode("utf-8", "surrogatepass"))
        spools[(name, sp)].add(d)


def collect_documents(data_cfg: Any, progress: bool = False) -> tuple[dict[str, list[Document]], Counter, list[str]]:
    """`collect` into a temporary directory, materialised as lists (for inspection and tests)."""
    with tempfile.TemporaryDirectory() as tmp:
        col = collect(data_cfg, tmp, progress)
        try:
            out = {sp: sorted(col.documents(sp), key=lambda d: (col.names.index(d.source), d.package, d.path))
                   for sp in SPLITS}
        finally:
            col.close()
    return out, col.dropped, col.held


def _load(c: Candidate) -> Document | None:
    got = c.load()
    text, origin = (got if isinstance(got, tuple) else (got, None))
    if text is None or not text.strip():
        return None
    return Document(text, c.source, c.package, c.path, c.licence, kind=c.kind, vendored_in=c.vendored_in,
                    origin_sha256=origin)


def _bar(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)


def build_corpus(data_cfg: Any, root: str, progress: bool = True) -> Corpus:
    """Collect, filter, split and dedup the corpus; write it content-addressed under `root`.

    Raises `pins.CorpusPinError` first (nothing read or written) if ``data.pins`` differs from
    the installed sources."""
    check_pins(cfg_get(data_cfg, "pins", None))
    base = os.path.join(root, "corpus")
    os.makedirs(base, exist_ok=True)
    tmp = os.path.join(base, f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        col = collect(data_cfg, os.path.join(tmp, "spool"), progress)
        names = col.names
        totals = {n: {s: {"docs": 0, "bytes": 0} for s in SPLITS} for n in names}
        pkgs = {s: Counter() for s in SPLITS}
        lic: dict[str, str] = {}
        docs_meta: dict[str, list[dict]] = {s: [] for s in SPLITS}
        for split in SPLITS:
            with open(os.path.join(tmp, f"{split}.jsonl"), "wb") as f:
                for n in names:
                    for line in col.spools[(n, split)].sorted_lines():
                        f.write(line)
                        rec = json.loads(line)
                        rec.pop("text")
                        docs_meta[split].append(rec)
                        totals[n][split]["docs"] += 1
                        totals[n][split]["bytes"] += rec["bytes"]
                        pkgs[split][rec["package"]] += 1
                        lic[rec["package"]] = rec["licence"]
        col.close()
        shutil.rmtree(os.path.join(tmp, "spool"), ignore_errors=True)
        manifest = {
            "format": CORPUS_FORMAT,
            "config": corpus_config(data_cfg),
            "python": ".".join(map(str, sys.version_info[:3])),
            "held_out_patterns": col.held,
            "held_out_packages": sorted(pkgs["heldout"]),
            "sources": totals,
            "source_kinds": {n: SOURCES.get(n).kind for n in names},
            "packages": {s: dict(sorted(pkgs[s].items())) for s in SPLITS},
            "licences": dict(sorted(lic.items())),
            "dropped": dict(sorted(col.dropped.items())),
            "documents": docs_meta,
        }
        manifest["hash"] = manifest_digest(manifest)
        out = os.path.join(base, manifest["hash"][:16])
        if os.path.exists(os.path.join(out, "manifest.json")):
            return Corpus.load(out)
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True, ensure_ascii=False)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        return Corpus(out, manifest["hash"], manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
