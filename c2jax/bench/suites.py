"""Suites: which codebases a benchmark is built from, how many tasks of each kind, and the mix.

c2bench-mini  2 codebases, 12 tasks, offline (standard-library modules + an installed package):
              the test-sized suite the default tests build and check with the oracle and null
              policies.
toyfix        generated tiny repositories with one bug each (`c2jax.envs.synth.toyfix`): 128 train,
              64 held-out eval, 256 demo (SFT) tasks at difficulty 1, for RL on tiny models
              (`GENERATED_SUITES`: no codebases; demo.jsonl and leakage.json besides the files below).
c2bench       the standard library (one codebase) + the built-in PyPI list (prefetched sdists):
              >= 200 validated tasks from >= 8 codebases; <= 25% from any one codebase; >= 30%
              feature deletions of >= 50 lines over >= 2 files; split by codebase into a training
              distribution and the held-out evaluation set (`synth.heldout`).

`build_suite` writes into the output directory: tasks.jsonl (all), train.jsonl, eval.jsonl,
stats.json (the statistics table) and build_report.json (per codebase: attempts, accepted, skip
reasons, errors, gold-run summaries).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable

from c2jax.bench.metrics import median
from c2jax.envs import images
from c2jax.envs.synth import heldout, pypi
from c2jax.envs.synth.build import BuildContext, Targets, build_codebase, enforce_mix
from c2jax.envs.synth.sources import Codebase, installed_codebase, sdist_codebase, stdlib_codebase
from c2jax.envs.tasks import TaskRecord, load_tasks, write_tasks
from c2jax.bench.materialize import missing_envs

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
    stdlib_modules: tuple[str, ...]
    installed: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (distribution, test files)
    pypi: tuple[str, ...] = ()
    targets: Targets = dataclasses.field(default_factory=Targets)
    stdlib_targets: Targets | None = None
    max_codebase_share: float = 1.0
    min_deletion_share: float = 0.0
    eval_codebases: tuple[str, ...] = ()
    min_tasks: int = 0
    min_codebases: int = 0
    scan_each_task: bool = True


SUITES: dict[str, SuiteSpec] = {
    "c2bench-mini": SuiteSpec(
        stdlib_modules=("graphlib", "colorsys", "getopt"),
        installed=(("simplejson", ("simplejson/tests/test_decode.py", "simplejson/tests/test_dump.py",
                                   "simplejson/tests/test_scanstring.py")),),
        targets=Targets(bug=2, multi_bug=1, feature_deletion=2, max_attempts=20),
        eval_codebases=("simplejson",), min_tasks=8, min_codebases=2),
    "c2bench": SuiteSpec(
        stdlib_modules=("graphlib", "colorsys", "getopt", "configparser", "optparse", "netrc",
                        "plistlib", "xdrlib", "tabnanny", "filecmp", "sched"),
        pypi=tuple(p.name for p in pypi.PACKAGES),
        targets=Targets(bug=8, multi_bug=3, feature_deletion=7, max_attempts=60),
        stdlib_targets=Targets(bug=10, multi_bug=4, feature_deletion=9, max_attempts=80),
        max_codebase_share=0.25, min_deletion_share=0.30, eval_codebases=heldout.EVAL_PACKAGES,
        min_tasks=200, min_codebases=8),
}


def _toyfix_suite(out_dir: str, *, workers: int = 2, seed: int = 0, **_: Any):
    from c2jax.envs.synth.toyfix import make_suite_tasks

    return make_suite_tasks(out_dir, workers=workers, seed=seed)


# Suites generated from scratch (no codebases): name -> builder(out_dir, workers=, seed=) returning
# (tasks, stats, report) like `build_suite`. toyfix: tiny generated repositories with one bug
# (c2jax.envs.synth.toyfix; train.jsonl / eval.jsonl / demo.jsonl), for RL on tiny models.
GENERATED_SUITES: dict[str, Callable[..., tuple[list[TaskRecord], dict[str, Any], dict[str, Any]]]] = {
    "toyfix": _toyfix_suite,
}


CodebasePlan = tuple[str, Callable[[], Codebase], Targets]


def codebase_plans(spec: SuiteSpec, src_dir: str, pypi_cache: str | None = None) -> list[CodebasePlan]:
    """(name, prepare, targets) per codebase of `spec`; `prepare()` writes its tree under `src_dir`.

    Shared by the build and by `c2jax.bench.materialize`, which re-creates a task's environment
    from the same preparation (so the content-hashed environment ids come out identical).
    """
    plans: list[CodebasePlan] = []
    if spec.stdlib_modules:
        plans.append(("stdlib", lambda: stdlib_codebase(list(spec.stdlib_modules), src_dir),
                      spec.stdlib_targets or spec.targets))
    for dist, tests in spec.installed:
        plans.append((dist, lambda d=dist, t=tests: installed_codebase(d, src_dir, list(t)), spec.targets))
    for pname in spec.pypi:
        def make(pname=pname):
            p = pypi.by_name(pname)
            path = pypi.cached_path(p, pypi_cache)
            if path is None:
                raise FileNotFoundError(f"{p.filename} not in the PyPI cache (run `python -m c2jax.bench prefetch`)")
            return sdist_codebase(p.name, p.version, path, p.sha256, p.license, src_dir, p.test_globs)
        p = pypi.by_name(pname)
        targets = (dataclasses.replace(spec.targets, max_test_file_s=p.max_test_file_s)
                   if p.max_test_file_s is not None else spec.targets)
        plans.append((pname, make, targets))
    return plans


def stats_table(tasks: list[TaskRecord]) -> dict[str, Any]:
    """Per category (and all): count, median lines/files changed, median prompt characters."""
    groups: dict[str, list[TaskRecord]] = {"all": list(tasks)}
    for t in tasks:
        groups.setdefault(t.category, []).append(t)
        groups.setdefault(f"split:{t.split}", []).append(t)
    out = {}
    for name, ts in groups.items():
        out[name] = {"tasks": len(ts),
                     "median_lines_changed": median([t.stats.get("lines_changed", 0) for t in ts]),
                     "median_files_changed": median([t.stats.get("files_changed", 0) for t in ts]),
                     "median_prompt_chars": median([t.stats.get("prompt_chars", 0) for t in ts]),
                     "median_f2p_tests": median([len(t.hidden_tests.FAIL_TO_PASS) for t in ts])}
    codebases: dict[str, int] = {}
    for t in tasks:
        codebases[t.codebase] = codebases.get(t.codebase, 0) + 1
    return {"by_group": out, "codebases": codebases, "n_codebases": len(codebases)}


def format_stats(stats: dict[str, Any]) -> str:
    rows = [("group", "tasks", "med lines", "med files", "med prompt chars", "med F2P")]
    for name, s in stats["by_group"].items():
        rows.append((name, str(s["tasks"]), f"{s['median_lines_changed']:g}", f"{s['median_files_changed']:g}",
                     f"{s['median_prompt_chars']:g}", f"{s['median_f2p_tests']:g}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    cb = ", ".join(f"{k}={v}" for k, v in sorted(stats["codebases"].items()))
    return "\n".join(lines) + f"\ncodebases ({stats['n_codebases']}): {cb}"


def build_suite(name: str, out_dir: str, *, workers: int = 2, seed: int = 0, pypi_cache: str | None = None,
                codebases: list[str] | None = None,
                checkpoints_only: bool = False) -> tuple[list[TaskRecord], dict[str, Any], dict[str, Any]]:
    """Build suite `name` into `out_dir`; returns (tasks, stats, report).

    checkpoints_only: assemble the suite from the codebases a previous (killed) build finished,
    building nothing new (the others are reported as not built).
    """
    if name in GENERATED_SUITES:
        return GENERATED_SUITES[name](out_dir, workers=workers, seed=seed)
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {sorted(SUITES) + sorted(GENERATED_SUITES)}")
    spec = SUITES[name]
    os.makedirs(out_dir, exist_ok=True)
    ctx = BuildContext(out_dir, seed=seed, workers=workers, scan_each_task=spec.scan_each_task)
    src_dir = os.path.join(out_dir, "codebases")
    report: dict[str, Any] = {"suite": name, "seed": seed, "codebases": {}}
    t0 = time.monotonic()
    plans = codebase_plans(spec, src_dir, pypi_cache)
    tasks: list[TaskRecord] = []
    for cb_name, make_cb, targets in plans:
        if codebases and cb_name not in codebases:
            continue
        rep = report["codebases"].setdefault(cb_name, {"skipped": {}, "accepted": 0, "attempts": 0})
        try:
            cb = make_cb()
        except Exception as e:  # noqa: BLE001 - a package that fails to prepare is skipped, reason logged
            rep["error"] = f"{type(e).__name__}: {e}"[:2000]
            log.warning("codebase %s skipped: %s", cb_name, rep["error"])
            continue
        split = "eval" if cb.name in spec.eval_codebases else "train"
        # Per-codebase checkpoint: a killed build resumes from the codebases already done.
        key_parts = [cb.source.sha256, seed, dataclasses.asdict(targets), split, spec.scan_each_task,
                     images.tree_digest(cb.root)]  # how the workspace was prepared counts too
        if cb.pytest_args:  # the test command changed: older checkpoints are stale
            key_parts.append(cb.pytest_args)
        key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:16]
        part = os.path.join(out_dir, "partial", f"{cb.name}-{key}.jsonl")
        if os.path.exists(part) and os.path.exists(part + ".report.json"):
            got = load_tasks(part)
            with open(part + ".report.json") as f:
                report["codebases"][cb_name] = json.load(f)
            log.info("%s: %d tasks from the checkpoint %s", cb.name, len(got), part)
            if missing_envs(got):  # the environment cache was cleaned since: re-create, check ids
                from c2jax.bench.materialize import materialize_envs

                mat = materialize_envs(got, pypi_cache=pypi_cache, suites=[name])
                report["codebases"][cb_name]["materialized"] = {"recreated": len(mat["recreated"]),
                                                                "failed": mat["failed"]}
                got = [t for t in got if t.instance_id not in mat["failed"]]
        elif checkpoints_only:
            rep["error"] = "not built (assembled from checkpoints only)"
            continue
        else:
            t1 = time.monotonic()
            got = build_codebase(cb, targets, ctx, split, report["codebases"])
            rep["wall_s"] = round(time.monotonic() - t1, 1)
            log.info("%s: %d tasks in %.0f s", cb.name, len(got), rep["wall_s"])
            os.makedirs(os.path.dirname(part), exist_ok=True)
            write_tasks(part, got)
            with open(part + ".report.json", "w") as f:
                json.dump(report["codebases"][cb.name], f, indent=1)
        tasks.extend(got)
    before = len(tasks)
    problems = []
    try:
        tasks = enforce_mix(tasks, spec.max_codebase_share, spec.min_deletion_share,
                            spec.targets.deletion_min_lines, spec.targets.deletion_min_files) if tasks else []
    except ValueError as e:  # e.g. a --codebases subset: keep (and write) every task, report it
        problems.append(f"mix not met, nothing dropped: {e}")
    report["dropped_by_mix"] = before - len(tasks)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    stats = stats_table(tasks)
    write_tasks(os.path.join(out_dir, "tasks.jsonl"), tasks)
    for split in ("train", "eval"):
        write_tasks(os.path.join(out_dir, f"{split}.jsonl"), [t for t in tasks if t.split == split])
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    if len(tasks) < spec.min_tasks:
        problems.append(f"{len(tasks)} tasks < {spec.min_tasks}")
    if stats["n_codebases"] < spec.min_codebases:
        problems.append(f"{stats['n_codebases']} codebases < {spec.min_codebases}")
    report["problems"] = problems
    with open(os.path.join(out_dir, "build_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return tasks, stats, report
