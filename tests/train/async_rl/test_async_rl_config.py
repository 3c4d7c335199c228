"""``rl.services``: written out in rl_quickstart, every bad key named before any compute, and a run
command line can switch the backend (``--config.rl.services.backend=ray``)."""
from __future__ import annotations

import importlib.util
import os

import pytest

from _paths import REPO_ROOT as ROOT


def _config(preset: str = "default"):
    path = os.path.join(ROOT, "experiments", "configs", "rl_quickstart.py")
    spec = importlib.util.spec_from_file_location("_rlq", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.get_config(preset)


def test_services_defaults_are_written_out_and_valid():
    from c2jax.config import validate
    from c2jax.rl.stage_config import stage_defaults

    cfg = _config()
    assert cfg.rl.services.to_dict() == stage_defaults()["services"]
    cfg.rl.services.enabled = True
    cfg.rl.services.backend = "ray"
    cfg.rl.services.ray_address = "127.0.0.1:6379"  # a None default takes a string override
    validate(cfg, warn=False)


def test_bad_services_keys_are_named():
    from c2jax.config import ConfigError, validate

    cfg = _config()
    cfg.rl.services.backend = "kubernetes"
    cfg.rl.services.max_retries = -1
    cfg.rl.services.health_check_s = 0.0
    cfg.rl.services.ray_address = ""
    with pytest.raises(ConfigError) as e:
        validate(cfg, warn=False)
    keys = {k for k, _ in e.value.problems}
    assert {"rl.services.backend", "rl.services.max_retries", "rl.services.health_check_s",
            "rl.services.ray_address"} <= keys
    assert "['local', 'ray']" in str(e.value)
