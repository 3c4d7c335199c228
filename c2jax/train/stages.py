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

from c2jax.atomic import atomic_write_json
from c2jax.config import to_plain
from c2jax.registry import Registry

StageFn = Callable[[Any, str, dict], "tuple[dict, dict]"]
STAGES: Registry[StageFn] = Registry("stage")

# Stage name -> module registering it (imported on demand).
STAGE_MODULES: dict[str, str] = {
    "smoke": "c2jax.train.smoke",
    "cpt": "c2jax.train.pretrain",
    "long_context": "c2jax.train.pretrain",
    "sft": "c2jax.train.pretrain",
    "agent_sft": "c2jax.train.agent_sft",
    "rl": "c2jax.train.rl",
    "sft_matched": "c2jax.train.sft_matched",
}


def get_stage(name: str) -> StageFn:
    if name not in STAGES and name in STAGE_MODULES:
        importlib.import_module(STAGE_MODULES[name])
    return STAGES.get(name)


def known_stages() -> list[str]:
    return sorted(set(STAGES.names()) | set(STAGE_MODULES))


def write_summary(workdir: str, summary: dict) -> str:
    os.makedirs(workdir, exist_ok=True)
    return atomic_write_json(os.path.join(workdir, "summary.json"), summary, indent=2, sort_keys=True, default=str)


def build_cache(config: Any) -> tuple[list[str], str | None, Any]:
    """Cached build stages: ``config.build = {stages: [...], dir: 'runs/cache', seed: 0}``.

    The listed stages (a prefix of `config.stages`, e.g. cpt and agent_sft) run in a directory
    content-addressed by everything in the config except ``seed``, ``build.dir``, the sections of the
    later stages and ``rl`` (but ``rl.tasks``, the task family the demonstrations come from), with ``seed`` replaced by ``build.seed``; so a second seed (which changes the RL stage
    only) finds them finished and reuses them. Returns (stages, directory, the build config)."""
    build = to_plain(config.get("build")) if hasattr(config, "get") else None
    if not build or not build.get("stages"):
        return [], None, config
    import copy
    import hashlib

    stages = list(build["stages"])
    later = {s for s in list(config.stages) if s not in stages}  # sections of the later stages (rl, ...)
    plain = {k: to_plain(v) for k, v in config.items() if k not in {"seed", "build", "stages", "rl"} | later}
    plain["rl_tasks"] = (to_plain(config.get("rl")) or {}).get("tasks")  # the task family the demos come from
    plain["build_seed"], plain["build_stages"] = int(build.get("seed", 0)), stages
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]
    root = build.get("dir") or os.path.join("runs", "cache")
    bcfg = copy.deepcopy(config)
    if hasattr(bcfg, "unlock"):
        with bcfg.unlocked():
            bcfg.seed = int(build.get("seed", 0))
    else:
        bcfg["seed"] = int(build.get("seed", 0))
    return stages, os.path.join(os.path.abspath(root), "build", digest), bcfg


def run_stages(config: Any, workdir: str) -> dict:
    """Run `config.stages` in order; returns and writes `{stage: summary}` to summary.json.

    Stages named in ``config.build.stages`` run in a shared, content-addressed cache directory (see
    `build_cache`); the others in `workdir`."""
    summary: dict[str, Any] = {}
    state: dict = {}
    cached, cache_dir, build_cfg = build_cache(config)
    for name in list(config.stages):
        fn = get_stage(name)
        t0 = time.time()
        if name in cached:
            state, stage_summary = fn(build_cfg, cache_dir, state)
            stage_summary = dict(stage_summary, build_dir=cache_dir)
        else:
            state, stage_summary = fn(config, workdir, state)
        stage_summary = dict(stage_summary)
        stage_summary.setdefault("wall_time_s", time.time() - t0)
        summary[name] = stage_summary
        write_summary(workdir, summary)
    return summary
