"""Grading: a fresh sandbox from the task's base + the agent's diff, protected paths restored, hidden
tests added, then the task's tests; returns reward terms and flags.

    from c2jax.envs.grading import grade
    result = grade(task, diff)          # diff: the agent's git patch (Sandbox.diff())
    result.reward, result.resolved, result.f2p_fraction, result.p2p_regressions, result.flags
    result.masked                       # True: infrastructure failure, exclude from training/eval

Order of operations:
1. The diff's paths are checked on the host: absolute paths, `..` components, paths under a
   symlink of the base and diffs that create symlinks are rejected (`unsafe_diff`, reward 0).
2. A new sandbox starts from `task.env_id` (the agent's base: broken code, hidden tests absent);
   the files the diff touches that match `task.protected_paths` are read from the base first.
3. `git apply` inside the sandbox (patches are untrusted data). Protected paths the diff touched
   are then restored from the base, or deleted if the diff created them (`protected_restored:N`).
   New top-level modules that would shadow the stdlib or the runner on the test command's import
   path (`unittest.py`, `iniconfig.py`, ...) are deleted (`shadow_removed:N`).
4. The hidden test files (and hidden test patch) are written, plus a pytest reporting plugin and
   randomly named *canary* tests that must fail (a bare-assert one, and a unittest one when the
   file uses unittest), appended to a hidden test file.
5. The test command runs with a clean environment (no PYTEST_ADDOPTS, plugin autoload off);
   the plugin writes one outcome per test id as a nonce-tagged line on the process's original
   stderr at session end (a report file could be rewritten by atexit hooks or leftover children).
   Skipped, xfailed, errored or unreported tests count as failed. A passing (or unreported) canary
   means the runner was patched: reward 0, flag `tamper:canary` (two tagged lines: `tamper:report`)
   — unless the canaries' file failed to collect (the agent's code does not import): reward 0,
   f2p_fraction 0, flag `collection_error`.
The defences are switchable one by one (`grading_guards.Defences`) so that tests can show each
tampering route earning the reward without them; see grading_guards for what they cannot stop.
Reward terms: `resolved` (all FAIL_TO_PASS and PASS_TO_PASS pass), `f2p_fraction`,
`p2p_regressions`. Infrastructure failures (sandbox start/exec errors, failures before the agent's
code runs, or a failure reproduced on the gold patch) set `masked=True`; timeouts, OOM, crashes or
a missing report under the agent's diff score 0 with a flag. A timeout is first settled: the diff is
graded again, and a second timeout is the diff's only while the gold patch runs in time
(`_settle_timeout`; else masked, `infra:timeout`), so a loaded machine is not scored as the policy.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import secrets
import time
from typing import Any, Iterable, Mapping

from c2jax.envs.errors import SandboxError
from c2jax.envs.tasks import TaskRecord

from c2jax.envs.grading_guards import (ALL_DEFENCES, CTL_DIR, REPORT_PLUGIN, Defences, add_canaries,  # noqa: F401
                                      import_dirs, parse_report, shadow_entries)


@dataclasses.dataclass
class GradeResult:
    """Reward terms and flags of one graded diff.

    reward: 1.0 if resolved and untampered, else 0.0 (masked results also carry 0.0: skip them).
    resolved: every FAIL_TO_PASS and PASS_TO_PASS test passed.
    f2p_fraction: FAIL_TO_PASS tests passing / their count (0 when tampered or the canary's file
      failed to collect).
    p2p_regressions: PASS_TO_PASS tests not passing.
    masked: infrastructure failure; exclude the sample instead of scoring it.
    flags: e.g. "unsafe_diff", "diff_does_not_apply", "protected_restored:2", "tamper:canary",
      "collection_error", "timeout", "oom", "crash", "no_report", "infra:<reason>".
    outcomes: test id -> passed | failed | skipped | xfailed | xpassed | error | missing.
    """

    reward: float
    resolved: bool
    f2p_fraction: float
    p2p_regressions: int
    masked: bool = False
    flags: list[str] = dataclasses.field(default_factory=list)
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    duration_s: float = 0.0
    detail: str = ""

    @property
    def tampered(self) -> bool:
        return any(f.startswith("tamper") for f in self.flags)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["tampered"] = self.tampered
        return d


# ---- diff inspection ----------------------------------------------------------------------------

_GIT_HEADER = re.compile(r'^diff --git (?:"?a/(.*?)"?) (?:"?b/(.*?)"?)$')


def diff_paths(diff: str) -> tuple[set[str], list[str]]:
    """(paths a git/unified diff touches, problems found) — problems make the diff unsafe."""
    paths: set[str] = set()
    problems: list[str] = []
    for line in diff.splitlines():
        cands: list[str] = []
        if line.startswith("diff --git "):
            m = _GIT_HEADER.match(line)
            if not m:
                problems.append(f"unparsable header {line[:200]!r}")
                continue
            cands = [m.group(1), m.group(2)]
        elif line.startswith(("--- ", "+++ ")):
            p = line[4:].split("\t")[0].strip().strip('"')
            if p == "/dev/null":
                continue
            if p.startswith(("a/", "b/")):
                p = p[2:]
            else:
                problems.append(f"path without a/ or b/ prefix: {p[:200]!r}")
            cands = [p]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            cands = [line.split(" ", 2)[2]]
        elif line.startswith(("new file mode 120000", "new mode 120000")):
            problems.append("the diff creates a symlink")
        for p in cands:
            if p.startswith("/") or "\\" in p:
                problems.append(f"absolute path {p[:200]!r}")
            elif ".." in p.split("/") or p.startswith("~"):
                problems.append(f"path with '..' {p[:200]!r}")
            else:
                paths.add(p)
    return paths, problems


def is_protected(path: str, globs: Iterable[str]) -> bool:
    """True if workspace-relative `path` matches a protected glob (`**` spans directories)."""
    for g in globs:
        if fnmatch.fnmatchcase(path, g):
            return True
        if g.startswith("**/") and fnmatch.fnmatchcase(path, g[3:]):
            return True
        if g.endswith("/**") and (path == g[:-3] or fnmatch.fnmatchcase(path, g[:-3] + "/*")):
            return True
    return False


def _through_symlink(env_id: str, path: str) -> bool:
    """True if some ancestor directory of `path` is a symlink in the environment's base."""
    import os

    from c2jax.envs import images

    layers = images.load(env_id).layers
    parts = path.split("/")
    for i in range(1, len(parts)):
        host = images.lookup(layers, "/".join(parts[:i]))
        if host is None:
            return False
        if os.path.islink(host):
            return True
    return False


# ---- running tests in a sandbox -----------------------------------------------------------------

@dataclasses.dataclass
class TestRun:
    """What one test-command run produced."""

    outcomes: dict[str, str]
    reported: bool
    exit_code: int
    killed_reason: str | None
    duration_s: float
    output_tail: str
    flags: list[str]
    canary: str | None = None  # the first canary's id (all of them: `canaries`)
    reward: float | None = None  # script runner
    canaries: list[str] = dataclasses.field(default_factory=list)

    __test__ = False


def run_tests(task: TaskRecord, diff: str = "", *, canary: bool = True, restore_protected: bool = True,
              timeout_s: float | None = None, env_id: str | None = None,
              defences: Defences | None = None) -> TestRun:
    """Start a sandbox over `env_id` (default the task's), apply `diff`, restore protected paths,
    remove shadow modules, add the hidden tests (+ canaries), run the task's test command and
    collect per-test outcomes.

    defences: which defences run (default: all, except those `canary=False` /
      `restore_protected=False` switch off — the task builder's gold probes run without them).
    Raises SandboxError for infrastructure failures; `ValueError` if `diff` does not apply.
    """
    from c2jax.envs import start

    d = defences or ALL_DEFENCES
    if not canary:
        d = d.without("canary")
    if not restore_protected:
        d = d.without("restore_protected")
    env_id = env_id or task.env_id
    touched, _ = diff_paths(diff) if diff.strip() else (set(), [])
    protected_touched = sorted(p for p in touched if is_protected(p, task.protected_paths)) \
        if d.restore_protected else []
    shadows = shadow_entries(touched, import_dirs(task.test.workdir, dict(task.test.env))) \
        if d.remove_shadows and task.test.runner == "pytest" else []
    shadows = [p for p in shadows if not _in_base(env_id, p)]  # the base's own modules are the task's
    flags: list[str] = []
    limits = dict(task.limits)
    limits.setdefault("timeout_s", float(task.timeouts.get("verify_s", 600)))
    t_verify = float(timeout_s or task.timeouts.get("verify_s", 600))
    limits["timeout_s"] = t_verify
    limits["lifetime_s"] = max(float(limits.get("lifetime_s", 0)), t_verify + 120)
    # the private report arrives on stderr: keep enough of it (the report follows pytest's own output)
    limits["output_bytes"] = max(int(limits.get("output_bytes", 0)), 64 << 20)
    limits["output_kill_bytes"] = max(int(limits.get("output_kill_bytes", 1 << 30)), limits["output_bytes"])
    with start(env_id, limits) as sb:
        base_files: dict[str, bytes | None] = {}
        for p in protected_touched:
            try:
                base_files[p] = sb.read_file(p, binary=True)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError):
                base_files[p] = None
        if diff.strip():
            r = sb.exec(["git", "apply", "--binary", "--whitespace=nowarn", "-"],
                        stdin=diff.encode("utf-8", "surrogateescape"), timeout=120)
            if r.exit_code != 0:
                raise ValueError(f"diff does not apply: {r.stderr.strip()[:1000]}")
        if protected_touched:
            to_delete = [p for p, data in base_files.items() if data is None]
            for p, data in base_files.items():
                if data is not None:
                    sb.exec(["rm", "-rf", "--", p])  # the diff may have made it a directory
                    sb.write_file(p, data)
            if to_delete:
                sb.exec(["rm", "-rf", "--", *to_delete])
            flags.append(f"protected_restored:{len(protected_touched)}")
        if shadows:
            sb.exec(["rm", "-rf", "--", *shadows])
            flags.append(f"shadow_removed:{len(shadows)}")
        sb.exec(["rm", "-rf", "--", CTL_DIR])
        hidden = dict(task.hidden_tests.files)
        if not d.overwrite_hidden:  # (defence off) keep the workspace's copy where there is one
            present = sb.exec(["sh", "-c", 'for p; do [ -e "$p" ] && printf "%s\\n" "$p"; done; true', "sh",
                               *hidden]).stdout.split("\n") if hidden else []
            hidden = {p: t for p, t in hidden.items() if p not in present}
        for p in hidden:
            sb.exec(["rm", "-rf", "--", p])
        canaries: list[str] = []
        if d.canary and task.test.runner == "pytest":
            target = next((p for p in sorted(hidden) if p.endswith(".py")), None)
            if target is None:  # no hidden file: a file of its own next to the first F2P test
                first = task.hidden_tests.FAIL_TO_PASS[0].split("::")[0]
                dname = first.rsplit("/", 1)[0] + "/" if "/" in first else ""
                target = f"{dname}test_{secrets.token_hex(4)}.py"
                hidden[target] = ""
            hidden[target], canaries = add_canaries(target, hidden[target])
        for p, text in hidden.items():
            sb.write_file(p, text)
        if task.hidden_tests.patch.strip():
            r = sb.exec(["git", "apply", "--binary", "--whitespace=nowarn", "-"],
                        stdin=task.hidden_tests.patch.encode(), timeout=120)
            if r.exit_code != 0:
                raise SandboxError(f"hidden test patch does not apply: {r.stderr.strip()[:500]}")
        nonce = secrets.token_hex(8)
        env = dict(task.test.env)
        cmd = list(task.test.cmd)
        if task.test.runner == "pytest":
            sb.write_file(f"{CTL_DIR}/c2jax_report.py", REPORT_PLUGIN)
            report = f"{CTL_DIR}/report-{nonce}.json"
            pp = env.get("PYTHONPATH", "")
            env.update({"PYTHONPATH": f"/workspace/{CTL_DIR}" + (":" + pp if pp else ""),
                        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONNOUSERSITE": "1",
                        "PYTHONDONTWRITEBYTECODE": "1"})
            env.update({"C2JAX_REPORT_NONCE": nonce} if d.private_report else {"C2JAX_REPORT": f"/workspace/{report}"})
            cmd += ["-p", "c2jax_report", "-p", "no:cacheprovider"]  # no -o: --strict-config rejects it
            if canaries:
                cmd.append(canaries[0].split("::")[0])
        else:
            report = task.test.report.lstrip("/")
            if report.startswith("workspace/"):
                report = report[len("workspace/"):]
            sb.exec(["rm", "-rf", "--", report])
            if "/" in report:
                sb.exec(["mkdir", "-p", "--", report.rsplit("/", 1)[0]])
        res = sb.exec(cmd, timeout=t_verify, env=env, cwd=task.test.workdir)
        stderr = res.stderr
        if task.test.runner == "pytest" and d.private_report:  # the report line is not output
            stderr = re.sub(rf"^C2JAX-REPORT {nonce} .*$\n?", "", stderr, flags=re.M)
        tail = (res.stdout[-3000:] + "\n" + stderr[-2000:]).strip()
        if res.killed_reason:
            flags.append(res.killed_reason if res.killed_reason in ("timeout", "oom") else "crash")
        outcomes: dict[str, str] = {}
        reported = False
        reward = None
        if task.test.runner == "pytest" and d.private_report:
            parsed, problem = parse_report(res.stderr, nonce)
            if problem:
                flags.append(problem)
            else:
                outcomes, reported = parsed or {}, True
            return TestRun(outcomes, reported, res.exit_code, res.killed_reason, res.duration_s, tail, flags,
                           canaries[0] if canaries else None, None, canaries)
        try:
            raw = sb.read_file(report, max_bytes=64 << 20)
            if task.test.runner == "pytest":
                data = json.loads(raw)
                outcomes = {str(k): str(v) for k, v in dict(data.get("tests", {})).items()}
            else:
                text = raw.strip()
                if report.endswith(".json"):
                    vals = json.loads(text)
                    reward = float(vals.get("reward", min(vals.values()))) if isinstance(vals, dict) else float(vals)
                else:
                    reward = float(text.split()[0])
            reported = True
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError, ValueError, TypeError,
                AttributeError, IndexError):
            flags.append("no_report")
        return TestRun(outcomes, reported, res.exit_code, res.killed_reason, res.duration_s, tail, flags,
                       canaries[0] if canaries else None, reward, canaries)


def _in_base(env_id: str, path: str) -> bool:
    """True if workspace-relative `path` exists in the environment's base (files or directories)."""
    import os

    from c2jax.envs import images

    host = images.lookup(images.load(env_id).layers, path)
    return host is not None and os.path.lexists(host)


_gold_cache: dict[tuple[str, str], TestRun] = {}


def score_run(task: TaskRecord, run: TestRun) -> GradeResult:
    """Reward terms and flags of one `run_tests` result (what `grade` returns for it)."""
    flags = list(run.flags)
    f2p, p2p = task.hidden_tests.FAIL_TO_PASS, task.hidden_tests.PASS_TO_PASS
    if task.test.runner == "script":
        ok = run.reported and run.reward is not None and run.reward >= 1.0 and not run.killed_reason
        frac = max(0.0, min(1.0, run.reward or 0.0)) if run.reported and not run.killed_reason else 0.0
        return GradeResult(1.0 if ok else 0.0, ok, frac, 0, False, flags,
                           {"reward": str(run.reward)}, run.duration_s, run.output_tail[-2000:])
    outcomes = {t: run.outcomes.get(t, "missing") for t in (*f2p, *p2p)}
    canaries = list(run.canaries) or ([run.canary] if run.canary else [])
    seen = [run.outcomes.get(c, "missing") for c in canaries]
    # Unreported canaries whose file failed to collect (e.g. the agent's code no longer imports)
    # are the agent's error, not a patched runner: no tamper flag, but nothing is trusted either.
    uncollected = bool(canaries) and all(c == "missing" for c in seen) and \
        run.outcomes.get("collect:" + canaries[0].split("::")[0]) == "error"
    if uncollected and run.reported:
        flags.append("collection_error")
    elif any(c in ("passed", "missing") for c in seen) and run.reported:
        flags.append("tamper:canary")
    n_f2p = sum(outcomes[t] == "passed" for t in f2p)
    regress = sum(outcomes[t] != "passed" for t in p2p)
    tampered = any(f.startswith("tamper") for f in flags)
    resolved = (run.reported and not run.killed_reason and not tampered and not uncollected
                and n_f2p == len(f2p) and regress == 0)
    frac = 0.0 if tampered or uncollected or not f2p else n_f2p / len(f2p)
    for i, c in enumerate(seen):
        outcomes["<canary>" if i == 0 else f"<canary{i + 1}>"] = c
    return GradeResult(1.0 if resolved else 0.0, resolved, frac, regress, False, flags, outcomes,
                       run.duration_s, run.output_tail[-2000:])


def grade(task: TaskRecord, diff: str, *, check_gold: bool = True, timeout_s: float | None = None,
          retry_timeouts: bool = True) -> GradeResult:
    """Grade the agent's `diff` against `task` (see the module docstring). Never raises for bad diffs.

    check_gold: when the diff does not resolve the task, grade the gold patch too (cached per task);
      if the gold patch also fails, the failure is the environment's: the result is masked.
    retry_timeouts: a test run that timed out is settled by `_settle_timeout` (the diff's fault only if
      it times out again while the gold patch runs in time); False scores the first timeout 0 at once.
    """
    t0 = time.monotonic()
    diff = diff or ""
    paths, problems = diff_paths(diff)
    if not problems:
        try:
            for p in paths:
                if _through_symlink(task.env_id, p):
                    problems.append(f"path through a symlink {p!r}")
        except SandboxError as e:
            return GradeResult(0.0, False, 0.0, 0, True, ["infra:sandbox"], duration_s=time.monotonic() - t0,
                               detail=str(e)[:2000])
    if problems:
        return GradeResult(0.0, False, 0.0, len(task.hidden_tests.PASS_TO_PASS), False, ["unsafe_diff"],
                           duration_s=time.monotonic() - t0, detail="; ".join(problems[:5]))
    try:
        run = run_tests(task, diff, timeout_s=timeout_s)
    except ValueError as e:
        return GradeResult(0.0, False, 0.0, len(task.hidden_tests.PASS_TO_PASS), False, ["diff_does_not_apply"],
                           duration_s=time.monotonic() - t0, detail=str(e))
    except SandboxError as e:
        return GradeResult(0.0, False, 0.0, 0, True, ["infra:sandbox"], duration_s=time.monotonic() - t0,
                           detail=str(e)[:2000])
    result = score_run(task, run)
    if retry_timeouts and "timeout" in result.flags and not result.tampered:
        result, run = _settle_timeout(task, diff, timeout_s, run)
        if result.masked:
            result.duration_s = time.monotonic() - t0
            return result
    if diff == task.patch and result.resolved:
        _gold_cache[(task.instance_id, task.env_id)] = run
    if check_gold and not result.resolved and not result.tampered and diff != task.patch:
        key = (task.instance_id, task.env_id)
        gold = _gold_cache.get(key)
        if gold is None:
            try:
                gold = run_tests(task, task.patch)  # the task's own verify timeout
            except (ValueError, SandboxError) as e:
                result.masked = True
                result.flags.append("infra:gold_failed")
                result.detail = f"gold patch could not be graded: {e}"[:2000]
                return result
            _gold_cache[key] = gold
        if not score_run(task, gold).resolved:
            result.masked = True
            result.flags.append("infra:gold_fails")
    result.duration_s = time.monotonic() - t0
    return result


def _settle_timeout(task: TaskRecord, diff: str, timeout_s: float | None, first: TestRun
                    ) -> tuple[GradeResult, TestRun]:
    """Whose fault a verify timeout is. The tests of a loaded machine (many sandboxes grading at once)
    can overrun their limit under a correct diff, and scoring that 0 would count an infrastructure
    failure as the policy's. So the diff is graded once more: a run that now finishes stands (flag
    ``retried:timeout``); a second timeout is the diff's (score 0, flag ``timeout``) only if the gold
    patch, run now (not from the cache) under the same limit, finishes and resolves; otherwise the
    machine could not run the tests in time and the result is masked (``infra:timeout``).
    Returns the result and the test run it comes from (the gold cache keeps only a run that resolved)."""
    def masked(reason: str, detail: str = "") -> tuple[GradeResult, TestRun]:
        return GradeResult(0.0, False, 0.0, 0, True, ["timeout", reason], detail=detail[:2000]), first

    try:
        run = run_tests(task, diff, timeout_s=timeout_s)
    except (ValueError, SandboxError) as e:
        return masked("infra:sandbox", str(e))
    again = score_run(task, run)
    if "timeout" not in again.flags:
        again.flags.append("retried:timeout")
        return again, run
    try:
        gold = score_run(task, run_tests(task, task.patch, timeout_s=timeout_s))
    except (ValueError, SandboxError) as e:
        return masked("infra:gold_failed", f"gold patch could not be graded: {e}")
    if "timeout" in gold.flags or not gold.resolved:
        again.masked = True
        again.flags.append("infra:timeout")
    return again, run


def grade_many(task: TaskRecord, diffs: Iterable[str], **kw: Any) -> list[GradeResult]:
    """Grade several diffs of one task (e.g. the k samples behind pass@k)."""
    return [grade(task, d, **kw) for d in diffs]


def summarize(results: Iterable[GradeResult]) -> Mapping[str, Any]:
    """Counts of a batch of results: graded, masked, resolved, tampered."""
    rs = list(results)
    live = [r for r in rs if not r.masked]
    return {"n": len(rs), "masked": len(rs) - len(live), "resolved": sum(r.resolved for r in live),
            "tampered": sum(r.tampered for r in live)}
