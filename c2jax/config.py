"""Config validation: every experiment config is checked before any compute.

Experiments are `ml_collections.ConfigDict`s built by `experiments/configs/NAME.py`. Each top-level
section (``model``, ``train``, ``data``, ``rl``, ``mesh``, ...) has a validator registered with
`register_validator`; `validate(config)` runs the validator of every section present and raises one
`ConfigError` that lists every bad key with its allowed range. Validators live beside the code that
owns the section (e.g. `c2jax/model/config.py`); `validate` imports the owning module on demand
(see `SECTION_MODULES`), so calling it needs nothing imported beforehand.

Validators receive a `Checker` that records problems instead of raising on the first one, so a
researcher sees every mistake in a config at once.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

from c2jax.registry import Registry

# Section name -> module that registers its validator (imported lazily by `validate`).
SECTION_MODULES: dict[str, str] = {
    "model": "c2jax.model.config",
    "sampling": "c2jax.sampling.config",
    "envs": "c2jax.envs.backends",
    "train": "c2jax.train.pretrain_config",
    "cpt": "c2jax.train.pretrain_config",
    "long_context": "c2jax.train.pretrain_config",
    "sft": "c2jax.train.pretrain_config",
    "stages": "c2jax.train.config_checks",
    "seed": "c2jax.train.config_checks",
    "smoke": "c2jax.train.smoke",
    "rl": "c2jax.rl.config_checks",
    "data": "c2jax.data.config_checks",
    "mesh": "c2jax.model.parallel.sharding",
    "agent": "c2jax.agent.config",
    "agent_sft": "c2jax.train.agent_sft",
    "sft_matched": "c2jax.train.sft_matched",
}

VALIDATORS: Registry[Callable[["Checker", Any, Any], None]] = Registry("config_validator")


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """`cfg[key]` for ConfigDicts, dicts and other mappings alike; `default` when `cfg` is None, the
    key is absent, or its value is None. The one config getter of the package."""
    if cfg is None:
        return default
    try:
        v = cfg[key]
    except (KeyError, AttributeError, TypeError):
        return default
    return default if v is None else v


def to_plain(x: Any) -> Any:
    """ConfigDict / FrozenConfigDict / Mapping -> nested plain dicts (lists copied too, leaves kept);
    anything else is returned as it is (None stays None). The one config-to-dict helper."""
    if hasattr(x, "to_dict"):
        x = x.to_dict()
    if isinstance(x, Mapping):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [to_plain(v) for v in x]
    return x


def load_config_file(spec: str) -> Any:
    """``PATH[:preset]`` of an experiment config file -> its ``get_config(preset)`` (no command-line
    overrides; `c2jax.workflow.configs.load_config` parses those like ``experiments/run.py``).
    Raises FileNotFoundError naming the path if it does not exist."""
    import importlib.util
    import os

    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise FileNotFoundError(f"config file {path} not found")
    s = importlib.util.spec_from_file_location("_c2jax_experiment_config", path)
    mod = importlib.util.module_from_spec(s)
    assert s.loader is not None
    s.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


class ConfigError(ValueError):
    """A config value is out of range or inconsistent. `problems` lists `(key, message)`."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.problems = list(problems)
        lines = "\n".join(f"  {k}: {m}" for k, m in self.problems)
        super().__init__(f"invalid config ({len(self.problems)} problem(s)):\n{lines}")


class ConfigWarning(UserWarning):
    """A config is legal but probably not what the researcher meant."""


def register_validator(section: str):
    """Decorator: register `fn(check, section_cfg, full_cfg)` as the validator of `section`."""

    def deco(fn):
        VALIDATORS.register(section, fn)
        return fn

    return deco


def _get(cfg: Any, key: str) -> Any:
    cur = cfg
    for part in key.split("."):
        if cur is None:
            raise KeyError(key)
        if isinstance(cur, dict):
            cur = cur[part]
        else:
            try:
                cur = cur[part]
            except (KeyError, TypeError, AttributeError):
                cur = getattr(cur, part)
    return cur


class Checker:
    """Collects config problems for one section; keys are reported with the section prefix."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.problems: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []

    def _key(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, message: str) -> None:
        self.problems.append((self._key(key), message))

    def warn(self, key: str, message: str) -> None:
        self.warnings.append((self._key(key), message))

    def require(self, ok: bool, key: str, message: str) -> bool:
        if not ok:
            self.error(key, message)
        return bool(ok)

    def value(self, cfg: Any, key: str, default: Any = KeyError) -> Any:
        try:
            return _get(cfg, key)
        except (KeyError, AttributeError):
            if default is KeyError:
                self.error(key, "missing")
                return None
            return default

    def int_range(self, cfg: Any, key: str, lo: int | None = None, hi: int | None = None,
                  optional: bool = False) -> int | None:
        """Check `cfg.key` is an int in [lo, hi] (None bounds are open); None allowed if optional."""
        v = self.value(cfg, key, None if optional else KeyError)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.error(key, f"must be an integer{_range_text(lo, hi)}, got {v!r}")
            return None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.error(key, f"must be an integer{_range_text(lo, hi)}, got {v}")
            return None
        return v

    def float_range(self, cfg: Any, key: str, lo: float | None = None, hi: float | None = None,
                    optional: bool = False, lo_open: bool = False) -> float | None:
        v = self.value(cfg, key, None if optional else KeyError)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.error(key, f"must be a number{_range_text(lo, hi, lo_open)}, got {v!r}")
            return None
        v = float(v)
        bad_lo = lo is not None and (v <= lo if lo_open else v < lo)
        if bad_lo or (hi is not None and v > hi) or v != v:
            self.error(key, f"must be a number{_range_text(lo, hi, lo_open)}, got {v}")
            return None
        return v

    def choice(self, cfg: Any, key: str, choices: Iterable[str], optional: bool = False) -> Any:
        v = self.value(cfg, key, None if optional else KeyError)
        choices = list(choices)
        if v is None:
            return None
        if v not in choices:
            self.error(key, f"must be one of {choices}, got {v!r}")
            return None
        return v


def _range_text(lo, hi, lo_open: bool = False) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" {'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f" <= {hi}"
    return f" in {'(' if lo_open else '['}{lo}, {hi}]"


def validate(config: Any, *, warn: bool = True) -> list[tuple[str, str]]:
    """Validate every known section of `config`; raise `ConfigError` listing all problems.

    Returns the list of `(key, message)` warnings (also emitted as `ConfigWarning` if `warn`).
    Sections without a registered validator are accepted as-is.
    """
    problems: list[tuple[str, str]] = []
    warns: list[tuple[str, str]] = []
    keys = list(config.keys())
    for section in keys:
        if section not in VALIDATORS and section in SECTION_MODULES:
            importlib.import_module(SECTION_MODULES[section])
        if section not in VALIDATORS:
            continue
        check = Checker(section)
        try:
            VALIDATORS.get(section)(check, config[section], config)
        except ConfigError as e:  # a validator may delegate and raise
            problems.extend(e.problems)
        problems.extend(check.problems)
        warns.extend(check.warnings)
    # Cross-section validators are registered under names starting with "@" and run always.
    for name in VALIDATORS.names():
        if name.startswith("@"):
            check = Checker("")
            VALIDATORS.get(name)(check, config, config)
            problems.extend(check.problems)
            warns.extend(check.warnings)
    if problems:
        raise ConfigError(problems)
    if warn:
        for k, m in warns:
            warnings.warn(f"{k}: {m}", ConfigWarning, stacklevel=2)
    return warns
