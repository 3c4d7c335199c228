"""Sweep results: flatten each cell's ``summary.json``, write ``results.csv``, mean and 95% CI over
seeds, and a plot of one metric against a swept key.

The CI is the Student-t interval ``mean +- t_{0.975, n-1} * sd / sqrt(n)`` over the seeds of one
point (undefined, so NaN, for a single seed): the seed-to-seed spread is the noise a reader should
compare an effect against.
"""
from __future__ import annotations

import csv
import math
from typing import Any, Iterable, Mapping, Sequence

CONFIG_PREFIX = "config."  # swept keys appear in results.csv as config.<key>


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every scalar leaf (number, bool, string, None) of nested dicts, keyed by dotted path; lists are skipped."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif tree is None or isinstance(tree, (bool, int, float, str)):
        out[prefix[:-1]] = tree
    return out


def write_csv(rows: Sequence[Mapping[str, Any]], path: str, first: Sequence[str] = ()) -> list[str]:
    """Write rows (dicts, possibly with different keys) to ``path``; columns ``first`` then the rest sorted."""
    keys = set().union(*[r.keys() for r in rows]) if rows else set()
    columns = [c for c in first if c in keys or not rows] + sorted(keys - set(first))
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in columns})
    import os

    os.replace(tmp, path)
    return columns


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def as_float(v: Any) -> float:
    """A CSV cell as a float (bools as 0/1); NaN when empty or not numeric."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        if v in ("True", "False"):
            return float(v == "True")
        if v.strip() == "":
            return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def mean_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float, int]:
    """(mean, CI half-width, n) of the finite values; half-width NaN when n < 2."""
    from scipy import stats

    xs = [float(v) for v in values if math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan, n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n), n


def aggregate(rows: Sequence[Mapping[str, Any]], x_key: str, metric: str,
              group_keys: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Per (group, x) value: mean, 95% CI half-width and n of ``metric`` over the rows (the seeds)."""
    buckets: dict[tuple, list[float]] = {}
    for r in rows:
        key = (tuple(str(r.get(g, "")) for g in group_keys), str(r.get(x_key, "")))
        buckets.setdefault(key, []).append(as_float(r.get(metric)))
    out = []
    for (group, x), vals in buckets.items():
        mean, half, n = mean_ci(vals)
        out.append({"group": dict(zip(group_keys, group)), "x": x, "mean": mean, "ci95": half, "n": n})
    return out


def _sort_x(xs: Sequence[str]) -> tuple[list[str], bool]:
    numeric = all(math.isfinite(as_float(x)) for x in xs)
    return (sorted(xs, key=as_float) if numeric else list(xs)), numeric


def plot_metric(rows: Sequence[Mapping[str, Any]], x_key: str, metric: str, path: str,
                group_keys: Sequence[str] = (), title: str = "") -> list[dict[str, Any]]:
    """Plot ``metric`` (mean and 95% CI over seeds) against ``x_key``, one line per group; returns the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = aggregate(rows, x_key, metric, group_keys)
    fig, ax = plt.subplots(figsize=(6, 4))
    groups: dict[tuple, list[dict]] = {}
    for t in table:
        groups.setdefault(tuple(t["group"].items()), []).append(t)
    all_x, numeric = _sort_x(list({t["x"] for t in table}))
    for group, pts in groups.items():
        pts = sorted(pts, key=lambda t: all_x.index(t["x"]))
        xs = [as_float(t["x"]) if numeric else all_x.index(t["x"]) for t in pts]
        ys = [t["mean"] for t in pts]
        err = [0.0 if math.isnan(t["ci95"]) else t["ci95"] for t in pts]
        label = ", ".join(f"{k.removeprefix(CONFIG_PREFIX)}={v}" for k, v in group) or None
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=label)
    if not numeric:
        ax.set_xticks(range(len(all_x)), all_x)
    elif all_x and min(as_float(x) for x in all_x) > 0 and max(as_float(x) for x in all_x) / min(
            as_float(x) for x in all_x) >= 100:
        ax.set_xscale("log")
    ns = sorted({t["n"] for t in table})
    ax.set_xlabel(x_key.removeprefix(CONFIG_PREFIX))
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric}: mean and 95% CI over seeds (n={'/'.join(map(str, ns))})", fontsize=9)
    if groups and any(g for g in groups):
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return table
