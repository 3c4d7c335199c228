"""Re-create the environments of built tasks from their records and their codebases' sources.

A task record names its agent environment by a content hash (`env_id`), and every layer under it
is content-addressed too: the test-runner venv (pytest repacked from this Python), the codebase
tree, the hidden-path layer, then the task's broken state (the gold patch undone, hidden test files
removed). The environments live in a machine-local cache ($C2JAX_ENVS_DIR), so a suite copied to
another machine, or a cache that was cleaned, leaves records pointing at nothing: every sample
would be masked as an infrastructure failure. `materialize_envs` rebuilds what is missing by the
same steps the build took and checks that each re-created id equals the record's. A different id
means the inputs differ (another CPython or pytest version, another sdist) and the task is
reported, never silently re-pointed.

    python -m c2jax.bench envs --suite runs/c2bench          # check / re-create, prints a report
    python -m c2jax.bench run ...                            # does this first for missing envs
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from typing import Any, Sequence

from c2jax.envs import derive_env
from c2jax.envs.images import env_exists, missing_envs
from c2jax.envs.synth.build import BuildContext, codebase_env, hide_env, runner_env
from c2jax.envs.synth.patches import apply_patch_host, make_patch
from c2jax.envs.synth.sources import Codebase
from c2jax.envs.tasks import TaskRecord

log = logging.getLogger(__name__)

# Record kinds whose environments this module can re-create (synthesised tasks).
SYNTH_KINDS = ("stdlib", "pypi", "installed")


def agent_base_patch(cb: Codebase, task: TaskRecord) -> str:
    """The patch pristine codebase -> the task's agent base (broken code, hidden test files absent).

    Made exactly as the build made it (`synth.build.validate_candidate`), so `derive_env` of the
    codebase environment with it reproduces the record's `env_id`.
    """
    from c2jax.envs.grading import diff_paths

    changed, problems = diff_paths(task.patch)
    if problems:
        raise ValueError(f"gold patch of {task.instance_id} is unsafe: {problems[:3]}")
    pristine: dict[str, str | None] = {}
    for rel in sorted(changed):
        path = os.path.join(cb.root, rel)
        if os.path.exists(path):
            with open(path, encoding="utf-8", newline="") as f:
                pristine[rel] = f.read()
        else:
            pristine[rel] = None
    broken = apply_patch_host(pristine, task.patch, reverse=True)
    hidden = dict(task.hidden_tests.files)
    return make_patch({**pristine, **hidden}, {**broken, **{t: None for t in hidden}})


def _find_codebase(task: TaskRecord, src_dir: str, pypi_cache: str | None, suites: Sequence[str] | None
                   ) -> Codebase:
    """Prepare the codebase the task was built from: a suite plan whose source matches the record."""
    from c2jax.bench.suites import SUITES, codebase_plans

    tried = []
    for name in suites or list(SUITES):
        for cb_name, make, _ in codebase_plans(SUITES[name], src_dir, pypi_cache):
            if cb_name != task.codebase or (name, cb_name) in tried:
                continue
            tried.append((name, cb_name))
            cb = make()
            if (cb.source.kind, cb.source.version, cb.source.sha256) == (
                    task.source.kind, task.source.version, task.source.sha256):
                return cb
    if not tried:
        raise LookupError(f"no suite prepares codebase {task.codebase!r}")
    raise LookupError(f"codebase {task.codebase!r} prepared here is not the one the task was built from "
                      f"(record: {task.source.kind} {task.source.version} sha256 {task.source.sha256[:12]}; "
                      f"tried suites {[n for n, _ in tried]}): another Python or package version")


def materialize_envs(tasks: Sequence[TaskRecord], *, pypi_cache: str | None = None,
                     suites: Sequence[str] | None = None) -> dict[str, Any]:
    """Re-create every missing task environment; returns a report.

    Report: {"present": n already there, "recreated": [ids], "failed": {instance_id: reason},
    "by_codebase": {name: {"tasks", "recreated", "wall_s"}}, "wall_s"}. A task whose environment
    cannot be re-created (unsupported kind, source not reproducible here, id mismatch) is listed in
    "failed" with the reason; the others are unaffected.
    """
    t0 = time.monotonic()
    todo = missing_envs(tasks)
    report: dict[str, Any] = {"present": len(tasks) - len(todo), "recreated": [], "failed": {}, "by_codebase": {}}
    groups: dict[tuple, list[TaskRecord]] = {}
    for t in todo:
        if t.source.kind not in SYNTH_KINDS:
            report["failed"][t.instance_id] = (f"source kind {t.source.kind!r}: its environment comes from "
                                               "`convert` (re-run it), not from a synthesis build")
            continue
        groups.setdefault((t.codebase, t.source.sha256), []).append(t)
    for (cb_name, _), group in sorted(groups.items()):
        t1 = time.monotonic()
        rep = report["by_codebase"].setdefault(cb_name, {"tasks": 0, "recreated": 0})
        rep["tasks"] += len(group)
        work = tempfile.mkdtemp(prefix=f"c2jax-materialize-{cb_name}-")
        try:
            cb = _find_codebase(group[0], os.path.join(work, "codebases"), pypi_cache, suites)
            ctx = BuildContext(work)
            env, _ = hide_env(cb, codebase_env(cb, runner_env(ctx)))
            for t in group:
                try:
                    got = derive_env(env, agent_base_patch(cb, t))
                except Exception as e:  # noqa: BLE001 - one task's failure is reported, others go on
                    report["failed"][t.instance_id] = f"{type(e).__name__}: {e}"[:500]
                    continue
                if got != t.env_id:
                    report["failed"][t.instance_id] = (f"re-created environment {got} != record's {t.env_id}: "
                                                       "the build inputs differ on this machine")
                    continue
                report["recreated"].append(t.env_id)
                rep["recreated"] += 1
        except Exception as e:  # noqa: BLE001 - a codebase that cannot be prepared fails its tasks only
            for t in group:
                report["failed"].setdefault(t.instance_id, f"{type(e).__name__}: {e}"[:500])
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rep["wall_s"] = round(time.monotonic() - t1, 1)
        log.info("%s: %d/%d environments re-created in %.0f s", cb_name, rep["recreated"], rep["tasks"],
                 rep["wall_s"])
    report["wall_s"] = round(time.monotonic() - t0, 1)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [f"environments: {report['present']} present, {len(report['recreated'])} re-created, "
             f"{len(report['failed'])} failed ({report['wall_s']} s)"]
    for name, rep in sorted(report["by_codebase"].items()):
        lines.append(f"  {name}: {rep['recreated']}/{rep['tasks']} re-created in {rep.get('wall_s', 0)} s")
    for iid, why in sorted(report["failed"].items()):
        lines.append(f"  FAILED {iid}: {why}")
    return "\n".join(lines)


__all__ = ["agent_base_patch", "env_exists", "format_report", "materialize_envs", "missing_envs"]
