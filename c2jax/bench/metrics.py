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
