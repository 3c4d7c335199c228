"""Validator of the ``data`` config section, and the pre-training checks of built data.

Layout of ``config.data`` (every key optional unless marked):

    dir              root of the content-addressed artefacts (default 'runs/data')
    sources          (required) {name: {weight, max_bytes, held_out_max_bytes, ...source options}}
                     names from `sources.SOURCES`; at least one weight > 0
    licences         allowed SPDX ids (default `licences.PERMISSIVE`)
    held_out         {packages: [names or globs], packages_file: exported list (.txt/.json/.jsonl)}
    max_file_bytes   larger files are dropped (default 200000)
    vendored         'drop' (default) | 'attribute'
    tokenizer        {vocab_size (default 4096), train_bytes, min_frequency, path (use this file)}
    shards           {chunk_tokens (65536), compression ('zstd' | 'raw')}
    packing          {source: 'stream' | 'whole'} (default: chat sources 'whole', others 'stream')
    seq_len, batch_size   optional loader settings; seq_len is checked against the model positions

`validate_data` runs inside `c2jax.config.validate` (before any compute). The `check_*` functions
are for the training loop after `build`: a tokenizer/model vocabulary mismatch, a sequence length
beyond the model's positions, a corrupt shard or an empty weighted source each raise `DataError`
with a message saying what to change, before the first step and without touching any output.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from c2jax.config import Checker, cfg_get, register_validator
from c2jax.data.loader import DataError

COPYLEFT_PREFIXES = ("GPL", "LGPL", "AGPL", "MPL", "EPL", "CDDL", "EUPL", "OSL", "CC-BY-SA")


def _items(x: Any) -> list[tuple[str, Any]]:
    if x is None:
        return []
    if hasattr(x, "items"):
        return list(x.items())
    return []


@register_validator("data")
def validate_data(check: Checker, data: Any, full: Any) -> None:
    from c2jax.data.sources import SOURCES
    from c2jax.data.synth import KINDS
    from c2jax.data.tokenizer import MIN_VOCAB

    sources = check.value(data, "sources")
    entries = _items(sources)
    if sources is not None and not entries:
        check.error("sources", "must name at least one source, e.g. {'stdlib_code': {'weight': 1.0}}")
    total = 0.0
    for name, scfg in entries:
        if name not in SOURCES:
            check.error(f"sources.{name}", f"unknown source; known: {SOURCES.names()}")
            continue
        if scfg is None or not hasattr(scfg, "keys"):
            check.error(f"sources.{name}", "must be a dict with at least 'weight'")
            continue
        w = _sub(check, f"sources.{name}", lambda c: c.float_range(scfg, "weight", 0.0, None))
        if w is None:
            continue
        total += w
        for k in ("max_bytes", "held_out_max_bytes"):
            v = cfg_get(scfg, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                check.error(f"sources.{name}.{k}", f"must be an integer >= 0, got {v!r}")
        if name == "transcripts":
            paths = list(cfg_get(scfg, "paths", []) or [])
            if w > 0 and not paths:
                check.error(f"sources.{name}.paths", "source has a positive weight but no transcript files "
                            "(missing or empty source)")
            for p in paths:
                if not os.path.exists(p):
                    check.error(f"sources.{name}.paths", f"{p} does not exist")
                elif os.path.getsize(p) == 0:
                    check.error(f"sources.{name}.paths", f"{p} is empty")
        if name == "sft_synth":
            for k in list(cfg_get(scfg, "kinds", []) or []):
                if k not in KINDS:
                    check.error(f"sources.{name}.kinds", f"unknown kind {k!r}; known: {list(KINDS)}")
            for s in list(cfg_get(scfg, "from_sources", ["stdlib_code", "package_code"]) or []):
                if s not in dict(entries):
                    check.error(f"sources.{name}.from_sources", f"{s!r} is not among data.sources")
        if name in ("package_code", "package_docs"):
            pk = cfg_get(scfg, "packages", ["*"])
            if isinstance(pk, str) or not list(pk):
                check.error(f"sources.{name}.packages", f"must be a non-empty list of names or globs, got {pk!r}")
    if entries and total <= 0:
        check.error("sources", "no source has a positive weight")
    lic = cfg_get(data, "licences")
    if lic is not None:
        lic = list(lic)
        if not lic or not all(isinstance(x, str) for x in lic):
            check.error("licences", f"must be a non-empty list of SPDX ids, got {lic!r}")
        for x in lic:
            if isinstance(x, str) and x.upper().startswith(COPYLEFT_PREFIXES):
                check.warn("licences", f"{x} is not a permissive licence")
    ho = cfg_get(data, "held_out")
    if ho is not None:
        f = cfg_get(ho, "packages_file", "")
        if f and not os.path.exists(f):
            check.error("held_out.packages_file", f"{f} does not exist")
        pk = cfg_get(ho, "packages", [])
        if isinstance(pk, str):
            check.error("held_out.packages", f"must be a list of package names, got the string {pk!r}")
        elif not list(pk or []) and not f:
            check.warn("held_out", "no held-out packages: held-out loss will be measured on nothing")
    check.int_range(data, "max_file_bytes", 1, None, optional=True)
    check.choice(data, "vendored", ("drop", "attribute"), optional=True)
    tok = cfg_get(data, "tokenizer")
    vocab = None
    if tok is not None:
        vocab = _sub(check, "tokenizer", lambda c: c.int_range(tok, "vocab_size", MIN_VOCAB, 1 << 24, optional=True))
        path = cfg_get(tok, "path", "")
        if path and not os.path.exists(path):
            check.error("tokenizer.path", f"{path} does not exist")
    sh = cfg_get(data, "shards")
    if sh is not None:
        c = cfg_get(sh, "chunk_tokens")
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 256):
            check.error("shards.chunk_tokens", f"must be an integer >= 256, got {c!r}")
        comp = cfg_get(sh, "compression")
        if comp is not None and comp not in ("zstd", "raw"):
            check.error("shards.compression", f"must be one of ['zstd', 'raw'], got {comp!r}")
    for name, p in _items(cfg_get(data, "packing")):
        if p not in ("stream", "whole"):
            check.error(f"packing.{name}", f"must be 'stream' or 'whole', got {p!r}")
    seq_len = check.int_range(data, "seq_len", 1, None, optional=True)
    check.int_range(data, "batch_size", 1, None, optional=True)
    model = cfg_get(full, "model") if full is not None else None
    if model is not None:
        mv = cfg_get(model, "vocab_size")
        if vocab is not None and isinstance(mv, int) and vocab > mv:
            check.error("tokenizer.vocab_size", f"{vocab} ids do not fit model.vocab_size {mv} "
                        "(set model.vocab_size to the tokenizer's vocab_size)")
        mp = cfg_get(model, "max_position_embeddings")
        if seq_len is not None and isinstance(mp, int) and seq_len > mp:
            check.error("seq_len", f"{seq_len} is beyond the model's positions (model.max_position_embeddings={mp})")


def _sub(check: Checker, key: str, fn):
    """Run `fn` on a Checker prefixed with `data.<key>` and merge its problems into `check`."""
    sub = Checker(f"{check.prefix}.{key}" if check.prefix else key)
    out = fn(sub)
    check.problems.extend(sub.problems)
    check.warnings.extend(sub.warnings)
    return out


# ---- checks the training loop calls after `build` ----------------------------------------------
def check_vocab(tokenizer_vocab_size: int, model_vocab_size: int) -> None:
    """The model must have an embedding row for every tokenizer id."""
    if int(tokenizer_vocab_size) > int(model_vocab_size):
        raise DataError(f"tokenizer/model vocabulary mismatch: the tokenizer has {tokenizer_vocab_size} ids but "
                        f"model.vocab_size is {model_vocab_size}; set model.vocab_size >= {tokenizer_vocab_size}")


def check_seq_len(seq_len: int, max_position_embeddings: int, what: str = "seq_len") -> None:
    """Training sequences must fit the model's positions (YaRN-extended length included)."""
    if int(seq_len) > int(max_position_embeddings):
        raise DataError(f"{what}={seq_len} is beyond the model's positions "
                        f"(max_position_embeddings={max_position_embeddings}); shorten it or extend the model")


def check_built(built: Any, weights: Mapping[str, float] | None = None, verify: str = "auto",
                splits: tuple[str, ...] = ("train", "heldout")) -> dict:
    """Open (and checksum) the shards of `built`; every weighted source must have training tokens.

    Returns ``{split: ShardReader}`` for the loader, so the data are read only once.
    """
    from c2jax.data.shards import ShardError
    from c2jax.data.tokenizer import Tokenizer, TokenizerError

    try:
        tok = Tokenizer.load(built.tokenizer_path)
    except TokenizerError as e:
        raise DataError(str(e)) from e
    readers = {}
    for split in splits:
        try:
            r = built.reader(split, verify=verify)
        except ShardError as e:
            raise DataError(str(e)) from e
        if r.meta.get("tokenizer_fingerprint") != tok.fingerprint():
            raise DataError(f"shard {r.dir} was built with a different tokenizer than {built.tokenizer_path}; "
                            "rebuild with `python -m c2jax.data build`")
        readers[split] = r
    weights = dict(weights if weights is not None else (built.default_weights or {}))
    train = readers.get("train")
    if train is not None:
        for name, w in weights.items():
            if w > 0:
                if name not in train.source_index:
                    raise DataError(f"data mix names source {name!r}, which the shards do not hold "
                                    f"({list(train.source_index)})")
                if train.sources[train.source_index[name]].n_tokens == 0:
                    raise DataError(f"source {name!r} has weight {w} but no training tokens (missing or empty source)")
    return readers


def check_data_ready(built: Any, *, model_vocab_size: int, max_position_embeddings: int, seq_len: int,
                     weights: Mapping[str, float] | None = None, verify: str = "auto") -> dict:
    """All pre-training data checks in one call; returns ``{split: ShardReader}``."""
    check_vocab(built.vocab_size, model_vocab_size)
    check_seq_len(seq_len, max_position_embeddings)
    return check_built(built, weights, verify)
