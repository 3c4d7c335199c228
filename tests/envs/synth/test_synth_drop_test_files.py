"""Test files without a stable gold test (or too slow) are kept out of every task's test command.

idna ships tests/test_idna_properties.py, which needs hypothesis (absent in the runner venv): it
failed to collect, and since every idna source maps to every test file, its collection error
interrupted each grading session on the gold patch too (53 of 54 idna candidates lost).
"""
from __future__ import annotations

from c2jax.envs.synth.build import GOLD_RUNS, drop_test_files
from c2jax.envs.synth.sources import Codebase
from c2jax.envs.tasks import Source


def _cb(tests, tmap):
    return Codebase("pkg", Source("pypi", "pkg", "1", "0" * 64, "MIT", "x"), "/nonexistent", ["pkg/a.py", "pkg/b.py"],
                    list(tests), tmap)


def test_collection_errors_and_slow_files_are_dropped_everywhere():
    tests = ["tests/test_a.py", "tests/test_props.py", "tests/test_slow.py", "tests/test_b.py"]
    gold = {
        "tests/test_a.py": {"stable": ["tests/test_a.py::t"], "flaky": [], "failing": [], "wall_s": 3.0},
        "tests/test_props.py": {"stable": [], "flaky": [], "failing": ["collect:tests/test_props.py"], "wall_s": 3.0},
        "tests/test_slow.py": {"stable": ["tests/test_slow.py::t"], "flaky": [], "failing": [],
                               "wall_s": 25.0 * GOLD_RUNS},
        "tests/test_b.py": {"stable": ["tests/test_b.py::t"], "flaky": ["tests/test_b.py::f"], "failing": [],
                            "wall_s": 3.0},
    }
    cb = _cb(tests, {"pkg/a.py": ["tests/test_a.py"], "pkg/b.py": list(tests)})
    cb2, gold2, slow, unusable = drop_test_files(cb, gold, 20.0)
    assert slow == ["tests/test_slow.py"] and unusable == ["tests/test_props.py"]
    assert cb2.test_files == ["tests/test_a.py", "tests/test_b.py"]
    assert cb2.tests_for("pkg/b.py") == ["tests/test_a.py", "tests/test_b.py"]
    assert cb2.tests_for("pkg/a.py") == ["tests/test_a.py"]
    assert sorted(gold2) == ["tests/test_a.py", "tests/test_b.py"]
    assert cb.test_files == tests  # the input codebase is not modified
    # a higher per-package limit (more-itertools) keeps the slow file
    _, _, slow, _ = drop_test_files(cb, gold, 60.0)
    assert slow == []


def test_nothing_to_drop_returns_the_same_codebase():
    gold = {"tests/test_a.py": {"stable": ["tests/test_a.py::t"], "flaky": [], "failing": [], "wall_s": 1.0}}
    cb = _cb(["tests/test_a.py"], {})
    cb2, gold2, slow, unusable = drop_test_files(cb, gold, 20.0)
    assert cb2 is cb and gold2 is gold and slow == unusable == []
