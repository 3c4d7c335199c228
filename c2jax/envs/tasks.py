"""Task records: one versioned JSON object per coding task (JSONL files), validated on load.

A task is a repository state the agent starts from (`env_id`, an environment of `c2jax.envs`
holding the *broken* code, with every FAIL_TO_PASS test file absent), a terse prompt, and what the
grader needs and the agent never sees: hidden test files, FAIL_TO_PASS / PASS_TO_PASS test ids and
the gold patch (broken -> solved). Field names follow SWE-bench where one exists.

    from c2jax.envs import start
    from c2jax.envs.grading import grade
    from c2jax.envs.tasks import load_tasks, TaskRecord
    tasks = load_tasks("tasks.jsonl")               # list[TaskRecord], every field checked
    t = tasks[0]
    with start(t.env_id, t.limits) as sb:           # the agent's sandbox (broken code, no hidden tests)
        ...                                         # the agent works on t.problem_statement
        diff = sb.diff()
    result = grade(t, diff)                         # reward terms + flags; skip result.masked samples

Record (schema_version 1):
  instance_id         unique id, [A-Za-z0-9_.:+-]{1,200}
  source              {kind: stdlib|pypi|installed|swebench|harbor, package, version, sha256, license, url}
  codebase            the unit of the per-codebase mix cap and the train/eval split ("stdlib" for
                      every standard-library module)
  env_id              environment the agent's sandbox starts from (broken state, hidden tests absent)
  category            bug_injection | multi_bug | feature_deletion | swebench | harbor
  subcategory         generator detail (e.g. "comparison", "off_by_one"), free text
  problem_statement   the terse prompt
  test                {runner: pytest|script, cmd (argv list), workdir, env (dict), report (script
                      runner: reward file path)}
  timeouts            {agent_s, verify_s}
  limits              sandbox limits for the agent (names of c2jax.envs.Limits)
  hidden_tests        {files: {path: text} added only at grading, patch: git patch added at grading,
                      FAIL_TO_PASS: [test ids], PASS_TO_PASS: [test ids]}
  patch               gold patch (git format, applies to the agent's base)
  protected_paths     globs restored from the base before grading (new matches are deleted)
  provenance          {generator, generator_version, seed, validation: {...}}
  stats               {lines_changed, files_changed, prompt_chars}
  split               train | eval
"""
from __future__ import annotations

import dataclasses
import json
import re
import statistics
from typing import Any, Iterable, Iterator, Mapping, Sequence

from c2jax.atomic import atomic_open

SCHEMA_VERSION = 1
SOURCE_KINDS = ("stdlib", "pypi", "installed", "swebench", "harbor")
CATEGORIES = ("bug_injection", "multi_bug", "feature_deletion", "swebench", "harbor")
RUNNERS = ("pytest", "script")
SPLITS = ("train", "eval")
_ID = re.compile(r"^[A-Za-z0-9_.:+\-]{1,200}$")

# Paths the grader restores from the base (tests, runner configuration, interpreter hooks).
DEFAULT_PROTECTED = (
    "tests/**", "test/**", "testing/**", "**/tests/**", "**/test_*.py", "**/*_test.py",
    "**/conftest.py", "conftest.py", "pytest.ini", "**/pytest.ini", "tox.ini", "setup.cfg",
    "pyproject.toml", ".pytest.ini", "**/sitecustomize.py", "sitecustomize.py", "**/usercustomize.py",
    "usercustomize.py", "**/*.pth", "*.pth", "pytest.py", "_pytest/**", "pluggy/**", "py.py",
    ".c2jax/**",
)


class TaskFormatError(ValueError):
    """A malformed task record; the message names the file, line, record and field."""


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str
    package: str
    version: str
    sha256: str
    license: str
    url: str = ""


@dataclasses.dataclass(frozen=True)
class TestSpec:
    runner: str
    cmd: tuple[str, ...]
    workdir: str = "/workspace"
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    report: str = ""  # script runner: file the test script writes its reward into

    __test__ = False  # not a pytest class


@dataclasses.dataclass(frozen=True)
class HiddenTests:
    files: Mapping[str, str]
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    patch: str = ""


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One validated task (see the module docstring for the fields)."""

    instance_id: str
    source: Source
    codebase: str
    env_id: str
    category: str
    subcategory: str
    problem_statement: str
    test: TestSpec
    timeouts: Mapping[str, float]
    limits: Mapping[str, Any]
    hidden_tests: HiddenTests
    patch: str
    protected_paths: tuple[str, ...]
    provenance: Mapping[str, Any]
    stats: Mapping[str, Any]
    split: str = "train"
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["test"]["cmd"] = list(self.test.cmd)
        d["hidden_tests"]["FAIL_TO_PASS"] = list(self.hidden_tests.FAIL_TO_PASS)
        d["hidden_tests"]["PASS_TO_PASS"] = list(self.hidden_tests.PASS_TO_PASS)
        d["protected_paths"] = list(self.protected_paths)
        return d

    def replace(self, **changes: Any) -> "TaskRecord":
        return dataclasses.replace(self, **changes)


def patch_stats(patch: str) -> tuple[int, int]:
    """(lines changed = added + removed, files changed) of a unified/git patch."""
    lines = files = 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            files += 1
        elif line.startswith(("+++", "---")):
            continue
        elif line.startswith(("+", "-")):
            lines += 1
    if files == 0:
        files = sum(1 for ln in patch.splitlines() if ln.startswith("+++ "))
    return lines, files


# ---- validation ------------------------------------------------------------------------------

class _Check:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, msg: str) -> None:
        raise TaskFormatError(f"{self.where}: field {field!r}: {msg}")

    def get(self, obj: Mapping, key: str, typ, prefix: str = "", default: Any = dataclasses.MISSING):
        name = f"{prefix}{key}"
        if not isinstance(obj, Mapping):
            self.fail(prefix.rstrip(".") or "<record>", "expected an object")
        if key not in obj:
            if default is not dataclasses.MISSING:
                return default
            self.fail(name, "missing")
        v = obj[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            self.fail(name, f"expected {getattr(typ, '__name__', typ)}, got {type(v).__name__}")
        return v

    def str_list(self, obj: Mapping, key: str, prefix: str = "", default: Any = dataclasses.MISSING) -> tuple:
        v = self.get(obj, key, list, prefix, default)
        for i, x in enumerate(v):
            if not isinstance(x, str) or not x:
                self.fail(f"{prefix}{key}[{i}]", "expected a non-empty string")
        return tuple(v)


def record_from_json(obj: Any, where: str = "<record>") -> TaskRecord:
    """Validate one decoded JSON object into a TaskRecord; errors name `where` and the field."""
    c = _Check(where)
    if not isinstance(obj, dict):
        c.fail("<record>", "expected a JSON object")
    iid = c.get(obj, "instance_id", str)
    if not _ID.match(iid):
        c.fail("instance_id", f"{iid!r} must match {_ID.pattern}")
    c.where = f"{where} ({iid})"
    ver = c.get(obj, "schema_version", int, default=SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        c.fail("schema_version", f"unsupported version {ver} (this code reads {SCHEMA_VERSION})")
    known = {f.name for f in dataclasses.fields(TaskRecord)}
    extra = set(obj) - known
    if extra:
        c.fail(sorted(extra)[0], "unknown field")
    s = c.get(obj, "source", dict)
    source = Source(kind=c.get(s, "kind", str, "source."), package=c.get(s, "package", str, "source."),
                    version=c.get(s, "version", str, "source."), sha256=c.get(s, "sha256", str, "source."),
                    license=c.get(s, "license", str, "source."), url=c.get(s, "url", str, "source.", ""))
    if source.kind not in SOURCE_KINDS:
        c.fail("source.kind", f"{source.kind!r} not one of {SOURCE_KINDS}")
    if source.sha256 and not re.fullmatch(r"[0-9a-f]{64}", source.sha256):
        c.fail("source.sha256", "expected 64 lowercase hex digits (or empty)")
    for k in ("package",):
        if not getattr(source, k):
            c.fail(f"source.{k}", "must not be empty")
    category = c.get(obj, "category", str)
    if category not in CATEGORIES:
        c.fail("category", f"{category!r} not one of {CATEGORIES}")
    prompt = c.get(obj, "problem_statement", str)
    if not prompt.strip():
        c.fail("problem_statement", "must not be empty")
    t = c.get(obj, "test", dict)
    runner = c.get(t, "runner", str, "test.")
    if runner not in RUNNERS:
        c.fail("test.runner", f"{runner!r} not one of {RUNNERS}")
    cmd = c.str_list(t, "cmd", "test.")
    if not cmd:
        c.fail("test.cmd", "must not be empty")
    tenv = c.get(t, "env", dict, "test.", {})
    for k, v in tenv.items():
        if not isinstance(v, str):
            c.fail(f"test.env.{k}", "expected a string")
    test = TestSpec(runner, cmd, c.get(t, "workdir", str, "test.", "/workspace"), dict(tenv),
                    c.get(t, "report", str, "test.", ""))
    if runner == "script" and not test.report:
        c.fail("test.report", "a script runner needs the reward file path")
    timeouts = c.get(obj, "timeouts", dict)
    for k in ("agent_s", "verify_s"):
        v = c.get(timeouts, k, float, "timeouts.")
        if not v > 0:
            c.fail(f"timeouts.{k}", "must be > 0")
    limits = c.get(obj, "limits", dict)
    try:
        from c2jax.envs.limits import Limits
        Limits.from_config(limits)
    except (ValueError, TypeError) as e:
        c.fail("limits", str(e))
    h = c.get(obj, "hidden_tests", dict)
    files = c.get(h, "files", dict, "hidden_tests.", {})
    for p, text in files.items():
        if not isinstance(text, str):
            c.fail(f"hidden_tests.files[{p!r}]", "expected file text")
        if p.startswith("/") or ".." in p.split("/") or not p:
            c.fail(f"hidden_tests.files[{p!r}]", "paths must be relative, without '..'")
    f2p = c.str_list(h, "FAIL_TO_PASS", "hidden_tests.")
    p2p = c.str_list(h, "PASS_TO_PASS", "hidden_tests.")
    if runner == "pytest" and not f2p:
        c.fail("hidden_tests.FAIL_TO_PASS", "must name at least one test")
    if set(f2p) & set(p2p):
        c.fail("hidden_tests.PASS_TO_PASS", f"overlaps FAIL_TO_PASS: {sorted(set(f2p) & set(p2p))[:3]}")
    hidden = HiddenTests(dict(files), f2p, p2p, c.get(h, "patch", str, "hidden_tests.", ""))
    patch = c.get(obj, "patch", str)
    split = c.get(obj, "split", str, default="train")
    if split not in SPLITS:
        c.fail("split", f"{split!r} not one of {SPLITS}")
    return TaskRecord(
        instance_id=iid, source=source, codebase=c.get(obj, "codebase", str), env_id=c.get(obj, "env_id", str),
        category=category, subcategory=c.get(obj, "subcategory", str, default=""), problem_statement=prompt,
        test=test, timeouts=dict(timeouts), limits=dict(limits), hidden_tests=hidden, patch=patch,
        protected_paths=c.str_list(obj, "protected_paths", default=list(DEFAULT_PROTECTED)),
        provenance=c.get(obj, "provenance", dict, default={}), stats=c.get(obj, "stats", dict, default={}),
        split=split, schema_version=ver)


def iter_jsonl(path: str) -> Iterator[tuple[int, str, Any]]:
    """(line number, "file:line", decoded value) per non-blank line; bad JSON raises TaskFormatError."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield n, where, json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(f"{where}: not valid JSON ({e})") from None


def load_tasks(path: str) -> list[TaskRecord]:
    """Read and validate a JSONL task file; a bad line raises TaskFormatError naming file:line, field."""
    out, seen = [], {}
    for n, where, obj in iter_jsonl(path):
        rec = record_from_json(obj, where)
        if rec.instance_id in seen:
            raise TaskFormatError(f"{where}: field 'instance_id': duplicate of line {seen[rec.instance_id]}")
        seen[rec.instance_id] = n
        out.append(rec)
    return out


def write_tasks(path: str, tasks: Iterable[TaskRecord]) -> int:
    """Write records as JSONL (atomically); returns the count."""
    n = 0
    with atomic_open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_json(), sort_keys=True) + "\n")
            n += 1
    return n


@dataclasses.dataclass
class Attempt:
    """What a policy hands back for one task: its diff plus the effort it took (graded by `grade`)."""

    diff: str
    tokens: int = 0
    wall_s: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if len(xs) else float("nan")


def stats_table(tasks: Sequence[TaskRecord]) -> dict[str, Any]:
    """Per category (and all): count, median lines/files changed, median prompt characters."""
    groups: dict[str, list[TaskRecord]] = {"all": list(tasks)}
    for t in tasks:
        groups.setdefault(t.category, []).append(t)
        groups.setdefault(f"split:{t.split}", []).append(t)
    out = {}
    for name, ts in groups.items():
        out[name] = {"tasks": len(ts),
                     "median_lines_changed": _median([t.stats.get("lines_changed", 0) for t in ts]),
                     "median_files_changed": _median([t.stats.get("files_changed", 0) for t in ts]),
                     "median_prompt_chars": _median([t.stats.get("prompt_chars", 0) for t in ts]),
                     "median_f2p_tests": _median([len(t.hidden_tests.FAIL_TO_PASS) for t in ts])}
    codebases: dict[str, int] = {}
    for t in tasks:
        codebases[t.codebase] = codebases.get(t.codebase, 0) + 1
    return {"by_group": out, "codebases": codebases, "n_codebases": len(codebases)}
