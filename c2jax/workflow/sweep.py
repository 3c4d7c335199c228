"""Ablation sweeps: every (point, seed) cell is one ``experiments/run.py`` run in its own workdir.

`plan_sweep` expands the search space, loads and validates every cell's config in-process (the way
``run.py`` does) and raises `SweepError` naming each bad key before anything runs. `run_sweep`
launches the unfinished cells on a backend (`backends.execute`), writes a done-marker atomically
after each success, and then writes ``results.csv`` and the metric plot. A cell is finished when its
``summary.json`` and its ``DONE.json`` (same config, overrides and seed) both exist, so rerunning a
killed sweep runs only the missing cells. A crashed cell is named with its log path; the other
cells' results are kept and the sweep reports failure at the end.

Layout of ``WORKDIR``: ``sweep.json`` (the plan), ``cells/<cell>/`` (a run.py workdir + ``run.log``
+ ``DONE.json``), ``results.csv``, ``<metric>.png``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from c2jax.atomic import atomic_write_json
from c2jax.config import ConfigError
from c2jax.workflow import backends, results
from c2jax.workflow.configs import OverrideError, check_config, config_path, repo_root
from c2jax.workflow.space import SpaceError, points

DONE = "DONE.json"
LOG = "run.log"


class SweepError(ValueError):
    """The sweep cannot start: a bad spec, key or value (names each), or a workdir holding another sweep."""


@dataclass(frozen=True)
class Cell:
    """One run: a point of the search space and a seed."""

    name: str
    point: dict
    seed: int
    dir: str

    def identity(self, config: str, fixed: dict) -> dict:
        """What makes two runs the same cell (written into DONE.json, compared on resume)."""
        return {"config": config, "fixed": dict(fixed), "point": dict(self.point), "seed": self.seed}


@dataclass
class SweepPlan:
    config: str  # the --config spec as resolved (absolute path[:preset])
    workdir: str
    cells: list[Cell]
    fixed: dict = field(default_factory=dict)  # --config.k=v applied to every cell
    swept_keys: list[str] = field(default_factory=list)
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)

    def argv(self, cell: Cell) -> list[str]:
        """``run.py`` command line of one cell (fixed overrides, then the point, then the seed)."""
        over = {**self.fixed, **cell.point, "seed": str(cell.seed)}
        return [self.python, os.path.join(repo_root(), "experiments", "run.py"), f"--config={self.config}",
                *[f"--config.{k}={v}" for k, v in over.items()], f"--workdir={cell.dir}"]

    def is_done(self, cell: Cell) -> bool:
        """Finished = summary.json + DONE.json for this very cell; a DONE.json of another cell is an error."""
        marker = os.path.join(cell.dir, DONE)
        if not os.path.exists(marker):
            return False
        with open(marker, encoding="utf-8") as f:
            done = json.load(f)
        if done.get("identity") != cell.identity(self.config, self.fixed):
            raise SweepError(f"cell {cell.name}: {marker} belongs to a different run "
                             f"({done.get('identity')}); use a fresh --workdir")
        return os.path.exists(os.path.join(cell.dir, "summary.json"))


def cell_name(point: dict, seed: int) -> str:
    """A readable, filesystem-safe, unique name: ``smoke.learning_rate=0.001__seed=0``."""
    parts = [f"{k}={v}" for k, v in point.items()] + [f"seed={seed}"]
    name = re.sub(r"[^A-Za-z0-9._=+-]", "_", "__".join(parts))
    if len(name) > 120:
        digest = hashlib.sha1("__".join(parts).encode()).hexdigest()[:10]
        name = f"{name[:100]}__{digest}"
    return name


def plan_sweep(config: str, workdir: str, grid: Sequence[str] = (), random: Sequence[str] = (), samples: int = 0,
               search_seed: int = 0, seeds: int = 1, seed_start: int = 0, fixed: dict | None = None) -> SweepPlan:
    """Expand and check a sweep; raise `SweepError` (every bad cell and key named) before anything runs."""
    if seeds < 1:
        raise SweepError(f"--seeds must be >= 1, got {seeds}")
    fixed = dict(fixed or {})
    if "seed" in fixed:
        raise SweepError("--config.seed is set per cell by --seeds/--seed-start; do not pass it")
    try:
        resolved = config_path(config)
        pts = points(list(grid), list(random), samples, search_seed)
    except (SpaceError, FileNotFoundError) as e:
        raise SweepError(str(e)) from e
    overlap = sorted(set(fixed) & set().union(*[set(p) for p in pts]))
    if overlap:
        raise SweepError(f"key both fixed and swept: {', '.join(overlap)}")
    problems: list[str] = []
    cells: list[Cell] = []
    for p in pts:
        for s in range(seed_start, seed_start + seeds):
            name = cell_name(p, s)
            try:
                check_config(resolved, {**fixed, **p, "seed": str(s)})
            except (OverrideError, ConfigError) as e:
                problems.append(f"cell {name}: {e}")
            cells.append(Cell(name, p, s, os.path.abspath(os.path.join(workdir, "cells", name))))
    if problems:
        raise SweepError("sweep not started, bad cell config(s):\n" + "\n".join(problems))
    keys = list(pts[0]) if pts else []
    return SweepPlan(resolved, os.path.abspath(workdir), cells, fixed, keys)


def _atomic_json(path: str, obj: Any) -> None:
    atomic_write_json(path, obj, fsync=True, indent=1, default=str)


@dataclass
class SweepResult:
    finished: list[str]
    ran: list[str]
    failed: dict[str, str]  # cell name -> log path
    csv_path: str
    plot_path: str | None
    table: list[dict] | None

    @property
    def ok(self) -> bool:
        return not self.failed


def collect_rows(plan: SweepPlan) -> list[dict]:
    """One row per finished cell: cell, seed, config.<swept key>, then every scalar of summary.json."""
    rows = []
    for c in plan.cells:
        path = os.path.join(c.dir, "summary.json")
        if not (os.path.exists(os.path.join(c.dir, DONE)) and os.path.exists(path)):
            continue
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        row = {"cell": c.name, "seed": c.seed, **{results.CONFIG_PREFIX + k: v for k, v in c.point.items()}}
        row.update(results.flatten(summary))
        rows.append(row)
    return rows


def run_sweep(plan: SweepPlan, backend: str = "local", max_parallel: int = 1, metric: str | None = None,
              x_key: str | None = None, ray_address: str | None = None,
              log: Callable[[str], None] = print) -> SweepResult:
    """Run the plan's unfinished cells, then write results.csv (+ the plot when ``metric`` is given)."""
    os.makedirs(plan.workdir, exist_ok=True)
    todo = [c for c in plan.cells if not plan.is_done(c)]
    skipped = len(plan.cells) - len(todo)
    _atomic_json(os.path.join(plan.workdir, "sweep.json"), {
        "config": plan.config, "fixed": plan.fixed, "swept_keys": plan.swept_keys,
        "cells": [{"name": c.name, "point": c.point, "seed": c.seed, "argv": plan.argv(c)} for c in plan.cells]})
    log(f"sweep: {len(plan.cells)} cells, {skipped} already finished, {len(todo)} to run "
        f"({backend}, max {max_parallel} at a time) in {plan.workdir}")
    by_name = {c.name: c for c in todo}
    jobs = [backends.Job(c.name, tuple(plan.argv(c)), plan.cwd, os.path.join(c.dir, LOG)) for c in todo]
    for c in todo:
        os.makedirs(c.dir, exist_ok=True)
    failed: dict[str, str] = {}
    ran: list[str] = []
    t0 = time.time()
    for i, (name, rc) in enumerate(backends.execute(jobs, backend, max_parallel, ray_address), 1):
        cell = by_name[name]
        log_path = os.path.join(cell.dir, LOG)
        ran.append(name)
        if rc == 0 and os.path.exists(os.path.join(cell.dir, "summary.json")):
            _atomic_json(os.path.join(cell.dir, DONE), {"identity": cell.identity(plan.config, plan.fixed),
                                                        "argv": plan.argv(cell), "finished": time.time()})
            log(f"[{i}/{len(todo)}] done {name} ({time.time() - t0:.0f} s into the sweep)")
        else:
            why = f"exit status {rc}" if rc != 0 else "exit status 0 but no summary.json"
            failed[name] = log_path
            log(f"[{i}/{len(todo)}] FAILED {name}: {why}; log: {log_path}")
    rows = collect_rows(plan)
    csv_path = os.path.join(plan.workdir, "results.csv")
    results.write_csv(rows, csv_path, first=["cell", "seed", *[results.CONFIG_PREFIX + k for k in plan.swept_keys]])
    log(f"results: {csv_path} ({len(rows)} rows)")
    plot_path, table = None, None
    if metric and rows:
        if not any(metric in r for r in rows):
            keys = sorted(set().union(*[r.keys() for r in rows]))
            log(f"no plot: metric {metric!r} is not in any summary; columns: {', '.join(keys)}")
        else:
            x = x_key or (plan.swept_keys[0] if plan.swept_keys else None)
            if x is None:
                log("no plot: nothing is swept (seeds only)")
            else:
                if x not in plan.swept_keys:
                    raise SweepError(f"--x {x!r} is not a swept key ({', '.join(plan.swept_keys)})")
                groups = [results.CONFIG_PREFIX + k for k in plan.swept_keys if k != x]
                plot_path = os.path.join(plan.workdir, re.sub(r"[^A-Za-z0-9._-]", "_", metric) + ".png")
                table = results.plot_metric(rows, results.CONFIG_PREFIX + x, metric, plot_path, groups)
                for t in table:
                    g = ", ".join(f"{k}={v}" for k, v in t["group"].items())
                    log(f"  {x}={t['x']}{' (' + g + ')' if g else ''}: {metric} = {t['mean']:.4g} "
                        f"+- {t['ci95']:.3g} (95% CI, n={t['n']})")
                log(f"plot: {plot_path}")
    if failed:
        log(f"{len(failed)} cell(s) failed: " + "; ".join(f"{n} (log: {p})" for n, p in failed.items()))
    done = [c.name for c in plan.cells if os.path.exists(os.path.join(c.dir, DONE))]
    return SweepResult(done, ran, failed, csv_path, plot_path, table)
