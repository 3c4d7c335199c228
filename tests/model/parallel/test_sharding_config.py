"""config.mesh: presets validate, bad values are reported with their keys before any compute,
-1 fills the remaining devices, mesh/batch mismatches are clear errors."""
from __future__ import annotations

import jax
import ml_collections
import pytest

from c2jax.config import ConfigError, validate
from c2jax.model.config import model_config_dict
from c2jax.model.parallel.ep_moe import use_ragged
from c2jax.model.parallel.sharding import (MESH_PRESETS, MeshConfig, check_batch_divisible, make_mesh,
                                  mesh_config_dict)


def _cfg(**mesh):
    c = ml_collections.ConfigDict()
    c.model = model_config_dict("tiny")
    c.mesh = ml_collections.ConfigDict(mesh, type_safe=False)
    return c


@pytest.mark.parametrize("name", sorted(MESH_PRESETS))
def test_presets_validate(name):
    c = ml_collections.ConfigDict()
    c.model = model_config_dict("tiny")
    c.mesh = mesh_config_dict(name)
    validate(c)
    validate(_cfg(preset=name))


def test_bad_mesh_values_are_listed_with_keys():
    with pytest.raises(ConfigError) as e:
        validate(_cfg(fsdp=0, context=-1, data=-1, expert=3, dispatch_quant="int3", typo=1, ep_ragged="x"))
    keys = {k for k, _ in e.value.problems}
    assert {"mesh.fsdp", "mesh.context", "mesh.expert", "mesh.dispatch_quant", "mesh.typo", "mesh.ep_ragged"} <= keys
    msg = str(e.value)
    assert "n_routed_experts=8" in msg and "at most one axis may be -1" in msg


def test_minus_one_fills_remaining_devices_and_wrong_counts_fail():
    mesh = make_mesh(MeshConfig(fsdp=-1, context=2))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "expert": 1, "context": 2}
    assert make_mesh({"preset": "cpu8"}).shape["expert"] == 2
    with pytest.raises(ConfigError, match="8 are available"):
        make_mesh(MeshConfig(fsdp=3))
    with pytest.raises(ConfigError, match="not divisible"):
        make_mesh(MeshConfig(fsdp=-1, expert=3))


def test_batch_must_split_over_the_mesh():
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, context=2))
    check_batch_divisible(8, 64, mesh)
    with pytest.raises(ConfigError) as e:
        check_batch_divisible(6, 34, mesh)
    assert {k for k, _ in e.value.problems} == {"batch_size", "seq_len"}


def test_ragged_dispatch_only_on_gpu():
    assert use_ragged("auto") is (jax.default_backend() == "gpu")
    assert use_ragged("never") is False
