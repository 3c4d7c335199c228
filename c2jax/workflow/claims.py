"""The claims ledger: testable claims of the Composer 2 report, each with a computed verdict.

A claim entry (``experiments/claims/NAME.py``) defines ``CLAIM`` (a `Claim`) and, when it can run,
``run(out_dir) -> Verdict``. A verdict is computed from an effect size and its 95% CI, never
assumed: **holds** when the whole CI lies on the predicted side, **does not hold** when it lies
wholly on the other side, **inconclusive** otherwise (for "no effect" claims: holds when the CI lies
inside ``±equivalence_margin``, does not hold when it excludes 0; for "no benefit" claims,
direction ``not_greater``: holds when the CI's upper end is below the margin, does not hold when the
CI excludes 0 on the benefit side). A claim made of several sub-effects reports the weakest
(`weakest_effect`). Each verdict records the scale ``run`` actually ran at (``Claim.run_scale``);
the full-scale command stays in ``Claim.full_command``. ``run`` writes
``verdict.json`` and a figure to ``runs/claims/NAME/``; `table` reads the latest verdicts.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import time
from typing import Any, Callable, Sequence

import numpy as np

# effect > 0, effect < 0, no effect (equivalence: |effect| < margin), no benefit (effect < margin)
DIRECTIONS = ("greater", "less", "none", "not_greater")
SCALES = ("cheap", "expensive", "needs_gpu")


@dataclasses.dataclass(frozen=True)
class Claim:
    """One testable claim. ``scale``: cheap (runs here in seconds to minutes), expensive (a CPU can run
    it, in hours), needs_gpu (beyond what a CPU can do at a meaningful scale)."""

    name: str
    claim: str  # one sentence
    source: str  # section of the Composer 2 report
    test: str  # the config / sweep / probe that tests it
    metric: str  # the effect size the verdict is computed from
    direction: str  # predicted sign of the effect (DIRECTIONS)
    command: str  # how to run it
    scale: str
    scale_note: str = ""
    equivalence_margin: float | None = None
    run_scale: str = ""  # what ``run`` actually runs (model, steps, seeds), written into every verdict
    full_command: str = ""  # the full-scale test when ``run`` is a smaller stand-in (documented, not run here)

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"claim {self.name}: direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.scale not in SCALES:
            raise ValueError(f"claim {self.name}: scale must be one of {SCALES}, got {self.scale!r}")
        if self.direction in ("none", "not_greater") and not (self.equivalence_margin and self.equivalence_margin > 0):
            raise ValueError(f"claim {self.name}: a {self.direction!r} claim needs equivalence_margin > 0")


@dataclasses.dataclass
class Verdict:
    verdict: str  # holds | does not hold | inconclusive
    effect: float
    ci95: tuple[float, float]
    n: int
    detail: dict = dataclasses.field(default_factory=dict)
    figure: str | None = None


def decide(effect: float, lo: float, hi: float, direction: str, margin: float | None = None) -> str:
    """The verdict of an effect with 95% CI [lo, hi] against the predicted direction."""
    if not all(math.isfinite(v) for v in (effect, lo, hi)):
        return "inconclusive"
    if direction == "greater":
        return "holds" if lo > 0 else "does not hold" if hi < 0 else "inconclusive"
    if direction == "less":
        return "holds" if hi < 0 else "does not hold" if lo > 0 else "inconclusive"
    if margin is None:
        raise ValueError(f"direction {direction!r} needs an equivalence margin")
    if direction == "not_greater":  # "no benefit": the CI rules out a benefit as large as the margin
        return "holds" if hi < margin else "does not hold" if lo > 0 else "inconclusive"
    return "holds" if -margin < lo and hi < margin else "does not hold" if lo > 0 or hi < 0 else "inconclusive"


_VERDICT_RANK = {"does not hold": 0, "inconclusive": 1, "holds": 2}


def weakest_effect(effects: dict[str, tuple[float, float, float, int]], direction: str,
                   margin: float | None = None) -> tuple[str, tuple[float, float, float, int]]:
    """The sub-effect that decides a claim made of several (it holds only if every one does):
    the one with the weakest verdict, ties broken by the smallest signed t-like ratio
    effect / CI half-width (towards the predicted direction)."""
    if not effects:
        raise ValueError("weakest_effect: no effects")
    sign = -1.0 if direction == "less" else 1.0

    def key(item):
        e, lo, hi, _ = item[1]
        half = (hi - lo) / 2 if math.isfinite(hi - lo) and hi > lo else math.inf
        return _VERDICT_RANK[decide(e, lo, hi, direction, margin)], sign * e / half if half else math.inf

    return min(effects.items(), key=key)


def paired_t(diffs: Sequence[float]) -> tuple[float, float, float, int]:
    """Mean of paired differences (one per seed) and its Student-t 95% CI."""
    from c2jax.workflow.results import mean_ci

    mean, half, n = mean_ci(diffs)
    return mean, mean - half, mean + half, n


def welch_diff(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) with Welch's 95% CI (unequal variances)."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    d = a.mean() - b.mean()
    se = math.sqrt(va + vb)
    if se == 0:
        return float(d), float(d), float(d)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    t = stats.t.ppf(0.975, df)
    return float(d), float(d - t * se), float(d + t * se)


def spearman_ci(x: Sequence[float], y: Sequence[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Spearman rank correlation and its percentile-bootstrap 95% CI (resampling the pairs)."""
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = float(stats.spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, x.size, x.size)
        if np.unique(x[i]).size > 1 and np.unique(y[i]).size > 1:
            boots.append(stats.spearmanr(x[i], y[i]).statistic)
    lo, hi = np.quantile(boots, [0.025, 0.975]) if boots else (math.nan, math.nan)
    return rho, float(lo), float(hi)


# ---------------------------------------------------------------- the ledger on disk
def load_entries(claims_dir: str) -> dict[str, Any]:
    """Every ``claims_dir/*.py`` entry module (it must define CLAIM; ``run`` is optional), by name."""
    entries = {}
    for fn in sorted(os.listdir(claims_dir)):
        if not fn.endswith(".py") or fn.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"c2jax_claim_{fn[:-3]}", os.path.join(claims_dir, fn))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        claim = getattr(mod, "CLAIM", None)
        if not isinstance(claim, Claim):
            raise ValueError(f"{fn}: must define CLAIM = Claim(...)")
        if claim.name != fn[:-3]:
            raise ValueError(f"{fn}: CLAIM.name {claim.name!r} must equal the file name")
        entries[claim.name] = mod
    return entries


def run_claim(entry: Any, out_root: str, force: bool = False) -> Verdict:
    """Run one entry's ``run(out_dir)``, check its verdict against its CI, write ``verdict.json``."""
    claim: Claim = entry.CLAIM
    fn: Callable | None = getattr(entry, "run", None)
    if fn is None:
        raise RuntimeError(f"{claim.name}: no runnable test registered here; run it with: {claim.command}")
    if claim.scale != "cheap" and not force:
        raise RuntimeError(f"{claim.name} is {claim.scale} ({claim.scale_note}); pass --force to run it anyway")
    out_dir = os.path.join(out_root, claim.name)
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    v: Verdict = fn(out_dir)
    expected = decide(v.effect, *v.ci95, claim.direction, claim.equivalence_margin)
    if v.verdict != expected:  # an entry cannot hand-write its verdict
        raise AssertionError(f"{claim.name}: verdict {v.verdict!r} disagrees with its effect/CI ({expected!r})")
    record = {"name": claim.name, "claim": claim.claim, "source": claim.source, "metric": claim.metric,
              "direction": claim.direction, "run_scale": claim.run_scale or claim.scale,
              "full_command": claim.full_command, **dataclasses.asdict(v), "wall_s": time.time() - t0,
              "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = os.path.join(out_dir, "verdict.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, default=float)
    os.replace(tmp, os.path.join(out_dir, "verdict.json"))
    return v


def table(entries: dict[str, Any], out_root: str) -> list[dict]:
    """One row per claim: its latest verdict (or 'not run'), effect and CI, scale."""
    rows = []
    for name, mod in entries.items():
        c: Claim = mod.CLAIM
        path = os.path.join(out_root, name, "verdict.json")
        row = {"name": name, "scale": c.scale, "source": c.source, "verdict": "not run", "effect": "", "ci95": "",
               "run_scale": ""}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                v = json.load(f)
            row.update(verdict=v["verdict"], effect=f"{v['effect']:.4g}",
                       ci95=f"[{v['ci95'][0]:.4g}, {v['ci95'][1]:.4g}]", finished=v.get("finished", ""),
                       run_scale=v.get("run_scale", ""))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- sweep-backed claims
def sweep_compare(out_dir: str, config: str, key: str, treatment: str, control: str, metric: str, seeds: int,
                  fixed: dict | None = None, max_parallel: int = 1, paired: bool = True) -> tuple[float, float, float, int, str]:
    """Run (or resume) a two-value sweep of ``key`` and return ``metric(treatment) - metric(control)``
    with its 95% CI (paired by seed when ``paired``, else Welch), n, and the plot path."""
    from c2jax.workflow.results import as_float, read_csv
    from c2jax.workflow.sweep import plan_sweep, run_sweep

    plan = plan_sweep(config, os.path.join(out_dir, "sweep"), grid=[f"{key}=[{control},{treatment}]"], seeds=seeds,
                      fixed=fixed)
    res = run_sweep(plan, max_parallel=max_parallel, metric=metric)
    if not res.ok:
        raise RuntimeError(f"sweep cells failed: {res.failed}")
    rows = read_csv(res.csv_path)
    col = "config." + key
    by_seed = {v: {int(r["seed"]): as_float(r.get(metric)) for r in rows if r[col] == v} for v in (control, treatment)}
    if paired:
        diffs = [by_seed[treatment][s] - by_seed[control][s] for s in by_seed[control] if s in by_seed[treatment]]
        d, lo, hi, n = paired_t(diffs)
    else:
        d, lo, hi = welch_diff(list(by_seed[treatment].values()), list(by_seed[control].values()))
        n = len(rows)
    return d, lo, hi, n, res.plot_path or ""
