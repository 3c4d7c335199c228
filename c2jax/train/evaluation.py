"""Evaluation during training: held-out loss per source, the codebase-perplexity probe, and the
bigram baseline the quickstart is judged against.

* Held-out loss: every held-out source's stride-S windows (`c2jax.data.loader.eval_batches`, the
  split by package means these are codebases never trained on), masked mean NLL per source.
  ``held_out_loss`` (the number a stage is judged by) is the token-weighted mean over the code
  sources (names ending in ``_code``), or over all text sources when there are none.
* Codebase probe (as in the report): the files of each held-out package concatenated into one
  stream, scored with a rolling window of S tokens moving S/2 at a time; each token is scored once,
  with at least S/2 tokens of the same codebase as context (the first window scores all).
* Bigram baseline: add-alpha-interpolated bigram model fitted on the training split's tokens
  (with the same loss mask), scored on exactly the held-out targets the model is scored on;
  alpha is chosen on the held-out data itself, so the baseline is as strong as a bigram gets.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

EvalFn = Callable[[Any, Mapping[str, Any]], "tuple[Any, Any]"]
MODEL_KEYS = ("tokens", "targets", "loss_mask", "segment_ids", "positions")


def to_model_batch(b: Mapping[str, np.ndarray]) -> dict:
    """Loader batch (``inputs``, ``targets``, ...) -> the train/eval step's batch (``tokens``, ...)."""
    out = {"tokens": b["inputs"] if "inputs" in b else b["tokens"]}
    for k in ("targets", "loss_mask", "segment_ids", "positions"):
        out[k] = b[k]
    return {k: jnp.asarray(v) for k, v in out.items()}


def code_sources(names: Iterable[str]) -> list[str]:
    names = list(names)
    code = [n for n in names if n.endswith("_code")]
    return code or names


def spread_eval_batches(reader: Any, source: str, *, seq_len: int, batch_size: int,
                        max_batches: Optional[int] = None, pad_id: int = 0) -> Iterable[dict]:
    """Held-out batches of one source: stride-S windows (as `c2jax.data.loader.eval_batches`), but
    when capped to ``max_batches`` the windows are spread evenly over the whole source instead of
    taken from its start (a shard's first files, e.g. a package's ``_data_table.py`` modules, are
    not a fair sample of a codebase). Deterministic; the last batch is padded with masked rows."""
    from c2jax.data.loader import eval_batches, pack_rows

    if max_batches is None:
        yield from eval_batches(reader, source, seq_len=seq_len, batch_size=batch_size, pad_id=pad_id)
        return
    i = reader.source_index[source]
    s = reader.sources[i]
    if s.n_tokens < 2:
        return
    S = int(seq_len)
    starts = np.arange(s.tok_lo, max(s.tok_lo + 1, s.tok_hi - 1), S)
    n = min(len(starts), int(max_batches) * int(batch_size))
    pick = starts[np.unique(np.linspace(0, len(starts) - 1, n).round().astype(np.int64))]
    for j in range(0, len(pick), batch_size):
        chunk = pick[j:j + batch_size]
        rows = [[(int(a), int(min(s.tok_hi, a + S + 1)), True)] for a in chunk]
        rows += [[] for _ in range(batch_size - len(rows))]
        yield pack_rows(reader, rows, S, pad_id, np.full(batch_size, i, np.int32))


def held_out_losses(params: Any, eval_fn: EvalFn, reader: Any, sources: Sequence[str], *, seq_len: int,
                    batch_size: int, max_batches: Optional[int] = None, pad_id: int = 0) -> dict[str, float]:
    """``{'held_out/<source>': loss, 'held_out_tokens/<source>': n, 'held_out_loss': code mean}``."""
    out: dict[str, float] = {}
    tot: dict[str, tuple[float, float]] = {}
    for src in sources:
        s_sum, s_n = 0.0, 0.0
        for b in spread_eval_batches(reader, src, seq_len=seq_len, batch_size=batch_size,
                                     max_batches=max_batches, pad_id=pad_id):
            s, n = eval_fn(params, to_model_batch(b))
            s_sum += float(s)
            s_n += float(n)
        if s_n > 0:
            out[f"held_out/{src}"] = s_sum / s_n
            out[f"held_out_tokens/{src}"] = s_n
            tot[src] = (s_sum, s_n)
    primary = [s for s in code_sources(tot) if s in tot]
    num = sum(tot[s][0] for s in primary)
    den = sum(tot[s][1] for s in primary)
    out["held_out_loss"] = num / den if den else float("nan")
    return out


def rolling_windows(stream: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rolling-window rows over one token stream: (inputs [n, W], targets [n, W], score mask [n, W]).

    Window j starts at j*W/2; it scores targets from W/2 on (all of them in the first window), so
    every target of the stream is scored exactly once.
    """
    W = int(window)
    half = max(W // 2, 1)
    n_t = len(stream) - 1  # number of (input, target) pairs
    rows_in, rows_tg, rows_m = [], [], []
    start = 0
    scored_to = 0  # targets [0, scored_to) already scored
    while scored_to < n_t:
        a = start
        b = min(a + W, n_t)
        inp = np.zeros(W, np.int64)
        tgt = np.zeros(W, np.int64)
        m = np.zeros(W, np.float32)
        inp[:b - a] = stream[a:b]
        tgt[:b - a] = stream[a + 1:b + 1]
        m[max(scored_to - a, 0):b - a] = 1.0
        rows_in.append(inp)
        rows_tg.append(tgt)
        rows_m.append(m)
        scored_to = b
        start += half if start + W < n_t else W
    return np.stack(rows_in), np.stack(rows_tg), np.stack(rows_m)


def codebase_probe(params: Any, eval_fn: EvalFn, reader: Any, *, sources: Optional[Sequence[str]], seq_len: int,
                   batch_size: int, packages: Optional[Sequence[str]] = None, max_packages: int = 4,
                   max_tokens: int = 8192) -> dict[str, float]:
    """NLL per token of held-out codebases, rolling window of ``seq_len`` (see module docstring).

    A codebase = one package's documents of one code source, concatenated in shard order; at most
    ``max_tokens`` tokens are scored, taken from the middle of the stream (the first files of a
    package are often generated tables). ``probe/<source>/<package>`` per codebase and
    ``probe_nll`` over all scored tokens.
    """
    pkgs = list(packages) if packages is not None else list(reader.packages)
    srcs = list(sources) if sources is not None else [None]
    out: dict[str, float] = {}
    tot_s, tot_n = 0.0, 0.0
    used = 0
    for src in srcs:
        for pkg in pkgs:
            if used >= max_packages:
                break
            try:
                stream = reader.package_tokens(pkg, src)
            except Exception:  # noqa: BLE001 - a package without documents of this source
                continue
            if len(stream) < 2:
                continue
            lo = max((len(stream) - (max_tokens + 1)) // 2, 0)
            stream = np.asarray(stream[lo:lo + max_tokens + 1], np.int64)
            inp, tgt, m = rolling_windows(stream, seq_len)
            s_sum, s_n = 0.0, 0.0
            for j in range(0, len(inp), batch_size):
                bi, bt, bm = inp[j:j + batch_size], tgt[j:j + batch_size], m[j:j + batch_size]
                pad = batch_size - len(bi)
                if pad:
                    bi, bt = np.pad(bi, ((0, pad), (0, 0))), np.pad(bt, ((0, pad), (0, 0)))
                    bm = np.pad(bm, ((0, pad), (0, 0)))
                batch = {"tokens": jnp.asarray(bi, jnp.int32), "targets": jnp.asarray(bt, jnp.int32),
                         "loss_mask": jnp.asarray(bm), "segment_ids": jnp.ones(bi.shape, jnp.int32),
                         "positions": jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), bi.shape)}
                s, n = eval_fn(params, batch)
                s_sum += float(s)
                s_n += float(n)
            if s_n:
                out[f"probe/{src}/{pkg}" if src else f"probe/{pkg}"] = s_sum / s_n
                tot_s += s_sum
                tot_n += s_n
                used += 1
    out["probe_nll"] = tot_s / tot_n if tot_n else float("nan")
    out["probe_tokens"] = tot_n
    return out


# ---- bigram baseline -----------------------------------------------------------------------------

def bigram_counts(reader: Any, vocab_size: int, sources: Optional[Sequence[str]] = None) -> np.ndarray:
    """[V, V] float64 counts of (token, next token) pairs inside documents of the given sources,
    only where the next token is a training target (the shard's loss mask)."""
    V = int(vocab_size)
    counts = np.zeros(V * V, np.float64)
    names = list(sources) if sources is not None else [s.name for s in reader.sources]
    for name in names:
        if name not in reader.source_index:
            continue
        s = reader.sources[reader.source_index[name]]
        if s.n_tokens < 2:
            continue
        tok = reader.read_spans([(s.tok_lo, s.tok_hi)], "tokens")[0].astype(np.int64)
        mask = reader.read_spans([(s.tok_lo, s.tok_hi)], "loss_mask")[0].astype(bool)
        off = reader.doc_offsets[s.doc_lo:s.doc_hi + 1] - s.tok_lo
        ok = np.ones(len(tok) - 1, bool)
        ends = off[1:-1] - 1  # last token of each doc (except the final one) -> next doc's first token
        ok[ends[(ends >= 0) & (ends < len(ok))]] = False
        ok &= mask[1:]
        counts += np.bincount(tok[:-1][ok] * V + tok[1:][ok], minlength=V * V)
    return counts.reshape(V, V)


def bigram_nll(counts: np.ndarray, pairs: np.ndarray, alpha: float) -> float:
    """Mean NLL of (prev, next) ``pairs`` [N, 2] under the add-alpha interpolated bigram:
    p(b | a) = (c(a, b) + alpha * p_uni(b)) / (c(a) + alpha), p_uni add-one smoothed."""
    V = counts.shape[0]
    uni = (counts.sum(0) + 1.0) / (counts.sum() + V)
    row = counts.sum(1)
    a, b = pairs[:, 0], pairs[:, 1]
    p = (counts[a, b] + alpha * uni[b]) / (row[a] + alpha)
    return float(-np.mean(np.log(p)))


def held_out_pairs(reader: Any, sources: Sequence[str], *, seq_len: int, batch_size: int,
                   max_batches: Optional[int] = None) -> np.ndarray:
    """The (input, target) pairs the held-out loss scores (same windows and mask), [N, 2]."""
    out = []
    for src in sources:
        for b in spread_eval_batches(reader, src, seq_len=seq_len, batch_size=batch_size,
                                     max_batches=max_batches):
            m = b["loss_mask"] > 0
            out.append(np.stack([b["inputs"][m], b["targets"][m]], -1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 2), np.int64)


def bigram_baseline(train_reader: Any, held_reader: Any, vocab_size: int, *, seq_len: int, batch_size: int,
                    max_batches: Optional[int] = None, train_sources: Optional[Sequence[str]] = None,
                    held_sources: Optional[Sequence[str]] = None) -> dict[str, float]:
    """Bigram held-out NLL on the code sources (what ``held_out_loss`` measures) and per source."""
    counts = bigram_counts(train_reader, vocab_size, train_sources)
    held_sources = list(held_sources) if held_sources is not None else code_sources(
        [s.name for s in held_reader.sources if s.kind == "text" and s.n_tokens > 1])
    pairs = held_out_pairs(held_reader, held_sources, seq_len=seq_len, batch_size=batch_size,
                           max_batches=max_batches)
    if not len(pairs):
        return {"bigram_held_out_loss": float("nan")}
    best = min(((bigram_nll(counts, pairs, a), a) for a in (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)))
    uni = (counts.sum(0) + 1.0) / (counts.sum() + counts.shape[0])
    return {"bigram_held_out_loss": best[0], "bigram_alpha": best[1],
            "unigram_held_out_loss": float(-np.mean(np.log(uni[pairs[:, 1]]))),
            "baseline_tokens": int(len(pairs)), "baseline_sources": held_sources}
