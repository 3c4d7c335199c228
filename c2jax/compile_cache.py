"""JAX's persistent compilation cache, switched on in one place for every entry point.

XLA compiles each jitted function per input shape; on 2 CPU cores the quickstart's RL stage spends
about a minute on it (the engine's decode and ~13 prefill shapes, the learner's step, the
diagnostics forward) before it computes anything. With the cache on, a later process that compiles
the same program with the same compiler and flags loads the executable from disk instead: the second
seed of an experiment, a rerun, a `bench run` of a checkpoint of the same model. The cache key is
JAX's own (the program, the compile options, the backend and its version), so a stale entry is never
used for a different program; results are the same executables' results.

    from c2jax.compile_cache import enable_compile_cache
    enable_compile_cache("runs/cache/xla")      # before the first compile; None or "" leaves it off

`experiments/run.py --compile_cache DIR` (default: ``<build.dir>/xla`` when the config has a build
cache) and `python -m c2jax.bench run --compile-cache DIR` call it.
"""
from __future__ import annotations

import os
from typing import Optional


def enable_compile_cache(directory: Optional[str], min_compile_time_s: float = 1.0) -> Optional[str]:
    """Point JAX's persistent compilation cache at `directory` (created if missing) and cache every
    program that took at least `min_compile_time_s` to compile (JAX's default, 1 s: the engine's
    decode and prefill shapes and the train steps, not the many small programs whose entries would
    cost more to write than to compile). Returns the absolute directory, or None when `directory`
    is None or empty (cache left as it was)."""
    if not directory:
        return None
    import jax

    path = os.path.abspath(directory)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return path


def active_compile_cache() -> Optional[str]:
    """The persistent cache directory this process compiles into (set by `enable_compile_cache`), or
    None when it is off: a command the process writes for a later one (the RL stage's evaluation
    command) passes it on, so rerunning that command loads the same executables instead of compiling."""
    import jax

    return jax.config.jax_compilation_cache_dir or None


def default_cache_dir(config) -> Optional[str]:
    """``<config.build.dir>/xla`` for a config with a build cache (the directory its cached stages
    already live in), else None."""
    build = config.get("build") if hasattr(config, "get") else None
    directory = build.get("dir") if build is not None and hasattr(build, "get") else None
    return os.path.join(directory, "xla") if directory else None
