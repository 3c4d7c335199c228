"""build_suite: build a suite of `c2jax.bench.suites` into a directory, resuming per codebase.

Writes tasks.jsonl (all), train.jsonl, eval.jsonl, stats.json (the statistics table) and
build_report.json (per codebase: attempts, accepted, skip reasons, errors, gold-run summaries).
A killed build resumes from the codebases it finished; their environments are re-created
(`c2jax.bench.materialize`) when the machine's environment cache was cleaned since.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any

from c2jax.bench.materialize import materialize_envs
from c2jax.bench.suites import GENERATED_SUITES, SUITES, codebase_plans
from c2jax.envs import images
from c2jax.envs.images import missing_envs
from c2jax.envs.synth.build import BuildContext, build_codebase, enforce_mix
from c2jax.envs.tasks import TaskRecord, load_tasks, stats_table, write_tasks

log = logging.getLogger(__name__)


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
