"""Tampering from inside the test process earns nothing — and each route, with the defences that
stop it switched off, earns the full reward (positive control).

The agent's code under test is imported by the hidden tests, so whatever it runs at import runs in
pytest's process: patching pytest's reports, patching unittest, rewriting the report at exit,
exit-code tricks, skipping, crashing, hanging, exhausting memory.
"""
from __future__ import annotations

import pytest

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from _envs_common import needs_root
from _grading_tamper_common import (SELECTIVE_ATEXIT, UNITTEST_PASS, agent_diff, assert_earns, assert_nothing,
                                    module_of, task, with_defences_off)  # noqa: F401
from c2jax.envs.grading import grade, run_tests

pytestmark = needs_bwrap

PATCH_REPORTS = ("\n\nimport sys as _s\nif '_pytest.reports' in _s.modules:\n"
                 "    from _pytest.reports import TestReport as _TR\n    _orig = _TR.__init__\n\n"
                 "    def _init(self, *a, **k):\n        _orig(self, *a, **k)\n"
                 "        self.outcome = 'passed'\n        self.longrepr = None\n\n    _TR.__init__ = _init\n")


def test_patching_pytest_reports_from_the_code_under_test_is_caught_by_the_canary(task):
    diff = agent_diff(task, {}, {module_of(task): PATCH_REPORTS})
    r = grade(task, diff)
    assert_nothing(r, "tamper:canary")
    assert r.f2p_fraction == 0.0 and r.outcomes["<canary>"] == "passed"
    assert_earns(with_defences_off(task, diff, "canary"))


def test_monkeypatching_unittest_is_caught_by_the_unittest_canary(task):
    """TestCase.run swallowing failures leaves bare-assert tests alone: before the unittest-style
    canary existed this route earned the reward against the real grader."""
    diff = agent_diff(task, {}, {module_of(task): UNITTEST_PASS})
    r = grade(task, diff)
    assert_nothing(r, "tamper:canary")
    assert r.outcomes["<canary>"] == "failed" and r.outcomes["<canary2>"] == "passed", r.outcomes
    assert_earns(with_defences_off(task, diff, "canary"))


def test_rewriting_the_report_at_exit_earns_nothing(task):
    """A canary-aware atexit hook (it spares the canaries, recognised from their source) beats the
    canary whenever the report is a file; the private stderr channel leaves it nothing to rewrite."""
    diff = agent_diff(task, {}, {module_of(task): SELECTIVE_ATEXIT})
    r = grade(task, diff)
    assert_nothing(r)
    assert r.f2p_fraction < 1.0 and r.outcomes["<canary>"] == "failed" and r.outcomes["<canary2>"] == "failed"
    assert_earns(with_defences_off(task, diff, "private_report"))  # with the canary on: it is spared


def test_exit_code_tricks_earn_nothing(task):
    """Outcomes come from the report, never from the exit status: exiting 0 early (no report) or
    at exit after failing tests (honest report) both score 0, though an exit-code grader pays both."""
    for code, flag in (("\nimport os as _o\n_o._exit(0)\n", "no_report"),
                       ("\nimport atexit as _a, os as _o\n_a.register(lambda: _o._exit(0))\n", None)):
        diff = agent_diff(task, {}, {module_of(task): code})
        r = grade(task, diff)
        assert_nothing(r, *([flag] if flag else []))
        assert r.f2p_fraction < 1.0  # (a test that runs the module in a subprocess may pass: it exits 0 too)
        assert run_tests(task, diff).exit_code == 0  # positive control: what an exit-code grader sees


def test_a_second_report_line_is_tamper(task):
    """Code that learns the nonce and the channel (here: read out of the reporter's module, which
    in-process code can always reach) and writes its own report makes two tagged lines; the grader
    refuses both."""
    forge = ("\n\nimport json as _j, os as _o, sys as _s\n_m = _s.modules.get('c2jax_report')\n"
             "if _m is not None and _m._NONCE:\n"
             "    _o.write(_m._FD, ('\\nC2JAX-REPORT %s %s\\n' % (_m._NONCE, _j.dumps({'tests': {}}))).encode())\n")
    r = grade(task, agent_diff(task, {}, {module_of(task): forge}))
    assert_nothing(r, "tamper:report")


@pytest.mark.parametrize("code", ["\nimport unittest as _u\nraise _u.SkipTest('not today')\n"])
def test_skipping_earns_nothing(task, code):
    r = grade(task, agent_diff(task, {}, {module_of(task): code}))
    assert_nothing(r)  # skipped tests count as failed
    assert r.f2p_fraction == 0.0


def test_hanging_times_out_and_scores_zero(task):
    r = grade(task, agent_diff(task, {}, {module_of(task): "\nwhile True:\n    pass\n"}), timeout_s=6)
    assert_nothing(r, "timeout")


@needs_root  # memory limits need cgroups
def test_exhausting_memory_scores_zero(task):
    small = task.replace(limits={**task.limits, "memory_bytes": 192 << 20})
    r = grade(small, agent_diff(task, {}, {module_of(task): "\n_blob = bytearray(600 << 20)\n"}))
    assert_nothing(r)
    assert "oom" in r.flags or "no_report" in r.flags, r.flags
