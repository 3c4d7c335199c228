"""Sdist codebases whose pytest config needs plugins the runner lacks still run their tests.

semver (.pytest.ini) and parse (pyproject.toml) put `--cov=...` (pytest-cov) in `addopts`: with
only pytest in the runner venv every run stopped at argument parsing and reported no test, so the
c2bench build made 0 tasks from them. `pytest_config_args` detects it and the test command then
carries `-o addopts=`.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from c2jax.envs.synth.sources import Codebase, pytest_config_args
from c2jax.envs.tasks import Source

CONFIGS = {
    "pytest.ini": "[pytest]\naddopts =\n    --import-mode=importlib\n    --cov=pkg\ntestpaths = tests\n",
    ".pytest.ini": "[pytest]\naddopts = --no-cov-on-fail --cov=pkg\n",
    "pyproject.toml": '[project]\nname = "pkg"\n\n[tool.pytest.ini_options]\naddopts = "--cov=pkg --doctest-modules"\n',
    "tox.ini": "[tox]\nenvlist = py3\n\n[pytest]\naddopts = -n auto\n",
    "setup.cfg": "[metadata]\nname = pkg\n\n[tool:pytest]\naddopts = --cov pkg -ra\n",
}


@pytest.mark.parametrize("fname", sorted(CONFIGS))
def test_plugin_addopts_are_overridden(tmp_path, fname):
    (tmp_path / fname).write_text(CONFIGS[fname])
    assert pytest_config_args(str(tmp_path)) == ["-o", "addopts="]


@pytest.mark.parametrize("text", [
    "[pytest]\naddopts = --strict-markers -ra\n",  # core options only: kept as the package wants
    "[pytest]\ntestpaths = tests\n",
])
def test_plain_configs_are_left_alone(tmp_path, text):
    (tmp_path / "pytest.ini").write_text(text)
    assert pytest_config_args(str(tmp_path)) == []


def test_first_config_wins_and_unrelated_sections_are_ignored(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "pkg"\n[tool.coverage.run]\naddopts = "--cov"\n')
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\naddopts = -ra\n")
    assert pytest_config_args(str(tmp_path)) == []  # pyproject has no pytest section; setup.cfg is plain


def test_cov_addopts_tree_runs_its_tests_with_the_codebase_command(tmp_path):
    (tmp_path / ".pytest.ini").write_text(CONFIGS[".pytest.ini"])
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    cb = Codebase("pkg", Source("pypi", "pkg", "1", "0" * 64, "MIT", "x"), str(tmp_path), [], ["tests/test_x.py"],
                  {}, pytest_args=pytest_config_args(str(tmp_path)))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # as in the sandbox: no pytest-cov

    def run(cmd):
        return subprocess.run([sys.executable, *cmd[1:]], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=120)

    bare = run(Codebase(**{**cb.__dict__, "pytest_args": []}).test_cmd(["tests/test_x.py"]))
    assert bare.returncode != 0 and "1 passed" not in bare.stdout  # the bug: no test runs at all
    fixed = run(cb.test_cmd(["tests/test_x.py"]))
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout + fixed.stderr
