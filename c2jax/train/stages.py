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


# Config sections a cached build stage after the first reads on top of what the earlier stages read:
# its own section (`config.<name>`) and these. Every section no later build stage claims keys the
# first stage, so changing it rebuilds everything (the safe default for a section nobody declared).
BUILD_STAGE_EXTRA_SECTIONS: dict[str, tuple[str, ...]] = {
    "agent_sft": ("agent", "rl_tasks"),  # the harness the demonstrations run in, the family they come from
}


def _digest(obj: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_cache(config: Any) -> tuple[list[str], dict[str, str], Any]:
    """Cached build stages: ``config.build = {stages: [...], dir: 'runs/cache', seed: 0}``.

    The listed stages (a prefix of `config.stages`, e.g. cpt and agent_sft) run in directories
    content-addressed stage by stage, with ``seed`` replaced by ``build.seed``, so a second seed
    (which changes the RL stage only) finds them finished and reuses them:

    - the first stage's directory, ``<dir>/build/<hash>``, is keyed by everything in the config except
      ``seed``, ``build.dir``, the sections of the stages after the build and ``rl`` (but ``rl.tasks``,
      the task family the demonstrations come from) and the sections the later build stages own;
    - each later build stage runs in ``<previous stage's directory>/<name>-<hash>``, keyed by its own
      section and its `BUILD_STAGE_EXTRA_SECTIONS` (agent_sft: ``agent_sft``, ``agent``, ``rl.tasks``;
      the family's key also holds its generator's version and code and the demonstrator's code,
      `rl_family.family_key`, so editing either rebuilds the cold start, not CPT).

    So ``--config.agent_sft.steps=450`` reuses the CPT checkpoint and reruns SFT only, while a change
    to ``model`` or ``train`` rebuilds every stage. Returns (stages, {stage: directory}, build config)."""
    build = to_plain(config.get("build")) if hasattr(config, "get") else None
    if not build or not build.get("stages"):
        return [], {}, config
    import copy

    stages = list(build["stages"])
    later = {s for s in list(config.stages) if s not in stages}  # sections of the later stages (rl, ...)
    plain = {k: to_plain(v) for k, v in config.items() if k not in {"seed", "build", "stages", "rl"} | later}
    plain["rl_tasks"] = (to_plain(config.get("rl")) or {}).get("tasks")  # the task family the demos come from
    if plain["rl_tasks"] is not None and "agent_sft" in stages:
        from c2jax.train.rl_family import family_key

        plain["rl_tasks"] = family_key(config)  # its arguments + the generator's and demonstrator's code
    owned = {s: (s,) + BUILD_STAGE_EXTRA_SECTIONS.get(s, ()) for s in stages[1:]}
    claimed = {k for secs in owned.values() for k in secs}
    first = {k: v for k, v in plain.items() if k not in claimed}
    first["build_seed"], first["build_stage"] = int(build.get("seed", 0)), stages[0]
    root = build.get("dir") or os.path.join("runs", "cache")
    dirs = {stages[0]: os.path.join(os.path.abspath(root), "build", _digest(first))}
    for prev, name in zip(stages, stages[1:]):
        own = {k: plain.get(k) for k in owned[name]}
        dirs[name] = os.path.join(dirs[prev], f"{name}-{_digest(own)}")
    bcfg = copy.deepcopy(config)
    if hasattr(bcfg, "unlock"):
        with bcfg.unlocked():
            bcfg.seed = int(build.get("seed", 0))
    else:
        bcfg["seed"] = int(build.get("seed", 0))
    return stages, dirs, bcfg


def _inherit_data_pin(stages: list[str], dirs: dict[str, str], name: str) -> None:
    """A later build stage reads the data its predecessor trained on: copy the predecessor's
    ``data.json`` pin (corpus and tokenizer artefacts) into the stage's directory if it has none."""
    i = stages.index(name)
    if i == 0:
        return
    src, dst = os.path.join(dirs[stages[i - 1]], "data.json"), os.path.join(dirs[name], "data.json")
    if os.path.exists(src) and not os.path.exists(dst):
        os.makedirs(dirs[name], exist_ok=True)
        with open(src) as f:
            atomic_write_json(dst, json.load(f), indent=2, sort_keys=True)


def run_stages(config: Any, workdir: str) -> dict:
    """Run `config.stages` in order; returns and writes `{stage: summary}` to summary.json.

    Stages named in ``config.build.stages`` run in content-addressed cache directories, one per
    stage (see `build_cache`); the others in `workdir`."""
    summary: dict[str, Any] = {}
    state: dict = {}
    cached, cache_dirs, build_cfg = build_cache(config)
    for name in list(config.stages):
        fn = get_stage(name)
        t0 = time.time()
        if name in cached:
            _inherit_data_pin(cached, cache_dirs, name)
            state, stage_summary = fn(build_cfg, cache_dirs[name], state)
            stage_summary = dict(stage_summary, build_dir=cache_dirs[name])
        else:
            state, stage_summary = fn(config, workdir, state)
        stage_summary = dict(stage_summary)
        stage_summary.setdefault("wall_time_s", time.time() - t0)
        summary[name] = stage_summary
        write_summary(workdir, summary)
    return summary
