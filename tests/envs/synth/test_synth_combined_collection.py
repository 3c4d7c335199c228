"""Test files that break each other's collection on the gold state are not blamed on the mutation.

Two test files with the same basename in directories without `__init__.py` each pass alone, but
in one pytest session the second fails to collect ("import file mismatch"). A candidate whose
tests include both used to be skipped as "mutation breaks import"; now the combined gold run finds
the clash, the interfering file is dropped from the task's test command, and the task validates
(gold resolves it under the grader). A mutation that really breaks collection is still skipped.
"""
from __future__ import annotations

import os

import pytest

from _envs_common import needs_bwrap
from c2jax.envs.synth.build import (BuildContext, Candidate, Skip, codebase_env, combined_gold_collect_errors,
                                    gold_outcomes, hide_env, runner_env, validate_candidate)
from c2jax.envs.synth.sources import Codebase, tree_sha256
from c2jax.envs.tasks import Source

pytestmark = needs_bwrap

MOD = '''"""Tiny arithmetic helpers for the collection-clash test."""


def double(x):
    """Twice x."""
    return x * 2


def triple(x):
    """Three times x."""
    return x * 3
'''
TEST_A = "from pkg.mod import double\n\n\ndef test_double():\n    assert double(4) == 8\n"
TEST_B = "from pkg.mod import triple\n\n\ndef test_triple():\n    assert triple(4) == 12\n"
FILES = {"pkg/__init__.py": "", "pkg/mod.py": MOD, "tests/a/test_x.py": TEST_A, "tests/b/test_x.py": TEST_B}
TESTS = ["tests/a/test_x.py", "tests/b/test_x.py"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("clash") / "clash"
    for rel, text in FILES.items():
        os.makedirs(os.path.dirname(root / rel), exist_ok=True)
        (root / rel).write_text(text)
    src = Source("installed", "clash", "1.0", tree_sha256(str(root), sorted(FILES)), "MIT")
    cb = Codebase("clash", src, str(root), ["pkg/mod.py"], list(TESTS), {"pkg/mod.py": list(TESTS)}, "", ["pkg"])
    ctx = BuildContext(str(tmp_path_factory.mktemp("ctx")), workers=1)
    env, _ = hide_env(cb, codebase_env(cb, runner_env(ctx)))
    gold = gold_outcomes(cb, env, ctx)
    return cb, env, gold, ctx


def test_each_file_passes_alone_but_not_together(built):
    cb, env, gold, ctx = built
    assert gold["tests/a/test_x.py"]["stable"] == ["tests/a/test_x.py::test_double"]
    assert gold["tests/b/test_x.py"]["stable"] == ["tests/b/test_x.py::test_triple"]
    bad = combined_gold_collect_errors(cb, env, TESTS, ctx)
    assert bad == {"tests/b/test_x.py"}  # the second module named test_x: "import file mismatch"
    assert ctx.combined_gold[tuple(TESTS)] == bad  # cached per combination


def test_interfering_file_is_dropped_and_the_task_validates(built):
    cb, env, gold, ctx = built
    broken = MOD.replace("return x * 2", "return x * 2 + 1")
    cand = Candidate("bug_injection", "constant", {"pkg/mod.py": broken}, [("pkg/mod.py", "double", "Twice x.")], 7)
    task = validate_candidate(cb, cand, env, gold, ctx, "train")
    assert task.test.cmd[-1] == "tests/a/test_x.py" and "tests/b/test_x.py" not in task.test.cmd
    assert task.hidden_tests.FAIL_TO_PASS == ("tests/a/test_x.py::test_double",)
    assert set(task.hidden_tests.files) == {"tests/a/test_x.py"}


def test_a_mutation_that_breaks_import_is_still_skipped(built):
    cb, env, gold, ctx = built
    broken = MOD.replace('"""Tiny arithmetic', 'raise ImportError("boom")\n"""Tiny arithmetic')
    cand = Candidate("bug_injection", "remove_stmt", {"pkg/mod.py": broken}, [("pkg/mod.py", "double", "")], 8)
    with pytest.raises(Skip, match="mutation breaks import"):
        validate_candidate(cb, cand, env, gold, ctx, "train")
