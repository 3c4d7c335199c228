"""Tampering routes that work through files the agent leaves in its workspace earn nothing — and
each one, with the defences that stop it switched off, earns the full reward (positive control).

Routes: replacing the hidden test file, a conftest.py hook, pytest configuration loading a plugin
(pytest.ini / setup.cfg / tox.ini / pyproject.toml), a shadow `pytest.py` runner, a shadow stdlib
`unittest.py`, sitecustomize.py on a PYTHONPATH directory, and writes outside the workspace (the
venv, $HOME) that the grading sandbox never sees. Unsafe diff paths and infrastructure masking are
here too. In-process routes (patching from the code under test, exit tricks, hangs) are in
tests/envs/test_grading_tamper_runtime.py.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from _grading_tamper_common import (PASS_HOOK, SHADOW_UNITTEST, UNITTEST_PASS, agent_diff, assert_earns,
                                    assert_nothing, task, with_defences_off)  # noqa: F401
from c2jax.envs import images, start
from c2jax.envs.grading import grade

pytestmark = needs_bwrap


def test_gold_resolves_and_null_does_not(task):
    g = grade(task, task.patch)
    assert g.resolved and g.reward == 1.0 and g.f2p_fraction == 1.0 and g.p2p_regressions == 0 and not g.flags
    assert g.outcomes["<canary>"] == "failed" and g.outcomes["<canary2>"] == "failed"  # bare assert + unittest
    n = grade(task, "")
    assert_nothing(n)
    assert n.f2p_fraction == 0.0 and not n.flags


def test_replacing_the_hidden_tests_earns_nothing(task):
    test_file = sorted(task.hidden_tests.files)[0]
    names = {i.split("::")[-1] for i in task.hidden_tests.FAIL_TO_PASS + task.hidden_tests.PASS_TO_PASS
             if i.startswith(test_file)}
    classes = {i.split("::")[1] for i in task.hidden_tests.FAIL_TO_PASS if i.count("::") == 2}
    assert len(classes) == 1, classes  # the task's tests are methods of one TestCase
    fake = f"import unittest\n\n\nclass {classes.pop()}(unittest.TestCase):\n" + "".join(
        f"    def {n}(self):\n        pass\n\n" for n in sorted(names))
    diff = agent_diff(task, {test_file: fake})
    assert_nothing(grade(task, diff), "protected_restored")
    # Positive control: a grader that keeps the workspace's copy of the test file pays for it.
    assert_earns(with_defences_off(task, diff, "restore_protected", "overwrite_hidden", "canary"))
    # Restoration alone stops it (the hidden file is written over the agent's either way).
    assert_nothing(with_defences_off(task, diff, "overwrite_hidden", "canary"), "protected_restored")


def test_conftest_hook_earns_nothing_and_the_canary_sees_it(task):
    diff = agent_diff(task, {"conftest.py": PASS_HOOK, "tests/conftest.py": PASS_HOOK})
    assert_nothing(grade(task, diff), "protected_restored:2")
    assert_nothing(with_defences_off(task, diff, "restore_protected"), "tamper:canary")
    assert_earns(with_defences_off(task, diff, "restore_protected", "canary"))


@pytest.mark.parametrize("name, text", [
    ("pytest.ini", "[pytest]\naddopts = -p evil_plugin\n"),
    ("setup.cfg", "[tool:pytest]\naddopts = -p evil_plugin\n"),
    ("tox.ini", "[pytest]\naddopts = -p evil_plugin\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '-p evil_plugin'\n"),
])
def test_runner_configuration_loading_a_plugin_earns_nothing(task, name, text):
    diff = agent_diff(task, {name: text, "evil_plugin.py": PASS_HOOK})
    assert_nothing(grade(task, diff), "protected_restored:1")
    assert_earns(with_defences_off(task, diff, "restore_protected", "canary"))


def test_shadow_pytest_runner_earns_nothing(task):
    """A workspace `pytest.py` runs instead of pytest under `python -m pytest` (cwd first on sys.path).
    It knows the report channel (nonce or file path) from its environment, so only removing it helps;
    the canary catches it when it does not read the canaries out of the test file."""
    ids = list(task.hidden_tests.FAIL_TO_PASS + task.hidden_tests.PASS_TO_PASS)
    fake = ("import json, os, sys\nd = json.dumps({'exitstatus': 0, 'tests': {i: 'passed' for i in %r}})\n"
            "if os.environ.get('C2JAX_REPORT_NONCE'):\n"
            "    sys.stderr.write('\\nC2JAX-REPORT %%s %%s\\n' %% (os.environ['C2JAX_REPORT_NONCE'], d))\n"
            "else:\n    open(os.environ['C2JAX_REPORT'], 'w').write(d)\nsys.exit(0)\n" % ids)
    diff = agent_diff(task, {"pytest.py": fake})
    r = grade(task, diff)
    assert_nothing(r, "protected_restored:1", "shadow_removed:1")
    assert_nothing(with_defences_off(task, diff, "restore_protected"), "shadow_removed:1")
    assert_nothing(with_defences_off(task, diff, "restore_protected", "remove_shadows"), "tamper:canary")
    assert_earns(with_defences_off(task, diff, "restore_protected", "remove_shadows", "canary"))


def test_shadow_stdlib_unittest_earns_nothing(task):
    """`unittest.py` is not a protected path; it is removed because it shadows the stdlib."""
    diff = agent_diff(task, {"unittest.py": SHADOW_UNITTEST})
    assert_nothing(grade(task, diff), "shadow_removed:1")
    r = with_defences_off(task, diff, "remove_shadows")
    assert_nothing(r, "tamper:canary")
    assert r.outcomes["<canary>"] == "failed" and r.outcomes["<canary2>"] == "passed"  # only the unittest canary sees it
    assert_earns(with_defences_off(task, diff, "remove_shadows", "canary"))


def test_sitecustomize_on_a_pythonpath_directory_earns_nothing(task):
    """sitecustomize.py runs at interpreter start when its directory is on PYTHONPATH (a task whose
    test command puts the workspace there). A `.pth` file is only read from site directories, which
    the workspace never is, so it is no route; both are protected paths anyway."""
    on_path = task.replace(test=dataclasses.replace(task.test, env={"PYTHONPATH": "/workspace"}))
    diff = agent_diff(task, {"sitecustomize.py": UNITTEST_PASS, "evil.pth": "import os\n"})
    assert_nothing(grade(on_path, diff), "protected_restored:2")
    assert_nothing(with_defences_off(on_path, diff, "restore_protected"), "tamper:canary")
    assert_earns(with_defences_off(on_path, diff, "restore_protected", "canary"))


def test_writes_outside_the_workspace_never_reach_grading(task):
    """The venv is mounted read-only; $HOME and /tmp are writable but only /workspace is diffed."""
    with start(task.env_id, timeout_s=60) as sb:
        site = sb.exec(["python", "-c", "import _pytest, os; print(os.path.dirname(_pytest.__file__))"]).stdout.strip()
        assert site.startswith("/env/"), site
        r = sb.exec(["sh", "-c", f"echo 'raise SystemExit(0)' >> {site}/runner.py"])
        assert r.exit_code != 0 and "Read-only" in r.stderr, r  # the venv's pytest cannot be patched
        home = sb.exec(["sh", "-c", "echo $HOME"]).stdout.strip()
        r = sb.exec(["sh", "-c", f"mkdir -p {home}/.local/lib/python3.11/site-packages && "
                     f"echo 'import os' > {home}/.local/lib/python3.11/site-packages/usercustomize.py && "
                     "echo x > /tmp/planted.txt && echo y > /workspace/planted.txt"])
        assert r.exit_code == 0, r  # the writes themselves succeed ...
        diff = sb.diff()
    assert "planted.txt" in diff and "/workspace/planted.txt" not in diff  # positive control: workspace is carried
    assert "usercustomize" not in diff and "/tmp" not in diff  # ... but nothing outside the workspace is


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
