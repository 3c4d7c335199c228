"""Global sequence packing for RL batches: spread variable-length sequences over data-parallel
ranks so every rank does the same compute, attention's quadratic cost included.

An RL step trains on rollouts whose lengths differ by 100x (a one-line fix vs a long agent
transcript). Packing each rank's rows in arrival order leaves some ranks with far more work than
others, and counting tokens is not enough: a sequence of n tokens costs ``a*n + b*n^2`` (dense
and expert matmuls linear, causal attention quadratic), so one 8k sequence costs more than eight
1k ones. `balance_sequences` assigns sequences to ranks by the longest-processing-time rule
(largest cost first, to the rank with the least cost that still has room), packing each rank's
rows best-fit, then improves it by moves/swaps between the most and least loaded ranks, and
reports the cost per rank; `pack_layout` turns the assignment into the
[ranks * rows, row_len] index / segment / position arrays of a global batch (rank-major, so the
batch sharding over data x fsdp x expert hands rank r exactly its rows).

Costs: `cost_coefficients(cfg)` gives (a, b) in training FLOPs (forward + backward = 3x forward):
a = 6 * active parameters per token, b = 3 * layers * heads * (qk_head + v_head) (causal QK^T and
PV: n^2/2 pairs x 2 FLOPs x 2 matmuls, times 3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


class PackingError(ValueError):
    """The sequences do not fit the global batch (too long, or too many tokens)."""


def cost_coefficients(cfg) -> tuple[float, float]:
    """(linear, quadratic) FLOPs coefficients of one training sequence for model config `cfg`."""
    from c2jax.model.config import count_active_params

    a = cfg.attention
    linear = 6.0 * count_active_params(cfg)
    quad = 3.0 * cfg.num_layers * cfg.num_heads * (a.qk_head_dim + a.v_head_dim)
    return linear, quad


def sequence_cost(lengths, linear: float, quadratic: float) -> np.ndarray:
    n = np.asarray(lengths, np.float64)
    return linear * n + quadratic * n * n


@dataclass
class GlobalPacking:
    """rows[r][j] = sequence indices packed (in order) into row j of rank r; cost[r] its compute."""

    rows: list[list[list[int]]]
    cost: np.ndarray  # [ranks]
    tokens: np.ndarray  # [ranks]

    @property
    def imbalance(self) -> float:
        """max / mean compute over ranks (1.0 = perfect)."""
        return float(self.cost.max() / max(self.cost.mean(), 1e-30))


def balance_sequences(lengths: Sequence[int], n_ranks: int, rows_per_rank: int, row_len: int,
                      linear: float = 1.0, quadratic: float = 0.0) -> GlobalPacking:
    """Assign sequences (``lengths``) to ``n_ranks`` ranks of ``rows_per_rank`` rows of ``row_len``
    tokens, balancing ``linear * n + quadratic * n^2`` per rank (see module docstring)."""
    lengths = np.asarray(lengths, np.int64)
    if (lengths < 1).any():
        raise PackingError("every sequence needs at least one token")
    too_long = np.nonzero(lengths > row_len)[0]
    if too_long.size:
        raise PackingError(f"sequences {too_long.tolist()[:8]} are longer than the row length {row_len}")
    if lengths.sum() > n_ranks * rows_per_rank * row_len:
        raise PackingError(f"{int(lengths.sum())} tokens do not fit {n_ranks} ranks x {rows_per_rank} rows x "
                           f"{row_len}")
    cost = sequence_cost(lengths, linear, quadratic)
    free = np.full((n_ranks, rows_per_rank), row_len, np.int64)  # free tokens per row
    rows: list[list[list[int]]] = [[[] for _ in range(rows_per_rank)] for _ in range(n_ranks)]
    rank_cost = np.zeros(n_ranks)
    rank_tok = np.zeros(n_ranks, np.int64)
    for i in np.lexsort((-lengths, -cost)):  # largest cost first (ties: longer first)
        n = lengths[i]
        for r in np.argsort(rank_cost, kind="stable"):
            fits = np.nonzero(free[r] >= n)[0]
            if fits.size:
                j = fits[np.argmin(free[r][fits])]  # best fit: the fullest row with room
                break
        else:
            raise PackingError(f"sequence {int(i)} ({int(n)} tokens) fits no row: the batch is too full "
                               f"to pack (rows are fragmented); add rows or shorten sequences")
        rows[r][j].append(int(i))
        free[r, j] -= n
        rank_cost[r] += cost[i]
        rank_tok[r] += n
    _refine(rows, free, rank_cost, rank_tok, lengths, cost)
    return GlobalPacking(rows, rank_cost, rank_tok)


def _refine(rows, free, rank_cost, rank_tok, lengths, cost, max_iters: int = 200) -> None:
    """Local search after LPT: move one sequence, or swap two, between the most and the least
    loaded rank while that lowers the larger of the two costs (rows must keep room)."""
    for _ in range(max_iters):
        hi, lo = int(np.argmax(rank_cost)), int(np.argmin(rank_cost))
        gap = rank_cost[hi] - rank_cost[lo]
        if gap <= 0:
            return
        best = None  # (new max of the pair, (hi row, idx), (lo row, idx or None))
        for jh, row_h in enumerate(rows[hi]):
            for a in row_h:
                # move a: hi -> lo
                if 0 < cost[a] < gap:
                    fits = np.nonzero(free[lo] >= lengths[a])[0]
                    if fits.size:
                        new = max(rank_cost[hi] - cost[a], rank_cost[lo] + cost[a])
                        if best is None or new < best[0]:
                            best = (new, (jh, a), (int(fits[np.argmin(free[lo][fits])]), None))
                # swap a <-> b
                for jl, row_l in enumerate(rows[lo]):
                    for b in row_l:
                        d = cost[a] - cost[b]
                        if not 0 < d < gap:
                            continue
                        if free[lo, jl] + lengths[b] < lengths[a] or free[hi, jh] + lengths[a] < lengths[b]:
                            continue
                        new = max(rank_cost[hi] - d, rank_cost[lo] + d)
                        if best is None or new < best[0]:
                            best = (new, (jh, a), (jl, b))
        if best is None or best[0] >= rank_cost[hi] - 1e-12:
            return
        _, (jh, a), (jl, b) = best
        rows[hi][jh].remove(a)
        rows[lo][jl].append(a)
        free[hi, jh] += lengths[a]
        free[lo, jl] -= lengths[a]
        moved_cost, moved_tok = cost[a], lengths[a]
        if b is not None:
            rows[lo][jl].remove(b)
            rows[hi][jh].append(b)
            free[lo, jl] += lengths[b]
            free[hi, jh] -= lengths[b]
            moved_cost, moved_tok = moved_cost - cost[b], moved_tok - lengths[b]
        rank_cost[hi] -= moved_cost
        rank_cost[lo] += moved_cost
        rank_tok[hi] -= moved_tok
        rank_tok[lo] += moved_tok


def pack_layout(packing: GlobalPacking, lengths: Sequence[int], row_len: int) -> dict[str, np.ndarray]:
    """Arrays [ranks * rows, row_len] (rank-major rows) of a packed global batch:
    ``seq_index`` (sequence of each token, -1 = padding), ``token_index`` (position of the token
    within its sequence, -1 = padding), ``segment_ids`` (1.. per row, 0 = padding) and
    ``positions`` (= token_index, 0 at padding). Gather per-token data with them, e.g.
    ``tokens = np.where(seq_index >= 0, flat_tokens[offsets[seq_index] + token_index], pad_id)``."""
    lengths = np.asarray(lengths, np.int64)
    n_ranks, n_rows = len(packing.rows), len(packing.rows[0])
    shape = (n_ranks * n_rows, row_len)
    seq = np.full(shape, -1, np.int32)
    tok = np.full(shape, -1, np.int32)
    segs = np.zeros(shape, np.int32)
    for r, rank_rows in enumerate(packing.rows):
        for j, members in enumerate(rank_rows):
            b, p = r * n_rows + j, 0
            for s_id, i in enumerate(members, start=1):
                n = int(lengths[i])
                seq[b, p:p + n] = i
                tok[b, p:p + n] = np.arange(n)
                segs[b, p:p + n] = s_id
                p += n
    return {"seq_index": seq, "token_index": tok, "segment_ids": segs, "positions": np.maximum(tok, 0)}


def naive_packing(lengths: Sequence[int], n_ranks: int, rows_per_rank: int, row_len: int,
                  linear: float = 1.0, quadratic: float = 0.0) -> Optional[GlobalPacking]:
    """Baseline: first-fit in arrival order over the global rows, rank-major (what per-rank
    packing of a stream of rollouts does). None if it cannot place every sequence."""
    lengths = np.asarray(lengths, np.int64)
    cost = sequence_cost(lengths, linear, quadratic)
    free = np.full(n_ranks * rows_per_rank, row_len, np.int64)
    rows: list[list[list[int]]] = [[[] for _ in range(rows_per_rank)] for _ in range(n_ranks)]
    rc, rt = np.zeros(n_ranks), np.zeros(n_ranks, np.int64)
    for i, n in enumerate(lengths):
        fits = np.nonzero(free >= n)[0]
        if not fits.size:
            return None
        g = int(fits[0])
        r, j = divmod(g, rows_per_rank)
        rows[r][j].append(i)
        free[g] -= n
        rc[r] += cost[i]
        rt[r] += n
    return GlobalPacking(rows, rc, rt)
