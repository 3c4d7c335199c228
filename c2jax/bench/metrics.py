"""Benchmark statistics: unbiased pass@k and bootstrap confidence intervals.

pass@k (Chen et al. 2021, arXiv 2107.03374 §2.1): with n samples of which c are correct,
    pass@k = 1 - C(n-c, k) / C(n, k),
computed in the numerically stable product form 1 - prod_{i=n-c+1}^{n} (1 - k/i) (1 when
n - c < k). `pass_at_k_bruteforce` enumerates every k-subset and is the cross-check.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples, c correct."""
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_bruteforce(outcomes: Sequence[bool], k: int) -> float:
    """Mean over all k-subsets of the samples of 'some sample in the subset is correct'."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


def mean_pass_at_k(per_task: Sequence[tuple[int, int]], k: int) -> float:
    """Average pass@k over tasks given (n, c) per task."""
    vals = [pass_at_k(n, c, k) for n, c in per_task]
    return sum(vals) / len(vals) if vals else float("nan")


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float] | None = None,
                 n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of `stat` (default: mean) resampling tasks with replacement."""
    vals = list(values)
    if not vals:
        return float("nan"), float("nan")
    stat = stat or (lambda xs: sum(xs) / len(xs))
    rng = random.Random(seed)
    n = len(vals)
    boots = sorted(stat([vals[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    lo = boots[int(math.floor(alpha / 2 * (n_boot - 1)))]
    hi = boots[int(math.ceil((1 - alpha / 2) * (n_boot - 1)))]
    return lo, hi


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    m = len(s) // 2
    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _task_nc(row, masked_as_failure: bool = True) -> tuple[int, int]:
    """(n, c) of one per-task row (`c2jax.bench.run` format) or an (n, c) pair / outcome list."""
    if isinstance(row, dict):
        samples = row["samples"]
        if not masked_as_failure:
            samples = [s for s in samples if not s.get("masked")]
        return len(samples), sum(bool(s["resolved"]) and not s.get("masked") for s in samples)
    if isinstance(row, tuple) and len(row) == 2 and all(isinstance(x, int) for x in row):
        return row
    outs = list(row)
    return len(outs), sum(bool(x) for x in outs)


def _keyed(per_task) -> dict[str, object]:
    if isinstance(per_task, dict):
        return dict(per_task)
    out: dict[str, object] = {}
    for r in per_task:
        iid = r["instance_id"]
        if iid in out:
            raise ValueError(f"task {iid!r} appears twice")
        out[iid] = r
    return out


def paired_bootstrap_diff(per_task_a, per_task_b, k: int, n_boot: int = 10000, seed: int = 0,
                          alpha: float = 0.05, masked_as_failure: bool = True) -> dict:
    """pass@k(B) - pass@k(A) with a paired percentile bootstrap CI over TASKS.

    per_task_a / per_task_b: per-task rows (``{"instance_id", "samples": [{"resolved", "masked"}]}``,
    the `c2jax.bench.run` / `agent_eval` format) or dicts instance_id -> row, (n, c) or a list of
    outcomes. Tasks are matched by instance_id (ValueError if the sets differ); each bootstrap
    replicate draws ONE set of task indices (with replacement) used for both runs, so the
    per-task difference d_i = pass@k_B(i) - pass@k_A(i) is what is resampled. Masked samples count
    as failures (evaluation) unless `masked_as_failure=False` (then they are dropped from n).
    Returns {"mean", "lo", "hi", "tasks", "k", "p_boot"}: mean = the observed difference; p_boot =
    the two-sided bootstrap fraction of replicates on the other side of 0 (a rough p-value).
    """
    return pooled_paired_bootstrap_diff([(per_task_a, per_task_b)], k, n_boot=n_boot, seed=seed, alpha=alpha,
                                        masked_as_failure=masked_as_failure)


def pooled_paired_bootstrap_diff(pairs, k: int, n_boot: int = 10000, seed: int = 0, alpha: float = 0.05,
                                 masked_as_failure: bool = True) -> dict:
    """`paired_bootstrap_diff` pooled over several (A, B) pairs on the SAME tasks, e.g. one pair per
    training seed (A: the policy before RL, B: after). The per-task difference is averaged over the
    pairs, d_i = mean_s [pass@k_Bs(i) - pass@k_As(i)], and tasks are resampled: the CI covers task
    sampling, the quantity that generalises to new tasks, with the seeds' variation averaged in.
    One pair gives exactly `paired_bootstrap_diff`. Returns its keys plus "pairs"."""
    import numpy as np

    if not pairs:
        raise ValueError("no (A, B) pairs")
    keyed = [(_keyed(a), _keyed(b)) for a, b in pairs]
    ids = sorted(keyed[0][0])
    for n, (a, b) in enumerate(keyed):
        for name, side in (("A", a), ("B", b)):
            if set(side) != set(ids):
                only_x, only_first = sorted(set(side) - set(ids)), sorted(set(ids) - set(side))
                raise ValueError(f"the runs cover different tasks: pair {n} {name} has {only_x[:5]} "
                                 f"({len(only_x)}) not in pair 0 A, and lacks {only_first[:5]} ({len(only_first)})")
    if not ids:
        raise ValueError("no tasks")
    d = np.zeros(len(ids), np.float64)
    for a, b in keyed:
        for t, i in enumerate(ids):
            (na, ca), (nb, cb) = _task_nc(a[i], masked_as_failure), _task_nc(b[i], masked_as_failure)
            if na < k or nb < k:
                raise ValueError(f"task {i!r}: pass@{k} needs >= {k} samples per run (A has {na}, B has {nb})")
            d[t] += pass_at_k(nb, cb, k) - pass_at_k(na, ca, k)
    d_arr = d / len(keyed)
    n = len(d_arr)
    mean = float(d_arr.mean())
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot, np.float64)
    chunk = max(1, (1 << 22) // n)  # bounded memory: chunk x n indices at a time
    for s in range(0, n_boot, chunk):
        m = min(chunk, n_boot - s)
        boots[s:s + m] = d_arr[rng.integers(0, n, size=(m, n))].mean(axis=1)
    boots.sort()
    lo = float(boots[int(math.floor(alpha / 2 * (n_boot - 1)))])
    hi = float(boots[int(math.ceil((1 - alpha / 2) * (n_boot - 1)))])
    if d_arr.min() == d_arr.max():  # a constant difference: every replicate is exactly it
        lo = hi = mean = float(d_arr[0])
    p = 2 * min(float((boots <= 0).mean()), float((boots >= 0).mean()))
    out = {"mean": mean, "lo": lo, "hi": hi, "tasks": n, "k": k, "p_boot": min(1.0, p)}
    return out if len(keyed) == 1 else dict(out, pairs=len(keyed))