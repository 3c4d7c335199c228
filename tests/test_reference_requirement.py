"""A missing reference package (the torch extra) fails parity tests unless C2JAX_ALLOW_NO_TORCH=1
(tests/_reference_imports.py, enforced by tests/conftest.py)."""
from __future__ import annotations

import pytest

from _reference_imports import OPT_OUT_VAR, check_reference_requirement, import_references, require_reference


def test_a_missing_reference_is_named_and_fails_unless_opted_out():
    (json_mod, missing), mark = import_references("json", "c2jax_no_such_reference_pkg")
    assert json_mod is not None and missing is None
    problem = mark.args[0]
    assert "c2jax_no_such_reference_pkg" in problem and "pip install -e '.[test,torch]'" in problem
    with pytest.raises(pytest.fail.Exception, match=f"{OPT_OUT_VAR}=1"):
        check_reference_requirement(problem, environ={})
    with pytest.raises(pytest.skip.Exception, match="c2jax_no_such_reference_pkg"):
        check_reference_requirement(problem, environ={OPT_OUT_VAR: "1"})
    (_,), present = import_references("json")
    assert present.args[0] is None  # all present: the mark is inert
    check_reference_requirement(None, environ={})


def test_require_reference_inside_a_test_fails(monkeypatch):
    monkeypatch.delenv(OPT_OUT_VAR, raising=False)
    with pytest.raises(pytest.fail.Exception, match="c2jax_no_such_reference_pkg"):
        require_reference("c2jax_no_such_reference_pkg")
    monkeypatch.setenv(OPT_OUT_VAR, "1")
    with pytest.raises(pytest.skip.Exception):
        require_reference("c2jax_no_such_reference_pkg")
