"""The ``rl`` stage's step loop on the asynchronous services (``rl.services.enabled=True``).

    state, version, summary = run_services(ctx, state, stream=stream, ckpt=ckpt, logger=logger,
                                           start=start, version=version, loader_state=loader_state,
                                           out_dir=out_dir, eval_fn=eval_fn)

Called by `c2jax.train.rl.run_rl` in place of its synchronous loop, with the same context (engine,
harness, pool, learner), task stream and checkpointer. ``rl.services`` (validated by
`c2jax.rl.stage_config`):
  backend           'local' (threads in this process, default) | 'ray' (actors; `ray_backend`)
  ray_address       the Ray cluster for backend='ray' (None: start a local one on 127.0.0.1)
  inflight_updates  publish between decode steps while rollouts run (False: hold a new version
                    until no rollout is in flight)
  max_retries       re-rollouts of a group whose worker died before it is dropped ('worker_lost')
  eval_every        held-out pass@1/pass@k of the pinned weights every N steps on the evaluation
                    service (0 = off; the stage's before/after evaluation is unchanged)
  health_check_s    seconds between health checks of the rollout service
On the embedded backend the engine is supervised (`engine_health.SupervisedEngine`): the policy and
the weight sync talk to a handle, and a health check replaces a dead engine with one holding the
latest published weights (the caller's engine is left as it was; a replacement is shut down here).
A resumed run restores the reconciler, the ledger and the ready groups from the checkpoint
(`runner.AsyncRL.restore`). Outputs beside the stage's: ``services/ledger.jsonl``,
``services/groups/`` (group checkpoints) and ``services/summary.json``.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable

from c2jax.train.async_rl.engine_health import SupervisedEngine
from c2jax.train.async_rl.publisher import EnginePublisher
from c2jax.train.async_rl.runner import AsyncRL
from c2jax.train.async_rl.services import make_backend
from c2jax.train.async_rl.workers import Evaluator, RolloutWorker, Trainer
from c2jax.train.rl_step import RLContext

log = logging.getLogger(__name__)


def run_services(ctx: RLContext, state: Any, *, stream: Any, ckpt: Any, logger: Any, start: int, version: int,
                 loader_state: dict | None, out_dir: str, eval_fn: Callable[[Any, int], dict] | None = None,
                 on_step: Callable[[int, dict], None] | None = None) -> tuple[Any, int, dict]:
    rl = ctx.rl
    sv = rl["services"]
    backend = make_backend(sv["backend"], address=sv.get("ray_address"))
    G = int(rl["group_size"])
    engine = None
    if sv["backend"] == "local":  # the engine lives in this process: supervise it (see module docstring)
        from c2jax.sync.engine_sync import engine_params as engine_params_for

        engine = SupervisedEngine(ctx.engine, params=engine_params_for(state.params, rl["weight_sync"]), version=version,
                                  tokenizer=getattr(ctx.harness.fmt, "tok", None))
        ctx.policy.engine = engine
        if ctx.weight_sync is not None:
            ctx.weight_sync.engine = engine
    if sv["backend"] == "ray":
        from c2jax.train.async_rl.ray_backend import ray_rollout_service

        rollout = ray_rollout_service(backend, ctx, state.params, version,
                                      workers=max(1, int(rl["max_in_flight"]) // G))
    else:
        rollout = backend.spawn("rollout", lambda: RolloutWorker(ctx.harness, ctx.policy, ctx.pool, rl,
                                                                 grade_fn=ctx.grade_fn, seed=ctx.seed),
                                workers=max(1, int(rl["max_in_flight"]) // G))
    trainer = backend.spawn("trainer", lambda: Trainer(ctx)) if sv["backend"] == "local" else \
        make_backend("local").spawn("trainer", lambda: Trainer(ctx))  # the trainer stays with the params
    evaluator = None
    if eval_fn is not None and int(sv["eval_every"]) > 0:
        evaluator = make_backend("local").spawn("eval", lambda: Evaluator(eval_fn))
    svc_dir = os.path.join(out_dir, "services")
    run = AsyncRL(ctx, rollout=rollout, trainer=trainer, publisher=getattr(rollout, "publisher", None)
                  or EnginePublisher(engine or ctx.engine, sync=ctx.weight_sync), stream=stream, steps=int(rl["steps"]),
                  out_dir=svc_dir, ckpt=ckpt, logger=logger, evaluator=evaluator, eval_every=int(sv["eval_every"]),
                  inflight_updates=bool(sv["inflight_updates"]), max_retries=int(sv["max_retries"]),
                  health_every_s=float(sv["health_check_s"]), on_step=on_step, engine=engine)
    try:
        if loader_state and start > 0:
            counts = run.restore(loader_state, version)
            log.info("rl services: restored at step %d: %s", start, counts)
        state, version = run.run(state, start_step=start, version=version)
    finally:
        for svc in (rollout, trainer, evaluator):
            if svc is not None:
                svc.shutdown()
        backend.shutdown()
        if engine is not None:
            engine.close_replacements()
    summary = run.summary()
    run.ledger.check_complete()
    with open(os.path.join(svc_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    return state, version, summary
