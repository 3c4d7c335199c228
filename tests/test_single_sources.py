"""One source of truth per choice: every allowed-name list is read from its registry, the shared
config helpers and the atomic writer behave as documented.

Each registry test has a positive control: a name registered for the duration of the test becomes
valid (so the validator reads the registry, not a copy), and an unregistered one is rejected.
"""
from __future__ import annotations

import json
import os
import random

import ml_collections
import pytest

from c2jax.config import ConfigError, cfg_get, to_plain, validate


def _problems(config: dict) -> set[str]:
    with pytest.raises(ConfigError) as e:
        validate(config)
    return {key for key, _ in e.value.problems}


# ---- MoE implementations ------------------------------------------------------------------------

def _model(**moe) -> dict:
    from c2jax.model.config import model_config_dict

    d = model_config_dict("tiny").to_dict()
    d["moe"].update(moe)
    return d


def test_model_moe_impls_are_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from c2jax.model.moe_impls import MOE_IMPLS

    for name in MOE_IMPLS.names():  # every registered implementation, sampler_dense included
        validate({"model": _model(impl=name)})
    assert "sampler_dense" in MOE_IMPLS
    assert "model.moe.impl" in _problems({"model": _model(impl="brand_new")})
    monkeypatch.setitem(MOE_IMPLS._items, "brand_new", MOE_IMPLS.get("dropless"))
    validate({"model": _model(impl="brand_new")})  # registered -> valid, with no list to edit


def test_token_dropping_impls_are_kept_from_learner_and_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    from c2jax.model.moe_impls import MOE_IMPLS, drops_tokens, exact_moe_impls
    from c2jax.rl.stage_config import full_rl_defaults
    from c2jax.sampling.config import sampling_config_dict

    assert drops_tokens("capacity") and "capacity" not in exact_moe_impls()
    assert {"dropless", "pallas", "sampler_dense"} <= set(exact_moe_impls())
    validate({"sampling": sampling_config_dict(moe_impl="sampler_dense")})
    assert "sampling.moe_impl" in _problems({"sampling": sampling_config_dict(moe_impl="capacity")})
    rl = full_rl_defaults()
    rl["learner_moe_impl"] = "capacity"
    assert "rl.learner_moe_impl" in _problems({"rl": rl})
    monkeypatch.setitem(MOE_IMPLS._items, "exact_new", MOE_IMPLS.get("dropless"))
    validate({"sampling": sampling_config_dict(moe_impl="exact_new")})


def test_engine_config_rejects_token_dropping_impl() -> None:
    from c2jax.model.config import preset
    from c2jax.sampling.engine import EngineConfig

    with pytest.raises(ValueError, match="capacity"):
        EngineConfig(moe_impl="capacity").validate(preset("tiny"))
    EngineConfig(moe_impl="sampler_dense").validate(preset("tiny"))


# ---- gmm precision recipes ----------------------------------------------------------------------

def test_moe_precisions_are_the_gmm_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels_pallas.gmm import ops

    assert ops.PRECISIONS == tuple(ops.RECIPES)
    for name in ops.RECIPES:
        validate({"model": _model(precision=name)})
        assert ops.RECIPES[name].fprop in ops.FPROP_GEMMS and ops.RECIPES[name].dgrad in ops.FPROP_GEMMS
    assert "model.moe.precision" in _problems({"model": _model(precision="fp6")})
    monkeypatch.setattr(ops, "PRECISIONS", ops.PRECISIONS + ("fp6",))
    validate({"model": _model(precision="fp6")})


# ---- task families ------------------------------------------------------------------------------

def test_task_families_registry() -> None:
    from c2jax.envs.synth.families import TASK_FAMILIES, Targets, make_candidate
    from c2jax.envs.tasks import CATEGORIES
    from c2jax.registry import UnknownNameError

    assert TASK_FAMILIES.in_order() == ["bug_injection", "multi_bug", "feature_deletion"]
    assert set(TASK_FAMILIES.names()) <= set(CATEGORIES)
    t = Targets(bug=5, multi_bug=2, feature_deletion=3)
    assert [TASK_FAMILIES.get(n).count(t) for n in TASK_FAMILIES.in_order()] == [5, 2, 3]
    with pytest.raises(UnknownNameError, match="bug_injection"):
        make_candidate(None, "typo_family", random.Random(0), t, {}, 0)  # type: ignore[arg-type]


# ---- agent tools ---------------------------------------------------------------------------------

def test_every_tool_schema_has_one_implementation() -> None:
    from c2jax.agent.tools import TOOL_IMPLS, TOOL_NAMES, Toolbox

    assert TOOL_IMPLS.names() == sorted(TOOL_NAMES)
    box = Toolbox(sandbox=None)
    assert sorted(box._impl) == sorted(TOOL_NAMES)


# ---- sandbox backends ----------------------------------------------------------------------------

def test_envs_backend_selects_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from c2jax.envs.backends import SANDBOX_BACKENDS, make_pool
    from c2jax.envs.pool import SandboxPool
    from c2jax.registry import UnknownNameError

    pool = make_pool({"backend": "local", "pool_size": 3, "limits": {"timeout_s": 5}})
    try:
        assert isinstance(pool, SandboxPool) and pool.max_concurrency == 3 and pool.limits.timeout_s == 5
    finally:
        pool.close()
    assert "envs.backend" in _problems({"envs": {"backend": "ray"}})  # not registered: nothing to pick
    with pytest.raises(UnknownNameError, match="local"):
        make_pool({"backend": "ray"})
    made: list[dict] = []
    monkeypatch.setitem(SANDBOX_BACKENDS._items, "recorder", lambda **kw: made.append(kw) or "pool")
    validate({"envs": {"backend": "recorder"}})
    assert make_pool(ml_collections.ConfigDict({"backend": "recorder", "warm": 2})) == "pool"
    assert made == [{"warm": 2}]


# ---- config helpers and atomic writes -----------------------------------------------------------

def test_cfg_get_and_to_plain() -> None:
    cd = ml_collections.ConfigDict({"a": 1, "b": None, "s": {"x": [1, 2], "y": {"z": 3}}})
    for c in (cd, ml_collections.FrozenConfigDict(cd), cd.to_dict()):
        assert cfg_get(c, "a") == 1 and cfg_get(c, "b", 7) == 7 and cfg_get(c, "zz", 3) == 3
        plain = to_plain(c)
        assert type(plain) is dict and type(plain["s"]) is dict and type(plain["s"]["y"]) is dict
        assert plain["a"] == 1 and plain["b"] is None and list(plain["s"]["x"]) == [1, 2]  # frozen: a tuple
    assert cfg_get(None, "a", 5) == 5 and to_plain(None) is None and to_plain(4) == 4
    src = {"s": {"x": [1]}}
    out = to_plain(src)
    out["s"]["x"].append(2)
    assert src == {"s": {"x": [1]}}  # containers are copied


def test_atomic_write_leaves_old_file_on_error(tmp_path) -> None:
    from c2jax.atomic import atomic_open, atomic_path, atomic_write_json

    path = str(tmp_path / "f.json")
    atomic_write_json(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(path) as f:
            f.write('{"v": 2')  # a torn write ...
            raise RuntimeError("killed mid-write")
    assert json.load(open(path)) == {"v": 1}  # ... never reaches the file
    assert os.listdir(tmp_path) == ["f.json"]  # and leaves no temporary behind
    with atomic_path(path, suffix=".png") as tmp:
        assert tmp.endswith(".png") and tmp != path
        open(tmp, "w").write("new")
    assert open(path).read() == "new"
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(path, "a"):
            pass
