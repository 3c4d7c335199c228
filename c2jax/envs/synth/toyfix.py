"""toyfix: a learnable coding-task family for RL on tiny models (generated repositories, one bug).

Each task is a tiny generated Python package (1-3 modules, each <= ~25 lines of plain arithmetic /
string / list functions) with a bug, a symptom-only problem statement whose import names the
module to read, hidden pytest tests (FAIL_TO_PASS: the bugged functions' tests, PASS_TO_PASS: the
others) and the gold patch (broken -> fixed) as a git diff, like the other synthesis families.

    from c2jax.envs.synth.toyfix import build_toyfix, demo_messages, TOYFIX_TOOLS
    res = build_toyfix("runs/toyfix", n_train=128, n_eval=64, n_demo=256, difficulty=1, seed=0)
    res["train"], res["eval"], res["demo"]            # task JSONL paths (+ counts, stats, leakage)

Difficulty (`difficulty`):
  0  one module holding ONE function (1-5 body lines); one operator or comparison swapped (`+`/`-`,
     `*`, `//`, `<`/`<=`, `==`/`!=`, `+=`/`-=`): the fix needs reading which operator the code has,
     but copies no name and no constant, so a model without in-context copying can learn it.
  1  one module, 2-3 functions, one one-token bug (operator swap, comparison `<`/`<=`, off-by-one
     constant, wrong variable returned). The level a tiny model must learn.
  2  two modules (one a distractor), two one-token bugs in two functions of the target module.
  3  three modules; one function is a stub (docstring + `raise NotImplementedError`) in one module
     and a one-token bug sits in another module: two files to change.

`repro=True` (generator v6) adds `repro.py` at the repository root, in both states and so in no
patch: it runs the statement's call and prints `ok`, or `got X, want Y` with exit code 1 (validation
checks it tells the two states apart). It is the agent's own check of an edit, the "run tests" step
of the `shell_retry` demonstrations (`toyfix_shell_demos`); the hidden tests stay hidden. The package,
tests and statement are drawn before it, so a seed gives the same task with or without it.

`ambiguous=q` (difficulty 0) builds the imitation-gap variant instead (`toyfix_programs.PICK_ARCHETYPES`):
every task's broken line `v = a + b` was `v = a * b` (probability q) or `v = a - b`, nothing the agent
reads tells which, and the statement gives the symptom without the wanted value. Imitating a
demonstrator who knows the answer solves q^2 + (1 - q)^2 of them; always writing `*` solves q.

No leakage: the training distribution (train.jsonl and demo.jsonl) and the held-out split
(eval.jsonl) draw from disjoint generator seed streams, disjoint identifier vocabularies (package,
module, function and variable names) and disjoint code constants; `leakage_report` checks that no
normalised held-out gold diff occurs in a train/demo task and that replaying the most common train
gold patch on held-out tasks resolves none (real grader).

Validation: every task's hidden tests run on the gold and on the broken state inside a sandbox of
the shared pytest runner environment (batched: one interpreter runs many tasks' test functions,
which is what keeps ~450 tasks within minutes on 2 cores); gold must pass everything, the broken
state must fail exactly the bugged functions' tests. A sample of tasks per split is then graded
end to end with the real grader (`grading.grade`: gold resolves, the untouched state scores 0).
Environments: the runner venv env (`synth.build.runner_env`) + one small content-addressed layer
holding the broken package per task (re-creatable from the record: `materialize_envs`).
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import time
from collections import Counter
from typing import Any, Sequence

from c2jax.atomic import atomic_write_json
from c2jax.envs.tasks import DEFAULT_PROTECTED, HiddenTests, Source, TaskRecord, TestSpec, load_tasks, \
    patch_stats, write_tasks
from c2jax.envs.synth.toyfix_programs import (ARCHETYPES, REPRO_OK, REPRO_PATH, VOCAB, WORDS, Archetype,  # noqa: F401
                                              Candidate, Func, Mutation, make_candidate, module_text, mutations,
                                              vocab_overlap)

log = logging.getLogger(__name__)

GENERATOR_VERSION = "6"
GENERATOR = "c2jax.envs.synth.toyfix"
TOYFIX_TOOLS: tuple[str, ...] = ("read_file", "search_replace", "run_terminal_cmd")
DIFFICULTIES = (0, 1, 2, 3)
STREAMS = ("eval", "train", "demo")  # generation order; demo is a train-distribution stream

def _norm_diff(patch: str) -> str:
    """A gold diff's changed lines, whitespace stripped (headers, hunk lines and context dropped)."""
    keep = []
    for ln in patch.splitlines():
        if ln.startswith(("+++", "---")) or not ln.startswith(("+", "-")):
            continue
        keep.append(ln[0] + "".join(ln[1:].split()))
    return "\n".join(keep)


def _gold_diff_key(pristine: dict[str, str], broken: dict[str, str]) -> str:
    """`_norm_diff(make_patch(broken, pristine))` computed in-process (difflib, no `git diff`
    subprocess): the dedup key of `generate`. tests/envs/synth/test_toyfix.py checks it equals the
    git-made key on generated candidates of every difficulty; the leakage report still checks the
    real patches."""
    import difflib

    keep = []
    for p in sorted(broken):
        if broken[p] == pristine.get(p):
            continue
        for ln in difflib.unified_diff(broken[p].splitlines(), (pristine.get(p) or "").splitlines(), n=0,
                                       lineterm=""):
            if ln.startswith(("+++", "---")) or not ln.startswith(("+", "-")):
                continue
            keep.append(ln[0] + "".join(ln[1:].split()))
    return "\n".join(keep)


# ---- validation in a sandbox (batched) --------------------------------------------------------------

RUNNER = r'''
import contextlib, importlib, importlib.util, io, json, os, runpy, sys
jobs = json.load(sys.stdin)
out = {}
for j in jobs:
    res = {}
    for state in ("gold", "broken"):
        d = os.path.join("/tmp/tfv", j["id"], state)
        for rel, text in list(j[state].items()) + list(j["tests"].items()):
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        for m in [m for m in sys.modules if m == j["pkg"] or m.startswith(j["pkg"] + ".")]:
            del sys.modules[m]
        sys.path.insert(0, d)
        importlib.invalidate_caches()
        outcomes = {}
        for tf in sorted(j["tests"]):
            try:
                spec = importlib.util.spec_from_file_location("tfv_" + j["id"] + "_" + state, os.path.join(d, tf))
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            except BaseException:
                outcomes["collect:" + tf] = "error"
                continue
            for name in sorted(vars(mod)):
                if name.startswith("test_") and callable(getattr(mod, name)):
                    try:
                        getattr(mod, name)()
                        outcomes[tf + "::" + name] = "passed"
                    except BaseException:
                        outcomes[tf + "::" + name] = "failed"
        if os.path.exists(os.path.join(d, "repro.py")):  # the visible reproduction script's output
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    runpy.run_path(os.path.join(d, "repro.py"), run_name="__main__")
                except BaseException:
                    pass
            res[state + ":repro"] = buf.getvalue().strip()
        sys.path.remove(d)
        res[state] = outcomes
    out[j["id"]] = res
sys.stdout.write(json.dumps(out))
'''


def _cand_id(c: Candidate) -> str:
    h = hashlib.sha256(json.dumps([c.broken, c.tests, c.stream], sort_keys=True).encode()).hexdigest()[:12]
    return f"toyfix.d{c.difficulty}.{c.stream}.{h}"


def validate_batch(runner: str, cands: Sequence[Candidate], timeout_s: float = 120.0) -> dict[str, str | None]:
    """Run every candidate's hidden tests on its gold and broken states in one sandbox.

    Returns {candidate id: None (valid) or the reason it is not}. Gold must pass every test; the
    broken state must fail exactly FAIL_TO_PASS and pass PASS_TO_PASS.
    """
    from c2jax.envs import start

    jobs = [{"id": _cand_id(c), "pkg": c.package, "gold": c.pristine, "broken": c.broken, "tests": c.tests}
            for c in cands]
    with start(runner, timeout_s=timeout_s, memory_bytes=1 << 30, pids=64) as sb:
        r = sb.exec(["python", "-c", RUNNER], stdin=json.dumps(jobs).encode(), timeout=timeout_s)
    if r.exit_code != 0 or r.killed_reason:
        if len(cands) == 1:
            return {_cand_id(cands[0]): f"runner failed: {r.killed_reason or r.exit_code}"}
        out: dict[str, str | None] = {}
        for c in cands:  # find the culprit one by one
            out.update(validate_batch(runner, [c], timeout_s=20.0))
        return out
    got = json.loads(r.stdout)
    verdict: dict[str, str | None] = {}
    for c in cands:
        cid = _cand_id(c)
        res = got.get(cid, {})
        gold, broken = res.get("gold", {}), res.get("broken", {})
        ids = set(c.f2p) | set(c.p2p)
        if set(gold) != ids or any(v != "passed" for v in gold.values()):
            verdict[cid] = f"gold state does not pass: {sorted(k for k, v in gold.items() if v != 'passed')[:3]}"
        elif {k for k, v in broken.items() if v != "passed"} != set(c.f2p) or set(broken) != ids:
            verdict[cid] = "broken state fails other tests than FAIL_TO_PASS"
        elif REPRO_PATH in c.broken and (res.get("gold:repro") != REPRO_OK or res.get("broken:repro") == REPRO_OK):
            verdict[cid] = f"repro.py does not tell the states apart: gold {res.get('gold:repro')!r}, " \
                           f"broken {res.get('broken:repro')!r}"
        else:
            verdict[cid] = None
    return verdict


# ---- records and environments -----------------------------------------------------------------------

TEST_PREFIX = ("python", "-m", "pytest", "-q", "-rN", "--tb=line", "-p", "no:cacheprovider")
LIMITS = {"timeout_s": 60.0, "memory_bytes": 1 << 30, "pids": 128, "cpus": 1.0}
TIMEOUTS = {"agent_s": 300.0, "verify_s": 60.0}


def task_env(runner: str, files: dict[str, str]) -> str:
    """The runner env + one layer holding the agent's base (broken package); content-addressed."""
    from c2jax.envs import images

    key = hashlib.sha256(json.dumps([runner, sorted(files.items())]).encode()).hexdigest()[:32]

    def fill(dst: str) -> None:
        for rel, text in files.items():
            p = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8", newline="") as f:
                f.write(text)

    return images.new_layer_env(runner, fill, env_id="tfx-" + key, extra_meta={"codebase": "toyfix"})


def _record(c: Candidate, env_id: str, validation: dict) -> TaskRecord:
    from c2jax.envs.synth.patches import make_patch

    changed = sorted(p for p in c.broken if c.broken[p] != c.pristine[p])
    gold = make_patch({p: c.broken[p] for p in changed}, {p: c.pristine[p] for p in changed})
    lines, nfiles = patch_stats(gold)
    split = "eval" if c.stream == "eval" else "train"
    test_files = sorted(c.tests)
    return TaskRecord(
        instance_id=_cand_id(c), source=Source("installed", "toyfix", GENERATOR_VERSION, "", "generated"),
        codebase=f"toyfix-{split}", env_id=env_id,
        category="multi_bug" if len(c.bugs) > 1 else "bug_injection",
        subcategory="+".join(sorted({b["kind"] for b in c.bugs})), problem_statement=c.statement,
        test=TestSpec("pytest", TEST_PREFIX + tuple(test_files), "/workspace", {}),
        timeouts=dict(TIMEOUTS), limits=dict(LIMITS),
        hidden_tests=HiddenTests(dict(c.tests), tuple(c.f2p), tuple(c.p2p)), patch=gold,
        protected_paths=DEFAULT_PROTECTED, split=split,
        provenance={"generator": GENERATOR, "generator_version": GENERATOR_VERSION, "seed": c.seed,
                    "stream": c.stream, "difficulty": c.difficulty, "package": c.package, "bugs": c.bugs,
                    "repo": dict(c.broken), "validation": validation},
        stats={"lines_changed": lines, "files_changed": nfiles, "prompt_chars": len(c.statement),
               "f2p": len(c.f2p), "p2p": len(c.p2p), "modules": len(c.broken) - 1})


def is_toyfix(task: TaskRecord) -> bool:
    return task.provenance.get("generator") == GENERATOR


def materialize_envs(tasks: Sequence[TaskRecord], ctx_dir: str | None = None) -> dict[str, Any]:
    """Re-create the missing environments of toyfix tasks from their records (the broken package is
    in provenance.repo); others are left alone. Returns {"recreated": [...], "failed": {iid: why}}."""
    from c2jax.envs.images import env_exists

    todo = [t for t in tasks if is_toyfix(t) and not env_exists(t.env_id)]
    rep: dict[str, Any] = {"recreated": [], "failed": {}}
    if not todo:
        return rep
    import tempfile

    from c2jax.envs.synth.build import BuildContext, runner_env

    runner = runner_env(BuildContext(ctx_dir or tempfile.mkdtemp(prefix="c2jax-toyfix-")))
    for t in todo:
        got = task_env(runner, dict(t.provenance["repo"]))
        if got != t.env_id:
            rep["failed"][t.instance_id] = f"re-created environment {got} != record's {t.env_id}"
        else:
            rep["recreated"].append(got)
    return rep


# ---- leakage ---------------------------------------------------------------------------------------

def leakage_report(train: Sequence[TaskRecord], eval_: Sequence[TaskRecord], demo: Sequence[TaskRecord] = (),
                   replay: int = 4) -> dict[str, Any]:
    """Held-out gold diffs vs the training distribution, vocabulary overlap, and (replay > 0) the most
    common train gold patch replayed on `replay` held-out tasks with the real grader."""
    train_like = list(train) + list(demo)
    seen = {_norm_diff(t.patch): t.instance_id for t in train_like}
    eval_in_train = [t.instance_id for t in eval_ if _norm_diff(t.patch) in seen]
    train_ids = {t.instance_id for t in train}
    demo_in_train = [t.instance_id for t in demo if t.instance_id in train_ids]
    train_norm = {_norm_diff(t.patch) for t in train}
    demo_diff_in_train = [t.instance_id for t in demo if _norm_diff(t.patch) in train_norm]
    rep: dict[str, Any] = {"eval_diffs_in_train": eval_in_train, "demo_ids_in_train": demo_in_train,
                           "demo_diffs_in_train": demo_diff_in_train, "vocab_overlap": vocab_overlap(),
                           "eval_packages_in_train": sorted({t.provenance.get("package") for t in eval_}
                                                            & {t.provenance.get("package") for t in train_like})}
    if replay and train and eval_:
        from c2jax.envs.grading import grade

        common = Counter(_norm_diff(t.patch) for t in train).most_common(1)[0][0]
        src = next(t for t in train if _norm_diff(t.patch) == common)
        results = [grade(t, src.patch, check_gold=False) for t in list(eval_)[:replay]]
        rep["replay"] = {"patch_of": src.instance_id, "graded": len(results),
                         "resolved": sum(r.resolved for r in results),
                         "mean_reward": sum(r.reward for r in results) / len(results),
                         "flags": sorted({f for r in results for f in r.flags})}
    rep["ok"] = not (eval_in_train or demo_in_train or demo_diff_in_train or rep["vocab_overlap"]
                     or rep["eval_packages_in_train"] or rep.get("replay", {}).get("resolved", 0))
    return rep


# ---- the builder -----------------------------------------------------------------------------------

def _seed(seed: int, stream: str, difficulty: int, i: int) -> int:
    return int(hashlib.sha256(f"toyfix:{seed}:{stream}:{difficulty}:{i}".encode()).hexdigest()[:12], 16)


def source_digest(*paths: str) -> str:
    """Digest of the bytes of the given source files, in order."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _code_digest() -> str:
    """Digest of the generator's code (this module and the programs it builds tasks from)."""
    from c2jax.envs.synth import toyfix_programs

    return source_digest(__file__, toyfix_programs.__file__)


def generator_key() -> str:
    """What the generated tasks depend on besides `build_toyfix`'s arguments: the generator's version
    and code. Caches of things made from a family (its directory, its demonstrations, a checkpoint
    trained on them) include it, so a changed generator never reuses another generator's tasks."""
    return f"{GENERATOR_VERSION}-{_code_digest()}"


def generate(stream: str, n: int, difficulty: int, seed: int, taken: dict[str, str], start: int = 0,
             docstrings: bool = False, repro: bool = False, ambiguous: float = 0.0) -> tuple[list[Candidate], int]:
    """Up to `n` host-checked candidates of `stream` (updates `taken`: normalised gold diff -> stream
    that took it); returns (candidates, next attempt index).

    Train and eval candidates have pairwise distinct gold diffs, across and within the two streams.
    Demo candidates never share a gold diff with train or eval, but may repeat one among themselves
    when the programs differ (another function name, header or line): at difficulty 0 the distinct
    one-line fixes of the train vocabulary run out at a few hundred, and a demonstration set of
    thousands needs the same fix seen in many programs to teach reading rather than recall."""
    out: list[Candidate] = []
    i = start
    limit = start + 50 * max(n, 1) + 100
    while len(out) < n and i < limit:
        c = make_candidate(stream, _seed(seed, stream, difficulty, i), difficulty, docstrings, repro, ambiguous)
        i += 1
        if c is None:
            continue
        key = _gold_diff_key(c.pristine, c.broken)
        owner = taken.get(key)
        if owner is not None and not (stream == "demo" and owner == "demo"):
            continue
        if stream == "demo":
            cid = _cand_id(c)  # "toyfix.d..." never collides with a diff key (lines start with + or -)
            if cid in taken:
                continue
            taken[cid] = "demo"  # the program itself, so no round repeats it
        taken[key] = stream
        out.append(c)
    return out, i


def build_toyfix(out_dir: str, *, n_train: int, n_eval: int, n_demo: int, difficulty: int = 1, seed: int = 0,
                 docstrings: bool = False, repro: bool = False, ambiguous: float = 0.0,
                 workers: int = 2, grader_checks: int = 2, batch_size: int = 64) -> dict:
    """Build the toyfix suite into `out_dir` (see the module docstring); cached.

    Writes tasks.jsonl (train + eval), train.jsonl, eval.jsonl, demo.jsonl, stats.json,
    leakage.json and, last, done.json (the completion marker: a suite without it, or with another
    key, is rebuilt). grader_checks: tasks per stream also graded end to end by the real grader.
    Returns {"tasks", "train", "eval", "demo", "stats", "leakage": paths, "n_train", "n_eval",
    "n_demo", "wall_s", "cached": bool, "key"}.
    """
    from c2jax.envs.synth.build import BuildContext, runner_env

    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty}")
    t0 = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{k}.jsonl") for k in ("tasks", "train", "eval", "demo")}
    paths["stats"] = os.path.join(out_dir, "stats.json")
    paths["leakage"] = os.path.join(out_dir, "leakage.json")
    done_path = os.path.join(out_dir, "done.json")
    runner = runner_env(BuildContext(out_dir))
    args = {"n_train": n_train, "n_eval": n_eval, "n_demo": n_demo, "difficulty": difficulty, "seed": seed,
            "grader_checks": grader_checks, **({"docstrings": True} if docstrings else {}),
            **({"repro": True} if repro else {}), **({"ambiguous": float(ambiguous)} if ambiguous else {})}
    key = hashlib.sha256(json.dumps([args, GENERATOR_VERSION, _code_digest(), runner],
                                    sort_keys=True).encode()).hexdigest()[:16]
    if os.path.exists(done_path):
        try:
            with open(done_path) as f:
                done = json.load(f)
        except (OSError, json.JSONDecodeError):
            done = {}
        if done.get("key") == key and all(os.path.exists(p) for p in paths.values()):
            everything = load_tasks(paths["tasks"]) + load_tasks(paths["demo"])
            materialize_envs(everything, out_dir)  # an environment cache cleaned since: re-create
            return {**paths, **{k: done["counts"][k] for k in ("n_train", "n_eval", "n_demo")},
                    "wall_s": round(time.monotonic() - t0, 3), "cached": True, "key": key}
        os.remove(done_path)
    want = {"eval": n_eval, "train": n_train, "demo": n_demo}
    taken: dict[str, str] = {}
    accepted: dict[str, list[Candidate]] = {s: [] for s in STREAMS}
    rejected: Counter = Counter()
    next_i = {s: 0 for s in STREAMS}
    timing: dict[str, float] = {}
    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        for _round in range(5):
            t1 = time.monotonic()
            fresh: list[Candidate] = []
            for s in STREAMS:
                need = want[s] - len(accepted[s])
                if need > 0:
                    got, next_i[s] = generate(s, need, difficulty, seed, taken, next_i[s], docstrings, repro,
                                              ambiguous)
                    fresh += got
            timing["generate_s"] = timing.get("generate_s", 0) + time.monotonic() - t1
            if not fresh:
                break
            t1 = time.monotonic()
            per = max(1, min(batch_size, -(-len(fresh) // max(1, workers))))
            batches = [fresh[i:i + per] for i in range(0, len(fresh), per)]
            verdicts: dict[str, str | None] = {}
            for v in ex.map(lambda b: validate_batch(runner, b), batches):
                verdicts.update(v)
            timing["validate_s"] = timing.get("validate_s", 0) + time.monotonic() - t1
            for c in fresh:
                why = verdicts.get(_cand_id(c), "not run")
                if why is None and len(accepted[c.stream]) < want[c.stream]:
                    accepted[c.stream].append(c)
                elif why is not None:
                    rejected[why.split(":")[0]] += 1
            if all(len(accepted[s]) >= want[s] for s in STREAMS):
                break
    t1 = time.monotonic()
    validation = {"runner": "batched-in-sandbox", "gold_passes": True, "broken_fails_f2p_only": True}
    records: dict[str, list[TaskRecord]] = {
        s: [_record(c, task_env(runner, c.broken), validation) for c in accepted[s]] for s in STREAMS}
    timing["records_s"] = time.monotonic() - t1
    # end-to-end spot check with the real grader: gold resolves, the untouched state scores 0
    t1 = time.monotonic()
    from c2jax.envs.grading import grade

    checks = [t for s in STREAMS for t in records[s][:grader_checks]]

    def check(t: TaskRecord) -> str | None:
        g = grade(t, t.patch, check_gold=False)
        n = grade(t, "", check_gold=False)
        if not g.resolved or g.masked:
            return f"gold not resolved: {g.flags} {g.detail[:200]}"
        if n.resolved or n.f2p_fraction != 0.0 or n.p2p_regressions:
            return f"broken state: resolved={n.resolved} f2p={n.f2p_fraction} p2p_regr={n.p2p_regressions}"
        return None

    problems = [f"{t.instance_id}: {why}" for t, why in zip(checks, ex_map(check, checks, workers)) if why]
    timing["grader_checks_s"] = time.monotonic() - t1
    for s in STREAMS:
        if len(records[s]) < want[s]:
            problems.append(f"{s}: {len(records[s])} tasks < {want[s]}")
    if problems:
        raise RuntimeError("toyfix build failed: " + "; ".join(problems[:5]))
    graded = {t.instance_id for t in checks}
    records = {s: [t.replace(provenance={**t.provenance, "validation": {
        **t.provenance["validation"], "grader_checked": t.instance_id in graded}}) for t in ts]
        for s, ts in records.items()}
    t1 = time.monotonic()
    leak = leakage_report(records["train"], records["eval"], records["demo"], replay=min(4, len(records["eval"])))
    timing["leakage_s"] = time.monotonic() - t1
    if not leak["ok"]:
        raise RuntimeError(f"toyfix leakage check failed: { {k: v for k, v in leak.items() if v} }")
    from c2jax.envs.tasks import stats_table

    main_tasks = records["train"] + records["eval"]
    stats = stats_table(main_tasks)
    stats["demo"] = stats_table(records["demo"])["by_group"]["all"] if records["demo"] else {}
    stats["subcategories"] = dict(Counter(t.subcategory for t in main_tasks + records["demo"]))
    stats["difficulty"] = difficulty
    stats["rejected"] = dict(rejected)
    stats["timing_s"] = {k: round(v, 2) for k, v in timing.items()}
    write_tasks(paths["tasks"], main_tasks)
    write_tasks(paths["train"], records["train"])
    write_tasks(paths["eval"], records["eval"])
    write_tasks(paths["demo"], records["demo"])
    wall = round(time.monotonic() - t0, 2)
    stats["wall_s"] = wall
    for p, obj in ((paths["stats"], stats), (paths["leakage"], leak)):
        atomic_write_json(p, obj, indent=1)
    counts = {"n_train": len(records["train"]), "n_eval": len(records["eval"]), "n_demo": len(records["demo"])}
    atomic_write_json(done_path, {"key": key, "args": args, "counts": counts, "wall_s": wall}, indent=1)
    log.info("toyfix d%d: %s in %.1f s (%s)", difficulty, counts, wall, stats["timing_s"])
    return {**paths, **counts, "wall_s": wall, "cached": False, "key": key}


def ex_map(fn, items: Sequence, workers: int) -> list:
    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        return list(ex.map(fn, items))


DEFAULT_SIZES = {"n_eval": 64, "n_train": 128, "n_demo": 256, "difficulty": 1}


def make_suite_tasks(out_dir: str, *, workers: int = 2, seed: int = 0, **overrides: Any
                     ) -> tuple[list[TaskRecord], dict[str, Any], dict[str, Any]]:
    """The `python -m c2jax.bench build --suite toyfix` entry: default sizes; returns (tasks of
    tasks.jsonl, stats, report) like `bench.build.build_suite`."""
    res = build_toyfix(out_dir, workers=workers, seed=seed, **{**DEFAULT_SIZES, **overrides})
    tasks = load_tasks(res["tasks"])
    with open(res["stats"]) as f:
        stats = json.load(f)
    report = {"suite": "toyfix", "seed": seed, "wall_s": res["wall_s"], "cached": res["cached"], "problems": [],
              "counts": {k: res[k] for k in ("n_train", "n_eval", "n_demo")}, "demo": res["demo"]}
    with open(os.path.join(out_dir, "build_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    return tasks, stats, report


# ---- scripted demonstrations ------------------------------------------------------------------------

def repro_command(task: TaskRecord) -> str:
    """Shell command running every reproducer of the statement (prints the results)."""
    bugs = task.provenance["bugs"]
    return " && ".join(f'python -c "{b["import"]}; print({b["call"]})"' for b in bugs)


def demo_messages(task: TaskRecord) -> list:
    """Assistant turns of a scripted expert episode on a toyfix task (for `ScriptedPolicy`):
    read the module(s) named in the statement, `search_replace` each buggy line (stub) by the fix,
    run the statement's reproducer(s), then a short final message. Tools: `TOYFIX_TOOLS`."""
    from c2jax.data.chat_format import Message, ToolCall, make_call_id

    bugs = task.provenance["bugs"]
    idx = 0

    def call(name: str, **args: Any) -> ToolCall:
        nonlocal idx
        c = ToolCall(make_call_id(name, idx), name, json.dumps(args))
        idx += 1
        return c

    files = list(dict.fromkeys(b["path"] for b in bugs))
    read = Message("assistant", "", [call("read_file", target_file=p) for p in files])
    edit = Message("assistant", "", [call("search_replace", file_path=b["path"], old_string=b["old"],
                                          new_string=b["new"]) for b in bugs])
    run = Message("assistant", "", [call("run_terminal_cmd", command=repro_command(task))])
    final = Message("assistant", "Fixed: " + "; ".join(f"{b['call']} now returns {b['want']}" for b in bugs) + ".")
    return [read, edit, run, final]
