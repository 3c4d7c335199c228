"""Shared pieces of the asynchronous RL tests: a tiny model, the real harness/engine/sandbox on the
agent tests' buggy repository, distinct task records over it, and both loops (synchronous `rl_step`
and the asynchronous driver) built the same way."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Any

import jax
import numpy as np

from _agent_common import agent_tokenizer, chat_format
from _agent_common import make_task


@functools.lru_cache(maxsize=None)
def tiny_model():
    from c2jax.model import init
    from c2jax.model.config import preset

    cfg = preset("tiny").replace(vocab_size=1024, max_position_embeddings=1024, mtp_depth=0,
                                 **{"moe.impl": "dropless"})
    return cfg, init(cfg, jax.random.PRNGKey(3))


def rl_section(**over: Any) -> dict:
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage

    # A k3 KL term in the loss against a reference that differs from the initial weights (`build`)
    # gives a non-zero update whatever the rewards (a random tiny model never fixes the bug and its
    # episodes often have identical effort, so every advantage could be zero).
    rl = resolve_rl_config({"group_size": 2, "rewards": {"task": {"weight": 1.0}},
                            "kl": {"coef": 0.1, "estimator": "k3", "placement": "loss", "log_ratio_clip": 20.0}})
    rl.update(resolve_stage({"steps": 2, "tasks_per_step": 2, "max_in_flight": 4, "max_len": 1024,
                             "learning_rate": 1e-3, "replay_metrics": False}))
    rl.update(over)
    return rl


def tasks(env_id: str, n: int) -> list:
    base = make_task(env_id)
    return [dataclasses.replace(base, instance_id=f"calc-add-sign-{i}") for i in range(n)]


def param_hash(params: Any) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()


@dataclasses.dataclass
class Parts:
    ctx: Any
    engine: Any
    pool: Any
    state: Any
    stream: Any
    cfg: Any
    params: Any

    engine_weights: Any = None  # what the engine was built with (None: the initial `params`)

    def engine_params(self) -> Any:
        return self.params if self.engine_weights is None else self.engine_weights

    def close(self) -> None:
        engine = getattr(self.ctx.policy, "engine", None)
        if engine is not None and engine is not self.engine and hasattr(engine, "close_replacements"):
            engine.close_replacements()
        self.engine.shutdown()
        self.pool.close()


@functools.lru_cache(maxsize=None)
def reference_params():
    """The KL reference: the initial weights scaled by 1.05 (any fixed policy other than the start)."""
    return jax.tree_util.tree_map(lambda x: x * 1.05, tiny_model()[1])


_LEARNERS: dict = {}


def learner_for(rl: dict) -> Any:
    """One learner per rl section for the whole session (its jitted functions compile once)."""
    from c2jax.train.rl_learner import make_learner

    key = repr(sorted(rl.items()))
    if key not in _LEARNERS:
        cfg, params = tiny_model()
        _LEARNERS[key] = make_learner(cfg, rl, params)
    return _LEARNERS[key]


def build(rl: dict, task_list: list, *, seed: int = 0, grade_fn: Any = None, max_turns: int = 2,
          max_new_tokens: int = 24, engine_params: Any = None, version: int = 0) -> Parts:
    """Engine (initial weights at version 0, or `engine_params` at `version` for a resumed run), harness,
    pool, learner, train state (initial weights) and task stream."""
    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.policies import EnginePolicy
    from c2jax.agent.tools import ToolConfig
    from c2jax.envs import SandboxPool
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.train.rl_step import RLContext
    from c2jax.train.rl_tasks import TaskStream
    from c2jax.train.state import TrainState

    cfg, params = tiny_model()
    fmt = chat_format()
    engine = Engine(params if engine_params is None else engine_params, cfg,
                    EngineConfig(max_slots=int(rl["max_in_flight"]), max_len=int(rl["max_len"]),
                                 recompute_cache_on_update=True), tokenizer=agent_tokenizer(), version=version)
    harness = Harness(fmt, HarnessConfig(max_turns=max_turns, max_new_tokens=max_new_tokens, system_prompt="Fix it.",
                                         tools=ToolConfig(enabled=("read_file", "search_replace"),
                                                          compact_declarations=True)))
    policy = EnginePolicy(engine, fmt, temperature=1.0, seed=seed)
    learner = learner_for(rl)
    state = TrainState.create(params, learner.tx)
    pool = SandboxPool(max_concurrency=int(rl["max_in_flight"]))
    ctx = RLContext(rl=rl, learner=learner, engine=engine, policy=policy, harness=harness, pool=pool,
                    ref_params=reference_params(), seed=seed, grade_fn=grade_fn)
    stream = TaskStream(task_list, seed=seed, upsample_after_step=None)
    return Parts(ctx, engine, pool, state, stream, cfg, params, engine_params)


def run_sync(parts: Parts, steps: int) -> tuple[Any, list[dict]]:
    from c2jax.train.rl_step import rl_step

    state, version, engine_version, rows = parts.state, 0, 0, []
    for step in range(steps):
        out = rl_step(parts.ctx, state, parts.stream.take(int(parts.ctx.rl["tasks_per_step"]), step), step=step,
                      version=version, engine_version=engine_version)
        state, version, engine_version = out.state, out.version, out.engine_version
        rows.append(out.metrics)
    return state, rows


def make_async(parts: Parts, out_dir: str, steps: int, backend: Any = None, *, version: int = 0,
               wrap_rollout: Any = None, trainer_factory: Any = None, **kw: Any):
    """The driver over the embedded services, wired as `stage.run_services` wires them (the engine
    behind a `SupervisedEngine` handle). `wrap_rollout(service)` / `trainer_factory()` let a test put
    a fault injector around the rollout service or an auditing trainer in place of `Trainer`."""
    from c2jax.train.async_rl.engine_health import SupervisedEngine
    from c2jax.train.async_rl.publisher import EnginePublisher
    from c2jax.train.async_rl.runner import AsyncRL
    from c2jax.train.async_rl.services import LocalBackend
    from c2jax.train.async_rl.workers import RolloutWorker, Trainer

    backend = backend or LocalBackend()
    ctx = parts.ctx
    engine = SupervisedEngine(parts.engine, params=parts.engine_params(), version=version,
                              tokenizer=agent_tokenizer())
    ctx.policy.engine = engine
    G = int(ctx.rl["group_size"])
    workers = max(1, int(ctx.rl["max_in_flight"]) // G)
    rollout = backend.spawn("rollout", lambda: RolloutWorker(ctx.harness, ctx.policy, ctx.pool, ctx.rl,
                                                             grade_fn=ctx.grade_fn, seed=ctx.seed), workers=workers)
    if wrap_rollout is not None:
        rollout = wrap_rollout(rollout)
    trainer = backend.spawn("trainer", trainer_factory or (lambda: Trainer(ctx)), workers=1)
    return AsyncRL(ctx, rollout=rollout, trainer=trainer, publisher=EnginePublisher(engine), stream=parts.stream,
                   steps=steps, out_dir=os.fspath(out_dir), engine=engine, **kw)
