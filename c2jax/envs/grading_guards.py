"""The grader's defences that live inside the test run: the reporting plugin and its private
channel, the canary tests, and the removal of modules that shadow the interpreter or the runner.

Each defence can be switched off one at a time through `Defences` (production grading runs with
all of them on): tests/envs/test_grading_tamper*.py switch the relevant ones off to show that every
tampering route they cover really earns the reward without them (a positive control), so a test
of the defence cannot pass because the attack was broken.

What these defences cannot do (stated, not hidden): the code under test runs in the same process as
pytest, so code that recognises the canaries (their source is public) and patches outcomes only
for the other tests is not caught by them. Canaries are drawn in both assertion styles (a bare
`assert` and, for unittest files, a `TestCase.assertEqual`) with random names, which catches
blanket patches of the runner, of the report or of unittest's assertions.
"""
from __future__ import annotations

import dataclasses
import json
import re
import secrets
import sys
from typing import Iterable

CTL_DIR = ".c2jax"  # grading-only files inside /workspace (a protected path)
REPORT_MARKER = "C2JAX-REPORT"

REPORT_PLUGIN = '''"""c2jax grading reporter: one outcome per test id, written as JSON at session end.

Private channel: at import (before any conftest or test module is imported) it takes the nonce out
of the environment and duplicates the process's original stderr; at session end it writes one
`C2JAX-REPORT <nonce> <json>` line there. What runs later (atexit hooks, leftover children) cannot
change a line the host has already read, and code imported later never sees the nonce in its env.
"""
import json, os

_NONCE = os.environ.pop("C2JAX_REPORT_NONCE", None)
_FD = os.dup(2) if _NONCE else None
_results = {}


def _set(nodeid, outcome):
    order = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 1, "failed": 2, "error": 3}
    old = _results.get(nodeid)
    if old is None or order[outcome] > order[old]:
        _results[nodeid] = outcome


def pytest_runtest_logreport(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            _set(report.nodeid, "xpassed" if report.passed else "xfailed")
        else:
            _set(report.nodeid, report.outcome)
    elif report.failed:
        _set(report.nodeid, "error")
    elif report.skipped:
        _set(report.nodeid, "xfailed" if hasattr(report, "wasxfail") else "skipped")


def pytest_collectreport(report):
    if report.failed:
        _set("collect:" + report.nodeid, "error")


def pytest_sessionfinish(session, exitstatus):
    data = json.dumps({"exitstatus": int(exitstatus), "tests": _results})
    if _FD is not None:
        line = ("\\n%s %s %s\\n" % ("C2JAX-REPORT", _NONCE, data)).encode()
        while line:
            line = line[os.write(_FD, line):]
    path = os.environ.get("C2JAX_REPORT")
    if path:
        with open(path, "w") as f:
            f.write(data)
'''


@dataclasses.dataclass(frozen=True)
class Defences:
    """Which grading defences run. Production grading: all True. A test switches some off to prove
    that a tampering route earns the reward without them (the positive control).

    restore_protected: protected paths the diff touched are restored from the base (or deleted).
    overwrite_hidden: the hidden test files are (re)written after the diff; off, they are written
      only where the workspace has no such file (a grader that trusts the workspace's copy).
    canary: randomly named tests that must fail are added to a hidden test file.
    remove_shadows: new top-level modules that shadow the standard library or the test runner
      (`unittest.py`, `iniconfig.py`, ...) on the test command's import path are deleted.
    private_report: outcomes come from the plugin's nonce-tagged line on the original stderr;
      off, from a report file in the workspace (which the test process can rewrite).
    """

    restore_protected: bool = True
    overwrite_hidden: bool = True
    canary: bool = True
    remove_shadows: bool = True
    private_report: bool = True

    def without(self, *names: str) -> "Defences":
        """A copy with the named defences switched off (unknown names raise ValueError)."""
        fields = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(names) - fields)
        if bad:
            raise ValueError(f"unknown defences {bad}; known: {sorted(fields)}")
        return dataclasses.replace(self, **{n: False for n in names})


ALL_DEFENCES = Defences()

# ---- canaries -----------------------------------------------------------------------------------

_WORDS = ("check", "verify", "regression", "edge", "basic", "roundtrip", "empty", "order", "types", "values")


def _test_name() -> str:
    return f"test_{secrets.choice(_WORDS)}_{secrets.choice(_WORDS)}_{secrets.token_hex(3)}"


def add_canaries(target: str, text: str) -> tuple[str, list[str]]:
    """(`text` with canary tests appended, their test ids in file `target`).

    Always a module-level function with a failing bare `assert`; when the file uses unittest, also
    a `unittest.TestCase` method with a failing `assertEqual` (a blanket patch of unittest's
    assertions leaves bare asserts alone, and a patched assertion rewriter leaves unittest alone).
    """
    a, b = secrets.randbelow(1000), 1000 + secrets.randbelow(1000)
    fn = _test_name()
    out = text.rstrip("\n") + f"\n\n\ndef {fn}():\n    assert [{a}, {b}] == [{b}, {a}], 'ordering check'\n"
    ids = [f"{target}::{fn}"]
    if "unittest" in text:
        cls, meth = f"Test{secrets.choice(_WORDS).title()}{secrets.token_hex(3)}", _test_name()
        alias = f"_ut_{secrets.token_hex(2)}"
        out += (f"\n\nimport unittest as {alias}\n\n\n"
                f"class {cls}({alias}.TestCase):\n"
                f"    def {meth}(self):\n        self.assertEqual([{a}, {b}], [{b}, {a}])\n")
        ids.append(f"{target}::{cls}::{meth}")
    return out, ids


# ---- shadow modules -----------------------------------------------------------------------------

# Imported by `python -m pytest` itself (pytest 7-9 and their dependencies) besides the stdlib.
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup",
                            "tomli", "pygments", "colorama", "c2jax_report"})
SHADOW_NAMES = frozenset(sys.stdlib_module_names) | RUNNER_MODULES
_MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pyd")


def shadow_entries(touched: Iterable[str], import_dirs: Iterable[str]) -> list[str]:
    """Workspace entries (a file or a package directory) among the diff's `touched` paths that would
    be imported instead of a stdlib/runner module, given the workspace-relative `import_dirs` on
    the test command's sys.path ("" is the workspace root)."""
    out: set[str] = set()
    dirs = {d.strip("/") for d in import_dirs}
    for p in touched:
        for d in dirs:
            prefix = d + "/" if d else ""
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):].split("/")
            head = rest[0]
            if len(rest) > 1:
                mod = head  # a package (or namespace package) directory
            elif head.endswith(_MODULE_SUFFIXES):
                mod = head.split(".")[0]
            else:
                continue
            if mod in SHADOW_NAMES:
                out.add(prefix + head)
    return sorted(out)


def import_dirs(workdir: str, env: dict[str, str]) -> list[str]:
    """Workspace-relative directories the test command imports from ahead of the stdlib: its working
    directory (`python -m` puts the cwd first) and PYTHONPATH entries under /workspace."""
    dirs = []
    for d in [workdir, *env.get("PYTHONPATH", "").split(":")]:
        d = d.rstrip("/")
        if d == "/workspace" or d.startswith("/workspace/"):
            dirs.append(d[len("/workspace/"):] if d != "/workspace" else "")
    return sorted(set(dirs))


# ---- the private report -------------------------------------------------------------------------

def parse_report(stderr: str, nonce: str) -> tuple[dict[str, str] | None, str | None]:
    """(outcomes, problem) from the test command's stderr: exactly one line tagged with `nonce`.

    problem: None; "no_report" (no tagged line, or an unparsable one); "tamper:report" (more than
    one tagged line: something else wrote with the nonce).
    """
    lines = re.findall(rf"^{REPORT_MARKER} {re.escape(nonce)} (.*)$", stderr, re.M)
    if len(lines) > 1:
        return None, "tamper:report"
    if not lines:
        return None, "no_report"
    try:
        data = json.loads(lines[0])
        return {str(k): str(v) for k, v in dict(data["tests"]).items()}, None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, "no_report"
