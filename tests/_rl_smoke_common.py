"""Shared by the RL smoke tests (tests/train/test_rl_smoke.py, tests/train/async_rl/test_async_rl_stage.py):
the `rl_quickstart.py:smoke` command line, its environment and the RL checkpoint's parameter hash."""
from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

from _paths import REPO_ROOT

CONFIG = os.path.join(REPO_ROOT, "experiments", "configs", "rl_quickstart.py")


def _cmd(workdir, cache, *extra):
    return [sys.executable, os.path.join(REPO_ROOT, "experiments", "run.py"), f"--config={CONFIG}:smoke",
            f"--workdir={workdir}", f"--config.build.dir={cache}",
            f"--config.data.dir={os.path.join(str(cache), 'data')}", *extra]


def _env():
    return dict(os.environ, C2JAX_PROGRESS="0", JAX_PLATFORMS="cpu")


def _param_hash(workdir) -> str:
    """"step:sha256" over the leaves of the latest RL step checkpoint's parameters."""
    import jax

    from c2jax.checkpoint import Checkpointer

    step, params = Checkpointer(os.path.join(workdir, "rl", "checkpoints")).restore_params()
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return f"{step}:{h.hexdigest()}"
