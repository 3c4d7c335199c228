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

`c2jax.bench.build.build_suite` writes into the output directory: tasks.jsonl (all), train.jsonl, eval.jsonl,
stats.json (the statistics table) and build_report.json (per codebase: attempts, accepted, skip
reasons, errors, gold-run summaries).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from c2jax.envs.synth import heldout, pypi
from c2jax.envs.synth.build import Targets
from c2jax.envs.synth.sources import Codebase, installed_codebase, sdist_codebase, stdlib_codebase
from c2jax.envs.tasks import TaskRecord

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
