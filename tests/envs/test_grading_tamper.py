"""Every tampering route of the grading design earns nothing; infrastructure failures are masked.

Each test writes what a reward-hacking agent would write into its sandbox, takes the sandbox's
diff (as the harness does) and grades it. Routes: editing/adding the hidden tests, conftest.py
hooks, pytest configuration (addopts), sitecustomize/.pth hooks, a shadow `pytest` module, planted
reports, patching the runner from the code under test, rewriting the report at exit, skipping,
crashing, hanging, exhausting memory, unsafe diff paths. Where protection alone stops a route, a
control run without path restoration shows the canary catches it too.
"""
from __future__ import annotations

import os

import pytest

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from c2jax.envs import images, start
from c2jax.envs.grading import _score, diff_paths, grade, run_tests

pytestmark = needs_bwrap


@pytest.fixture
def task(mini_suite):
    _, tasks, _, _ = mini_suite
    return next(t for t in tasks if t.codebase == "stdlib" and t.category == "bug_injection")


def agent_diff(task, files: dict[str, str], append: dict[str, str] | None = None) -> str:
    """The diff an agent leaves after writing `files` and appending to existing ones."""
    with start(task.env_id, timeout_s=60) as sb:
        for p, text in files.items():
            sb.write_file(p, text)
        for p, text in (append or {}).items():
            sb.write_file(p, sb.read_file(p) + text)
        return sb.diff()


def module_of(task) -> str:
    return sorted(diff_paths(task.patch)[0])[0]


def assert_nothing(r, *flags):
    assert r.reward == 0.0 and not r.resolved and not r.masked, r
    assert r.f2p_fraction < 1.0 or r.tampered, r
    for f in flags:
        assert any(x.startswith(f) for x in r.flags), (f, r.flags)


def test_gold_resolves_and_null_does_not(task):
    g = grade(task, task.patch)
    assert g.resolved and g.reward == 1.0 and g.f2p_fraction == 1.0 and g.p2p_regressions == 0 and not g.flags
    assert g.outcomes["<canary>"] == "failed"
    n = grade(task, "")
    assert_nothing(n)
    assert n.f2p_fraction == 0.0 and not n.flags


def test_rewriting_the_hidden_tests_earns_nothing(task):
    test_file = sorted(task.hidden_tests.files)[0]
    names = {i.split("::")[-1] for i in task.hidden_tests.FAIL_TO_PASS if i.startswith(test_file)}
    fake = "import unittest\n\n\nclass T(unittest.TestCase):\n" + "".join(
        f"    def {n}(self):\n        pass\n\n" for n in sorted(names))
    r = grade(task, agent_diff(task, {test_file: fake}))
    assert_nothing(r, "protected_restored")


def test_conftest_hook_earns_nothing_and_the_canary_sees_it(task):
    hook = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n")
    diff = agent_diff(task, {"conftest.py": hook, "tests/conftest.py": hook})
    assert_nothing(grade(task, diff), "protected_restored:2")
    control = _score(task, run_tests(task, diff, restore_protected=False))  # if protection were missing
    assert_nothing(control, "tamper:canary")


@pytest.mark.parametrize("name, text", [
    ("pytest.ini", "[pytest]\naddopts = -p no:c2jax_report -k nothing_matches\n"),
    ("setup.cfg", "[tool:pytest]\naddopts = --deselect tests\n"),
    ("tox.ini", "[pytest]\naddopts = -x --co\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '--co'\n"),
])
def test_runner_configuration_earns_nothing(task, name, text):
    assert_nothing(grade(task, agent_diff(task, {name: text})), "protected_restored")


def test_interpreter_hooks_and_shadow_runner_earn_nothing(task):
    fake_pytest = ("import json, os, sys\nids = %r\njson.dump({'exitstatus': 0, 'tests': {i: 'passed' for i in ids}},"
                   " open(os.environ['C2JAX_REPORT'], 'w'))\nsys.exit(0)\n"
                   % list(task.hidden_tests.FAIL_TO_PASS + task.hidden_tests.PASS_TO_PASS))
    files = {"pytest.py": fake_pytest, "sitecustomize.py": "import builtins\n", "usercustomize.py": "x = 1\n",
             "evil.pth": "import os\n", ".c2jax/report-0.json": '{"tests": {}}', ".c2jax/c2jax_report.py": "\n"}
    diff = agent_diff(task, files)
    r = grade(task, diff)
    assert_nothing(r, "protected_restored:6")
    control = _score(task, run_tests(task, diff, restore_protected=False))  # the fake runner, unprotected
    assert_nothing(control, "tamper:canary")  # it cannot know the canary's random name


def test_patching_the_runner_from_the_code_under_test_is_caught_by_the_canary(task):
    patch_runner = ("\n\nimport sys as _s\nif '_pytest.reports' in _s.modules:\n"
                    "    from _pytest.reports import TestReport as _TR\n    _orig = _TR.__init__\n\n"
                    "    def _init(self, *a, **k):\n        _orig(self, *a, **k)\n"
                    "        self.outcome = 'passed'\n        self.longrepr = None\n\n    _TR.__init__ = _init\n")
    r = grade(task, agent_diff(task, {}, {module_of(task): patch_runner}))
    assert_nothing(r, "tamper:canary")
    assert r.f2p_fraction == 0.0 and r.outcomes["<canary>"] == "passed"


def test_rewriting_the_report_at_exit_is_caught_by_the_canary(task):
    at_exit = ("\n\nimport atexit as _ax, json as _js, os as _os\n\ndef _fix():\n"
               "    p = _os.environ.get('C2JAX_REPORT')\n    if p and _os.path.exists(p):\n"
               "        d = _js.load(open(p))\n        d['tests'] = {k: 'passed' for k in d['tests']}\n"
               "        _js.dump(d, open(p, 'w'))\n\n_ax.register(_fix)\n")
    assert_nothing(grade(task, agent_diff(task, {}, {module_of(task): at_exit})), "tamper:canary")


@pytest.mark.parametrize("code, flag", [
    ("\nimport unittest as _u\nraise _u.SkipTest('not today')\n", None),       # skipped tests count as failed
    ("\nimport os as _o\n_o._exit(0)\n", "no_report"),                           # crash before any report
])
def test_skipping_and_crashing_earn_nothing(task, code, flag):
    r = grade(task, agent_diff(task, {}, {module_of(task): code}))
    assert_nothing(r, *([flag] if flag else []))
    assert r.f2p_fraction == 0.0


def test_hanging_times_out_and_scores_zero(task):
    r = grade(task, agent_diff(task, {}, {module_of(task): "\nwhile True:\n    pass\n"}), timeout_s=6)
    assert_nothing(r, "timeout")


@pytest.mark.skipif(os.geteuid() != 0, reason="memory limits need cgroups (root)")
def test_exhausting_memory_scores_zero(task):
    small = task.replace(limits={**task.limits, "memory_bytes": 192 << 20})
    r = grade(small, agent_diff(task, {}, {module_of(task): "\n_blob = bytearray(600 << 20)\n"}))
    assert_nothing(r)
    assert "oom" in r.flags or "no_report" in r.flags, r.flags


def test_unsafe_diffs_are_rejected(task, tmp_path):
    good = task.patch
    for bad in (good.replace("a/", "a//etc/", 1).replace("b/", "b//etc/", 1),
                good.replace("a/", "a/../", 1).replace("b/", "b/../", 1),
                "diff --git a/lnk b/lnk\nnew file mode 120000\n--- /dev/null\n+++ b/lnk\n@@ -0,0 +1 @@\n+/etc\n"
                "\\ No newline at end of file\n"):
        r = grade(task, bad)
        assert_nothing(r, "unsafe_diff")
    # a path going through a symlink of the base
    env = images.new_layer_env(task.env_id, lambda d: (os.makedirs(d), os.symlink("/etc", os.path.join(d, "lnk"))))
    through = task.replace(env_id=env)
    diff = "diff --git a/lnk/x.py b/lnk/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/lnk/x.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert_nothing(grade(through, diff), "unsafe_diff")
    r = grade(task, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert_nothing(r, "diff_does_not_apply")


def test_infrastructure_failures_are_masked(task):
    r = grade(task.replace(env_id="env-doesnotexist0000000000000000"), task.patch)
    assert r.masked and r.flags == ["infra:sandbox"]
    # a failure the gold patch reproduces is the environment's fault, not the agent's
    broken_gold = task.replace(instance_id=task.instance_id + ".bg", patch="")
    r = grade(broken_gold, agent_diff(task, {"notes.txt": "tried\n"}))
    assert r.masked and "infra:gold_fails" in r.flags
