"""Run an experiment: `python experiments/run.py --config experiments/configs/NAME.py[:preset]`.

Overrides: `--config.model.moe.impl=capacity`, `--config.train.steps=10`. The config is locked
(`lock_config=True`): a misspelt key fails at once. `c2jax.config.validate` runs before any
compute; a bad config exits with status 2 and a message naming each bad key and its allowed
range. Results go to `--workdir` (default `runs/<config name>`): `summary.json` per stage, plus
what each stage writes (checkpoints, metrics, plots).

Compiled programs are kept in JAX's persistent compilation cache (`--compile_cache DIR`, default
``<build.dir>/xla`` for configs with a build cache, '' off), so a second seed or a rerun does not
compile them again (c2jax/compile_cache.py).

Multi-host: when `C2JAX_COORDINATOR` (host:port), `C2JAX_NUM_PROCESSES` and `C2JAX_PROCESS_ID`
are set, `jax.distributed.initialize` is called before anything touches a device.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:arg].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<config name>).")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None, "JAX persistent compilation cache directory (default <build.dir>/xla when the "
    "config has a build cache; '' turns it off). See c2jax/compile_cache.py.")


def maybe_initialize_distributed() -> None:
    """Initialise multi-host JAX from C2JAX_* environment variables, if they are set."""
    coord = os.environ.get("C2JAX_COORDINATOR")
    if not coord:
        return
    import jax

    jax.distributed.initialize(
        coordinator_address=coord,
        num_processes=int(os.environ["C2JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["C2JAX_PROCESS_ID"]),
    )


def main(argv: list[str]) -> int:
    del argv
    from c2jax.config import ConfigError, validate

    config = _CONFIG.value
    if config is None:
        print("error: --config is required", file=sys.stderr)
        return 2
    try:
        validate(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg_path = flags.FLAGS["config"].config_filename if hasattr(flags.FLAGS["config"], "config_filename") else "run"
    name = os.path.splitext(os.path.basename(str(cfg_path).split(":")[0]))[0]
    workdir = _WORKDIR.value or os.path.join("runs", name)
    maybe_initialize_distributed()
    from c2jax.compile_cache import default_cache_dir, enable_compile_cache

    cache = _COMPILE_CACHE.value
    enable_compile_cache(default_cache_dir(config) if cache is None else cache)
    from c2jax.train.stages import run_stages

    try:
        summary = run_stages(config, workdir)
    except ConfigError as e:  # a stage's pre-training checks (data, vocab, positions) failed
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"done: {workdir}/summary.json ({', '.join(summary)})")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
