"""Sandbox tests fail loudly where sandboxes are missing; C2JAX_SANDBOX_UNAVAILABLE=1 is the only way
to skip them (tests/_envs_common.py `sandbox_mark`, enforced by tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _envs_common import OPT_OUT_VAR, check_sandbox_requirement

from _paths import TESTS_DIR as TESTS


def test_a_missing_sandbox_fails_unless_opted_out():
    with pytest.raises(pytest.fail.Exception, match=f"no usable bwrap: simulated.*{OPT_OUT_VAR}=1"):
        check_sandbox_requirement("no usable bwrap: simulated", environ={})
    with pytest.raises(pytest.fail.Exception):
        check_sandbox_requirement("no usable bwrap: simulated", environ={OPT_OUT_VAR: "yes"})  # only "1" opts out
    with pytest.raises(pytest.skip.Exception, match="simulated"):
        check_sandbox_requirement("no usable bwrap: simulated", environ={OPT_OUT_VAR: "1"})
    assert check_sandbox_requirement(None, environ={}) is None  # available: nothing happens


def test_the_conftest_hook_enforces_the_mark_end_to_end(tmp_path):
    """A pytest run with the repository's conftest: the marked test errors at setup (rc 1) without the opt-out
    and is skipped (rc 0) with it; the unmarked test passes either way."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {TESTS!r})\nexec(open({os.path.join(TESTS, 'conftest.py')!r}).read())\n")
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n\n\n@pytest.mark.sandbox_required('no usable bwrap: simulated')\ndef test_needs():\n"
        "    pass\n\n\n@pytest.mark.sandbox_required(None)\ndef test_available():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != OPT_OUT_VAR}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tmp_path)]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "1 passed, 1 error" in r.stdout and "simulated" in r.stdout, r.stdout[-2000:]
    r = subprocess.run(cmd, cwd=tmp_path, env={**env, OPT_OUT_VAR: "1"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout[-2000:]
