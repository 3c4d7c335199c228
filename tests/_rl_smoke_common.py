"""Shared by the RL smoke tests (tests/train/test_rl_smoke.py, tests/train/async_rl/test_async_rl_stage.py):
the `rl_quickstart.py:smoke` command line, its environment and the RL checkpoint's parameter hash."""
from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

from _paths import REPO_ROOT

CONFIG = os.path.join(REPO_ROOT, "experiments", "configs", "rl_quickstart.py")


def load_rl_quickstart():
    """The `experiments/configs/rl_quickstart.py` module (its `get_config`, `PRESETS`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rl_quickstart", CONFIG)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


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


def kill9_after_first_step_checkpoint(cmd, ckpt_dir, timeout_s: float = 1800.0, *, min_step: int = 1,
                                      delay_s: float = 0.0, env: dict | None = None) -> list[str]:
    """Start `cmd` in its own session, SIGKILL the whole group as soon as the first RL step checkpoint
    (the first one at step >= `min_step`, then `delay_s` seconds later) lands in `ckpt_dir` (a
    pathlib.Path), and return the step directories left behind. Raises if `cmd` exits first."""
    import signal
    import subprocess
    import time

    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or _env(),
                         start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if ckpt_dir.exists() and any(d.isdigit() and int(d) >= min_step for d in os.listdir(ckpt_dir)):
            break
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited ({p.returncode}) before a step-{min_step} checkpoint")
        time.sleep(0.2)
    time.sleep(delay_s)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended during the delay (the caller sees no kill: its last step is checkpointed)
    p.wait()
    return [d for d in os.listdir(ckpt_dir) if d.isdigit()]
