"""The service objects the asynchronous RL driver spawns: rollout worker, trainer, evaluator.

    RolloutWorker(harness, policy, pool, rl).run_group(task, batch)  -> list[rl_rollouts.Sample]
    Trainer(ctx).train(state, samples, version)                      -> rl_step.LearnOutput
    Evaluator(eval_fn).evaluate(params, step)                        -> dict (held-out pass@k)

Each wraps the synchronous stage's own functions (`rl_rollouts.collect`, `rl_step.learn`) so the
asynchronous path trains exactly what the synchronous one would on the same samples.
"""
from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

from c2jax.train.async_rl.engine_health import EngineLost, engine_alive
from c2jax.train.rl_rollouts import Sample, collect
from c2jax.train.rl_step import LearnOutput, RLContext, learn
from c2jax.train.state import TrainState


class RolloutWorker:
    """Harness + engine policy + sandbox pool: one group (`group_size` graded episodes) per call.

    The sampling seeds are those of the synchronous step `batch` (``seed_salt = batch``; the
    policy's per-request seeds also hash the sample id and turn), so with ``max_staleness = 0`` a
    group samples exactly the tokens the synchronous stage samples for it.

    An episode whose engine died under it (`engine_health.EngineLost`, masked ``error:EngineLost`` by
    `rl_rollouts`) is not the policy's doing: the whole group is reported lost (raises EngineLost) and
    the driver rolls it out again on the replacement engine, same ids and seeds."""

    def __init__(self, harness: Any, policy: Any, pool: Any, rl: dict, grade_fn: Callable | None = None,
                 seed: int = 0) -> None:
        self.harness, self.policy, self.pool, self.rl, self.grade_fn = harness, policy, pool, rl, grade_fn
        self.seed = seed

    def run_group(self, task: Any, batch: int, on_state: Callable[[Any, int, str], None] | None = None) -> list[Sample]:
        G = int(self.rl["group_size"])
        policy = copy.copy(self.policy)  # per group: concurrent groups of different steps salt differently
        policy.seed, policy.seed_salt = self.seed, int(batch)
        samples = collect(self.harness, policy, [task], group_size=G, pool=self.pool, max_in_flight=G,
                          max_len=int(self.rl["max_len"]), grade_fn=self.grade_fn, on_state=on_state)
        lost = [s.index for s in samples if (s.mask_reason or "").startswith(f"error:{EngineLost.__name__}")]
        if lost:
            raise EngineLost(f"task {getattr(task, 'instance_id', task)!r}: samples {lost} lost with their engine")
        return samples

    def healthy(self) -> bool:
        return engine_alive(getattr(self.policy, "engine", None))


class Trainer:
    """`rl_step.learn` on a batch of complete groups (task-major, sample order within a group)."""

    def __init__(self, ctx: RLContext) -> None:
        self.ctx = ctx
        self.busy_s = 0.0

    def train(self, state: TrainState, samples: Sequence[Any], version: int) -> LearnOutput:
        t0 = time.monotonic()
        out = learn(self.ctx, state, samples, version)
        self.busy_s += time.monotonic() - t0
        return out


class Evaluator:
    """Held-out evaluation of a pinned checkpoint on its own thread (never blocks the trainer)."""

    def __init__(self, eval_fn: Callable[[Any, int], dict]) -> None:
        self.eval_fn = eval_fn

    def evaluate(self, params: Any, step: int) -> dict:
        t0 = time.monotonic()
        out = dict(self.eval_fn(params, step))
        out["eval/wall_s"] = time.monotonic() - t0
        return out
