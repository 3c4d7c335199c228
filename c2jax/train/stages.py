"""Stage registry and runner: `experiments/run.py` dispatches on `config.stages` through here.

A stage is `fn(config, workdir, state) -> (state, summary_dict)`: `state` carries whatever the
next stage starts from (params, optimizer state, checkpoint path, ...); each stage's summary is
written under its name to `workdir/summary.json` so sweeps and notebooks read results without
parsing logs. Stages register themselves with `@STAGES.register("name")` in their own module;
`STAGE_MODULES` says which module to import for a name so nothing needs importing up front.
"""
from __future__ import annotations

import importlib
import json
import os
import time
from typing import Any, Callable

from c2jax.registry import Registry

StageFn = Callable[[Any, str, dict], "tuple[dict, dict]"]
STAGES: Registry[StageFn] = Registry("stage")

# Stage name -> module registering it (imported on demand).
STAGE_MODULES: dict[str, str] = {
    "smoke": "c2jax.train.smoke",
    "cpt": "c2jax.train.pretrain",
    "long_context": "c2jax.train.pretrain",
    "sft": "c2jax.train.pretrain",
}


def get_stage(name: str) -> StageFn:
    if name not in STAGES and name in STAGE_MODULES:
        importlib.import_module(STAGE_MODULES[name])
    return STAGES.get(name)


def known_stages() -> list[str]:
    return sorted(set(STAGES.names()) | set(STAGE_MODULES))


def write_summary(workdir: str, summary: dict) -> str:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "summary.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path


def run_stages(config: Any, workdir: str) -> dict:
    """Run `config.stages` in order; returns and writes `{stage: summary}` to summary.json."""
    summary: dict[str, Any] = {}
    state: dict = {}
    for name in list(config.stages):
        fn = get_stage(name)
        t0 = time.time()
        state, stage_summary = fn(config, workdir, state)
        stage_summary = dict(stage_summary)
        stage_summary.setdefault("wall_time_s", time.time() - t0)
        summary[name] = stage_summary
        write_summary(workdir, summary)
    return summary
