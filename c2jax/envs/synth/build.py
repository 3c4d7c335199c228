"""Synthesis driver: codebases -> environments -> candidate tasks -> validated task records.

For each codebase:
1. Environment: one shared runner environment (empty repository + a venv with pytest from the
   offline wheelhouse, on the running CPython), one layer with the codebase's tree, then one
   hiding layer: every pristine copy of a codebase file found *outside* /workspace by the
   in-sandbox leak scan (e.g. the standard library's own module, its .pyc, its Lib/test file) is
   covered up.
2. Gold runs: each test file runs 3 times on the pristine state (cached per codebase version in
   `<out>/cache/`); only tests passing all 3 runs are eligible (the rest are dropped as flaky or
   failing).
3. Candidates (seeded): single-site bugs, multi-site bugs, feature deletions (bodies of tested
   functions across >= 2 files, >= 50 lines). Each is applied to the pristine tree as span edits.
4. Validation: the broken state runs once with the hidden tests: FAIL_TO_PASS = eligible tests
   failing there (>= 1 required), PASS_TO_PASS = eligible tests passing there. A collection error
   ("breaks import"), a timeout, or no failing test skips the candidate with the reason logged.
   The gold patch must apply cleanly to the broken files and give back the pristine files; the
   task's environment (pristine + broken patch - hidden test files) is derived, the full grader
   must resolve the gold patch, and (optionally) the leak scan of the task's own sandbox must
   find no pristine copy of a changed file nor a hidden test.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
from typing import Any, Callable

from c2jax.atomic import atomic_write_json
from c2jax.envs import derive_env, images
from c2jax.envs.grading import grade, run_tests
from c2jax.envs.synth import leakage, prompt
from c2jax.envs.synth.families import TASK_FAMILIES, Candidate, Targets, make_candidate, read_source
from c2jax.envs.synth.patches import apply_patch_host, make_patch
from c2jax.envs.synth.sources import Codebase
from c2jax.envs.synth.wheelhouse import runner_wheelhouse
from c2jax.envs.tasks import DEFAULT_PROTECTED, HiddenTests, TaskRecord, TestSpec, patch_stats

log = logging.getLogger(__name__)
GENERATOR_VERSION = "1"
GOLD_RUNS = 3


@dataclasses.dataclass
class BuildContext:
    out_dir: str
    seed: int = 0
    workers: int = 2
    scan_each_task: bool = True
    agent_timeout_s: float = 1800.0
    verify_timeout_s: float = 300.0
    limits: dict = dataclasses.field(default_factory=lambda: {"timeout_s": 300.0, "memory_bytes": 2 << 30,
                                                              "pids": 256, "cpus": 1.0})
    combined_gold: dict = dataclasses.field(default_factory=dict)  # test-file set -> uncollectable files

    @property
    def cache_dir(self) -> str:
        d = os.path.join(self.out_dir, "cache")
        os.makedirs(d, exist_ok=True)
        return d


def base_python() -> str:
    """The running CPython's base interpreter (the one whose stdlib and Lib/test we use)."""
    return os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")


_runner_lock = threading.Lock()


def runner_env(ctx: BuildContext) -> str:
    """Empty repository + venv with pytest (offline wheelhouse), on the running CPython."""
    from c2jax.envs import build_env

    with _runner_lock:
        wh, reqs = runner_wheelhouse(os.path.join(ctx.cache_dir, "wheelhouse"))
        empty = os.path.join(ctx.cache_dir, "empty-repo")
        os.makedirs(empty, exist_ok=True)
        return build_env(empty, reqs, wheelhouse=wh, python=base_python())


def codebase_env(cb: Codebase, runner: str) -> str:
    """The runner env + a layer holding the codebase tree (content-addressed)."""
    key = hashlib.sha256(f"{runner}\0{images.tree_digest(cb.root)}".encode()).hexdigest()[:32]
    return images.new_layer_env(runner, lambda dst: shutil.copytree(cb.root, dst, symlinks=True),
                                env_id="cb-" + key, extra_meta={"codebase": cb.name})


def hide_env(cb: Codebase, env_id: str) -> tuple[str, list[tuple[str, str]]]:
    """Cover every pristine copy of the codebase's files visible outside /workspace."""
    files = {}
    for rel in cb.source_files + cb.test_files:
        text = read_source(cb, rel)
        if len(text.encode()) >= 64:  # tiny files (empty __init__.py) match countless unrelated ones
            files[rel] = text
    hits = leakage.scan(env_id, files, cb.source_files + cb.test_files)
    outside = sorted({p for p, _ in hits if not p.startswith("/workspace")})
    if os.path.isdir("/usr/lib/python3/dist-packages"):
        outside.append("/usr/lib/python3/dist-packages/")  # Debian's Python packages: never needed
    return images.hide_paths_env(env_id, outside), hits


def _probe(cb: Codebase, env_id: str, test_files: list[str], hidden: dict[str, str], verify_s: float,
           limits: dict) -> TaskRecord:
    """A task-shaped record for validation runs (nothing to grade, only outcomes to collect)."""
    return TaskRecord(
        instance_id="probe", source=cb.source, codebase=cb.name, env_id=env_id, category="bug_injection",
        subcategory="probe", problem_statement="probe",
        test=TestSpec("pytest", tuple(cb.test_cmd(test_files)), "/workspace", cb.test_env()),
        timeouts={"agent_s": 60.0, "verify_s": verify_s}, limits=dict(limits),
        hidden_tests=HiddenTests(hidden, ("probe",), ()), patch="", protected_paths=DEFAULT_PROTECTED,
        provenance={}, stats={})


def gold_outcomes(cb: Codebase, env_id: str, ctx: BuildContext) -> dict[str, dict[str, Any]]:
    """Per test file: {"stable": [ids passing every run], "flaky": [...], "failing": [...], "wall_s"}.

    Cached per package version beside the environment images ($C2JAX_ENVS_DIR/gold), keyed by the
    codebase environment's content-hashed id (codebase tree, runner venv, interpreter, hidden
    paths) and the test command's extra args, so every build on this machine reuses it and
    nothing stale is ever read.
    """
    from c2jax.envs.state import state_dir

    args = "-" + hashlib.sha256(json.dumps(cb.pytest_args).encode()).hexdigest()[:8] if cb.pytest_args else ""
    gold_dir = os.path.join(state_dir(), "gold")
    os.makedirs(gold_dir, exist_ok=True)
    path = os.path.join(gold_dir, f"gold-{cb.name}-{cb.source.version}-{env_id}{args}.json")
    cache: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            cache = json.load(f)
    todo = [t for t in cb.test_files if t not in cache]

    def one(tf: str) -> tuple[str, dict]:
        runs, t0 = [], time.monotonic()
        for _ in range(GOLD_RUNS):
            r = run_tests(_probe(cb, env_id, [tf], {}, ctx.verify_timeout_s, ctx.limits), "", canary=False,
                          restore_protected=False)
            runs.append({} if r.killed_reason or not r.reported else r.outcomes)
        ids = sorted(set().union(*runs))
        stable = [i for i in ids if not i.startswith("collect:") and all(r.get(i) == "passed" for r in runs)]
        flaky = [i for i in ids if i not in stable and any(r.get(i) == "passed" for r in runs)]
        failing = [i for i in ids if i not in stable and i not in flaky]
        return tf, {"stable": stable, "flaky": flaky, "failing": failing, "wall_s": time.monotonic() - t0}

    if todo:
        with cf.ThreadPoolExecutor(max(1, ctx.workers)) as ex:
            for tf, res in ex.map(one, todo):
                cache[tf] = res
        atomic_write_json(path, cache)  # concurrent builds share the cache: unique temporary files
    return cache


# ---- validation -----------------------------------------------------------------------------------

class Skip(Exception):
    """A candidate that does not make a valid task; the message is the logged reason."""


_combo_lock = threading.Lock()


def combined_gold_collect_errors(cb: Codebase, env_id: str, test_files: list[str], ctx: BuildContext) -> set[str]:
    """Test files that fail to collect on the gold state when `test_files` run in one session.

    The per-file gold runs cannot see files that break each other's collection; cached per
    combination on the build context.
    """
    key = tuple(sorted(test_files))
    with _combo_lock:
        if key in ctx.combined_gold:
            return ctx.combined_gold[key]
    r = run_tests(_probe(cb, env_id, list(key), {}, ctx.verify_timeout_s, ctx.limits), "", canary=False,
                  restore_protected=False)
    bad = {k[len("collect:"):].split("::")[0] for k, v in r.outcomes.items()
           if k.startswith("collect:") and v != "passed"}
    with _combo_lock:
        ctx.combined_gold[key] = bad
    return bad


def validate_candidate(cb: Codebase, cand: Candidate, env_id: str, gold: dict, ctx: BuildContext,
                       split: str) -> TaskRecord:
    t0 = time.monotonic()
    pristine = {p: read_source(cb, p) for p in cand.new_texts}
    for p, text in cand.new_texts.items():
        try:
            compile(text, p, "exec")
        except SyntaxError as e:
            raise Skip(f"mutation is not valid Python: {e}")
        if text == pristine[p]:
            raise Skip("mutation changes nothing")
    broken_patch = make_patch(pristine, cand.new_texts)
    test_files = sorted({t for p in cand.new_texts for t in cb.tests_for(p)})
    for attempt in range(2):
        hidden = {t: read_source(cb, t) for t in test_files}
        stable = sorted({i for t in test_files for i in gold.get(t, {}).get("stable", [])})
        if not stable:
            raise Skip("no stable test covers the changed files")
        probe = _probe(cb, env_id, test_files, hidden, ctx.verify_timeout_s, ctx.limits)
        # A mutation can make tests hang: allow a few times the gold run's wall time, not the full timeout.
        gold_s = sum(gold.get(t, {}).get("wall_s", 0.0) for t in test_files) / GOLD_RUNS
        limit = min(ctx.verify_timeout_s, max(30.0, 4 * gold_s))
        run = run_tests(probe, broken_patch, canary=False, restore_protected=False, timeout_s=limit)
        if run.killed_reason:
            raise Skip(f"broken state: tests {run.killed_reason}")
        if not run.reported:
            raise Skip("broken state: no test report (mutation breaks the runner or import)")
        gold_broken = {i for t in test_files for i in gold.get(t, {}).get("failing", [])}
        if not any(k.startswith("collect:") and k not in gold_broken for k, v in run.outcomes.items()
                   if v != "passed"):
            break
        # A collection error the per-file gold runs did not show: the mutation's, unless these test
        # files also fail to collect on the gold state when run together (e.g. a warning turned
        # into an error by the sdist's `filterwarnings = error` only in a shared session).
        interfering = combined_gold_collect_errors(cb, env_id, test_files, ctx)
        if attempt or not interfering:
            raise Skip("mutation breaks import (collection error)")
        test_files = [t for t in test_files if t not in interfering]
        if not test_files:
            raise Skip("test files fail to collect together on the gold state")
    f2p = [i for i in stable if run.outcomes.get(i) != "passed"]
    p2p = [i for i in stable if run.outcomes.get(i) == "passed"]
    if not f2p:
        raise Skip("no test detects the change")
    gold_patch = make_patch(cand.new_texts, pristine)
    if apply_patch_host(cand.new_texts, gold_patch) != pristine:
        raise Skip("gold patch does not restore the pristine files")
    agent_base = make_patch({**pristine, **hidden}, {**cand.new_texts, **{t: None for t in hidden}})
    task_env = derive_env(env_id, agent_base)
    text = TASK_FAMILIES.get(cand.category).prompt(cand, f2p, random.Random(cand.seed), gold_patch)
    if prompt.leaks(text, gold_patch):
        raise Skip("prompt would leak the solution")
    lines, nfiles = patch_stats(gold_patch)
    iid = f"{cb.name}.{cand.category}.{hashlib.sha256(broken_patch.encode()).hexdigest()[:12]}"
    task = TaskRecord(
        instance_id=iid, source=cb.source, codebase=cb.name, env_id=task_env, category=cand.category,
        subcategory=cand.subcategory, problem_statement=text,
        test=TestSpec("pytest", tuple(cb.test_cmd(test_files)), "/workspace", cb.test_env()),
        timeouts={"agent_s": ctx.agent_timeout_s, "verify_s": ctx.verify_timeout_s}, limits=dict(ctx.limits),
        hidden_tests=HiddenTests(hidden, tuple(f2p), tuple(p2p)), patch=gold_patch,
        protected_paths=DEFAULT_PROTECTED, split=split,
        provenance={"generator": f"c2jax.envs.synth.mutate:{cand.category}", "generator_version": GENERATOR_VERSION,
                    "seed": cand.seed, "functions": [f"{p}:{q}" for p, q, _ in cand.functions]},
        stats={"lines_changed": lines, "files_changed": nfiles, "prompt_chars": len(text),
               "f2p": len(f2p), "p2p": len(p2p)})
    g = grade(task, gold_patch, check_gold=False)
    if not g.resolved:
        raise Skip(f"gold patch does not resolve under the grader: {g.flags} {g.detail[:300]}")
    leaks: list = []
    if ctx.scan_each_task:
        watch = {p: pristine[p] for p in pristine if len(pristine[p]) >= 64}
        watch.update({t: hidden[t] for t in hidden})
        leaks = leakage.scan(task_env, watch, list(cand.new_texts) + test_files)
        if leaks:
            raise Skip(f"leak in the agent's sandbox: {leaks[:3]}")
    validation = {"gold_runs": GOLD_RUNS, "broken_runs": 1, "f2p_fail_before": len(f2p), "p2p_stable": len(p2p),
                  "dropped_flaky": sum(len(gold.get(t, {}).get("flaky", [])) for t in test_files),
                  "gold_resolves": True, "leak_scan": "clean" if ctx.scan_each_task else "codebase-level",
                  "wall_s": round(time.monotonic() - t0, 2)}
    return task.replace(provenance={**task.provenance, "validation": validation})


def drop_test_files(cb: Codebase, gold: dict, max_test_file_s: float
                    ) -> tuple[Codebase, dict, list[str], list[str]]:
    """Drop the test files candidates must not run: (cb, gold, slow, unusable) without them.

    slow: a gold run takes over `max_test_file_s` (every candidate touching it would pay for it).
    unusable: no stable test on the pristine state (e.g. it fails to collect: it needs
    hypothesis). It grades nothing, and run with the others its collection error interrupts the
    whole session, on the gold state too, so every candidate it rides along with was lost.
    """
    slow = [t for t in cb.test_files if gold.get(t, {}).get("wall_s", 0) / GOLD_RUNS > max_test_file_s]
    unusable = [t for t in cb.test_files if t not in slow and not gold.get(t, {}).get("stable")]
    drop = set(slow) | set(unusable)
    if drop:
        gold = {t: g for t, g in gold.items() if t not in drop}
        cb = dataclasses.replace(cb, test_files=[t for t in cb.test_files if t not in drop],
                                 test_map={s: [t for t in ts if t not in drop] for s, ts in cb.test_map.items()})
    return cb, gold, slow, unusable


def build_codebase(cb: Codebase, targets: Targets, ctx: BuildContext, split: str,
                   report: dict[str, Any]) -> list[TaskRecord]:
    """Validated tasks from one codebase; skips and their reasons go to `report`."""
    rep = report.setdefault(cb.name, {"skipped": {}, "accepted": 0, "attempts": 0})
    try:
        env = codebase_env(cb, runner_env(ctx))
        env, hits = hide_env(cb, env)
        rep["hidden_paths"] = len(images.load(env).meta.get("hide", []))
        gold = gold_outcomes(cb, env, ctx)
    except Exception as e:  # noqa: BLE001 - a codebase that fails to build is skipped, reason logged
        rep["error"] = f"{type(e).__name__}: {e}"[:2000]
        log.warning("codebase %s skipped: %s", cb.name, rep["error"])
        return []
    rep["gold"] = {t: {k: (len(v) if isinstance(v, list) else round(v, 2)) for k, v in g.items()} for t, g in gold.items()}
    cb, gold, slow, unusable = drop_test_files(cb, gold, targets.max_test_file_s)
    if slow:  # every candidate touching these would pay for them
        rep["dropped_slow_test_files"] = slow
    if unusable:
        rep["dropped_unusable_test_files"] = unusable
    want = {name: TASK_FAMILIES.get(name).count(targets) for name in TASK_FAMILIES.in_order()}
    got: dict[str, list[TaskRecord]] = {k: [] for k in want}
    seen: set[str] = set()
    base_seed = int(hashlib.sha256(f"{ctx.seed}:{cb.name}".encode()).hexdigest()[:8], 16)
    attempt = 0

    def next_candidate(open_cats: list[str]) -> Candidate | None:
        nonlocal attempt
        while attempt < targets.max_attempts:
            seed = base_seed + attempt
            attempt += 1
            cat = open_cats[attempt % len(open_cats)]
            cand = make_candidate(cb, cat, random.Random(seed), targets, gold, seed)  # by TASK_FAMILIES
            if cand is None:
                rep["skipped"]["no candidate"] = rep["skipped"].get("no candidate", 0) + 1
                continue
            key = hashlib.sha256(json.dumps(sorted(cand.new_texts.items())).encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            return cand
        return None

    def validate(cand: Candidate) -> TaskRecord | str:
        try:
            return validate_candidate(cb, cand, env, gold, ctx, split)
        except Skip as e:
            return str(e).split(":")[0][:80]
        except Exception as e:  # noqa: BLE001 - infra trouble on one candidate: log it, go on
            rep.setdefault("errors", []).append(f"{type(e).__name__}: {e}"[:500])
            return f"error: {type(e).__name__}"

    # Candidates are drawn in seed order and validated `workers` at a time; results are accepted
    # in candidate order, so the task set does not depend on thread timing.
    with cf.ThreadPoolExecutor(max(1, ctx.workers)) as ex:
        while True:
            open_cats = [k for k in want if len(got[k]) < want[k]]
            if not open_cats:
                break
            batch = []
            need = sum(want[k] - len(got[k]) for k in open_cats)
            for _ in range(min(max(1, ctx.workers), need)):
                cand = next_candidate(open_cats)
                if cand is not None:
                    batch.append(cand)
            if not batch:
                break
            for cand, res in zip(batch, ex.map(validate, batch)):
                if isinstance(res, str):
                    rep["skipped"][res] = rep["skipped"].get(res, 0) + 1
                elif len(got[res.category]) < want[res.category]:
                    got[res.category].append(res)
    rep["attempts"] = attempt
    tasks = [t for k in want for t in got[k]]
    rep["accepted"] = len(tasks)
    return tasks


def enforce_mix(tasks: list[TaskRecord], max_codebase_share: float, min_deletion_share: float,
                deletion_min_lines: int = 50, deletion_min_files: int = 2) -> list[TaskRecord]:
    """Drop tasks (deterministically, from the largest codebases / non-deletions first) until no
    codebase holds more than `max_codebase_share` and big feature deletions make up at least
    `min_deletion_share`. Returns the kept tasks; raises ValueError if the shares cannot be met."""
    def big(t: TaskRecord) -> bool:
        return (t.category == "feature_deletion" and t.stats.get("lines_changed", 0) >= deletion_min_lines
                and t.stats.get("files_changed", 0) >= deletion_min_files)

    kept = sorted(tasks, key=lambda t: t.instance_id)
    while True:
        n = len(kept)
        if n == 0:
            raise ValueError("no tasks left while enforcing the mix")
        counts: dict[str, int] = {}
        for t in kept:
            counts[t.codebase] = counts.get(t.codebase, 0) + 1
        worst = max(counts, key=lambda c: (counts[c], c))
        if counts[worst] > max_codebase_share * n + 1e-9:
            if len(counts) * max_codebase_share < 1 - 1e-9:
                raise ValueError(f"{len(counts)} codebases cannot satisfy a {max_codebase_share:.0%} cap")
            victims = [t for t in kept if t.codebase == worst]
            victims.sort(key=lambda t: (big(t), t.instance_id))
            kept.remove(victims[0])
            continue
        nbig = sum(big(t) for t in kept)
        if nbig < min_deletion_share * n - 1e-9:
            others = [t for t in kept if not big(t)]
            if not others or nbig == 0:
                raise ValueError(f"only {nbig} feature deletions of >= {deletion_min_lines} lines; cannot reach "
                                 f"{min_deletion_share:.0%}")
            others.sort(key=lambda t: (-counts[t.codebase], t.instance_id))
            kept.remove(others[0])
            continue
        return kept


def difficulty_filter(tasks: list[TaskRecord], pass_rate: Callable[[TaskRecord], float],
                      lo: float = 0.0, hi: float = 1.0) -> list[TaskRecord]:
    """Keep tasks a reference policy solves sometimes but not always: lo < rate < hi (the RL
    distribution needs reward variance within a group). `pass_rate(task)` is the hook, e.g. the
    fraction of k rollouts of a reference policy that `grade` resolves."""
    out = []
    for t in tasks:
        r = float(pass_rate(t))
        if lo < r < hi:
            out.append(t.replace(provenance={**t.provenance, "difficulty": {"ref_policy_pass_rate": r}}))
    return out
