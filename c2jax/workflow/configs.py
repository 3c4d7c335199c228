"""Load and validate an experiment config exactly as ``experiments/run.py`` does, in-process.

``load_config("experiments/configs/tiny.py:small", {"smoke.steps": "2"})`` parses the overrides with
the same ``ml_collections.config_flags`` machinery as the command line (locked config, values parsed
by the type of the field), so a sweep can check every cell before launching any subprocess, and a
notebook can build the config a run would use. ``repo_root()`` finds the checkout (configs are not
part of the installed package), so notebooks need not run from ``notebooks/``.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from c2jax.config import ConfigError, validate


class OverrideError(ValueError):
    """An override names an unknown key or a value the field cannot take."""


def repo_root() -> str:
    """The checkout holding ``experiments/`` and ``c2jax/`` (``$C2JAX_ROOT`` wins when set)."""
    env = os.environ.get("C2JAX_ROOT")
    candidates = [env] if env else []
    import c2jax

    candidates.append(os.path.dirname(os.path.dirname(os.path.abspath(c2jax.__file__))))
    for root in candidates:
        if root and os.path.isfile(os.path.join(root, "experiments", "run.py")):
            return os.path.abspath(root)
    raise FileNotFoundError(
        "no c2jax checkout found (experiments/run.py): install with `pip install -e <checkout>` or set C2JAX_ROOT")


def config_path(spec: str) -> str:
    """``NAME`` / ``NAME.py`` / ``experiments/configs/NAME.py[:preset]`` -> a path that exists, preset kept."""
    path, sep, preset = spec.partition(":")
    if not path.endswith(".py"):
        path = path + ".py"
    options = [path, os.path.join(repo_root(), path), os.path.join(repo_root(), "experiments", "configs",
                                                                     os.path.basename(path))]
    for p in options:
        if os.path.isfile(p):
            return os.path.abspath(p) + (sep + preset if sep else "")
    raise FileNotFoundError(f"config file not found: {spec!r} (tried {', '.join(options)})")


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """``{"smoke.steps": "2"}`` -> ``["--config.smoke.steps=2"]`` (values as given on a command line)."""
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def _parse(spec: str, overrides: Mapping[str, Any]):
    """Parse ``--config=SPEC --config.k=v ...`` with a private flag registry; raises absl's errors."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["c2jax", f"--config={spec}", *override_args(overrides)]
    fv = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv, lock_config=True,
                                             sys_argv=argv)
    fv(argv)
    return holder.value


def load_config(spec: str, overrides: Mapping[str, Any] | None = None):
    """The locked ``ConfigDict`` that ``run.py --config SPEC --config.k=v ...`` would run.

    Raises `OverrideError` naming the key for an unknown key or an unparsable value. Does not
    validate (see `check_config`).
    """
    overrides = dict(overrides or {})
    try:
        return _parse(spec, overrides)
    except Exception as e:  # absl/ml_collections raise several types for a bad key or value
        if not overrides:
            raise
        raise OverrideError(f"bad override {_first_bad_key(spec, overrides)}: {_message(e)}") from e


def _message(e: BaseException) -> str:
    """The innermost readable text of a (possibly wrapped) parse error: unknown keys say so."""
    inner = e
    while inner.args and isinstance(inner.args[0], BaseException):
        inner = inner.args[0]
    text = str(inner.args[0]) if inner.args else str(inner)
    if isinstance(inner, (KeyError, AttributeError)):
        return f"unknown key {text}".replace("\n", " ")
    return text


def _first_bad_key(spec: str, overrides: Mapping[str, Any]) -> str:
    """Which override (``--config.KEY=V``) makes parsing fail, tried one at a time."""
    for k, v in overrides.items():
        try:
            _parse(spec, {k: v})
        except Exception:
            return f"--config.{k}={v}"
    return "(the combination)"


def check_config(spec: str, overrides: Mapping[str, Any] | None = None):
    """`load_config` + `c2jax.config.validate`: raises `OverrideError` / `ConfigError` before any compute."""
    config = load_config(spec, overrides)
    validate(config, warn=False)
    return config


__all__ = ["ConfigError", "OverrideError", "check_config", "config_path", "load_config", "override_args",
           "repo_root"]
