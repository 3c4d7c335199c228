"""The training loop shared by every pretraining stage: resume, step, log, evaluate, checkpoint.

`train_loop` is model- and data-agnostic: it takes a jitted ``step_fn(state, batch)``, a loader
object (``next_batch() -> dict``, ``state() -> dict``, ``restore(dict)``), and an
``evaluate(params) -> {'held_out_loss': float, ...}`` callable. It

1. restores the newest usable checkpoint of ``out_dir/checkpoints`` (train state, loader state,
   and the meta record: initial held-out loss, tokens seen, training time), or evaluates the
   initial held-out loss when starting fresh;
2. runs ``total_steps`` steps, logging train metrics to ``train.jsonl`` + TensorBoard every
   ``log_every`` steps and held-out metrics to ``eval.jsonl`` every ``eval_every`` steps;
3. saves asynchronously every ``ckpt_every`` steps, at the end, and when SIGTERM/SIGINT arrives
   (then it waits for the save and exits with status 143);
4. returns the final state and the stage summary.

Because batches are a pure function of (seed, step, loader state) and the state is restored bit
for bit, a run killed with SIGKILL and restarted produces the same losses as one never killed.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np

from c2jax.checkpoint import Checkpointer, PreemptionGuard
from c2jax.train.metrics import MetricsLogger, Progress, read_jsonl
from c2jax.train.state import TrainState

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143


def _to_json(tree: Mapping[str, Any]) -> dict:
    return {k: (np.asarray(v).tolist() if not isinstance(v, (int, float, str, bool, type(None))) else v)
            for k, v in tree.items()}


def _from_json(tree: Mapping[str, Any]) -> dict:
    out = {}
    for k, v in tree.items():
        if k == "fingerprint":
            out[k] = np.asarray(v, np.uint64)
        elif isinstance(v, (list, int)):
            out[k] = np.asarray(v, np.int64)
        else:
            out[k] = v
    return out


def train_loop(*, name: str, out_dir: str, state: TrainState, step_fn: Callable, loader: Any,
               evaluate: Callable[[Any], Mapping[str, float]], total_steps: int, tokens_per_step: int,
               log_every: int = 10, eval_every: int = 100, ckpt_every: int = 100, keep: int = 3,
               meta: Optional[dict] = None, to_device: Callable[[dict], dict] = lambda b: b,
               progress: Optional[bool] = None, async_save: bool = True,
               place: Optional[Callable[[TrainState], TrainState]] = None) -> tuple[TrainState, dict]:
    """Run (or resume) one training stage; see the module docstring.

    ``place(state)`` puts the (initial or restored) state on devices; the default commits every leaf
    to the first local device. Mixing committed and uncommitted leaves makes jit compile the step a
    second time after step 1; under a mesh pass a function applying the state's shardings.
    """
    if place is None:
        def place(s):
            return jax.device_put(s, jax.local_devices()[0])
    os.makedirs(out_dir, exist_ok=True)
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=keep, async_save=async_save)
    logger = MetricsLogger(out_dir)
    restored = ckpt.restore_latest(state.to_tree())
    meta = dict(meta or {})
    t_wall0 = time.time()
    if restored is not None:
        step0, tree, loader_state, saved_meta = restored
        state = place(state.replace_tree(tree))
        loader.restore(_from_json(loader_state))
        held_initial = saved_meta.get("held_out_loss_initial")
        tokens_seen = int(saved_meta.get("tokens_seen", 0))
        train_time = float(saved_meta.get("train_time_s", 0.0))
        resumed_from = int(step0)
        log.warning("%s: resumed from checkpoint step %d", name, step0)
    else:
        step0, tokens_seen, train_time, resumed_from = 0, 0, 0.0, None
        state = place(state)
        ev = dict(evaluate(state.params))
        held_initial = float(ev["held_out_loss"])
        logger.log("eval", 0, {**ev, "tokens_seen": 0})
    step0 = int(step0)
    if step0 >= total_steps:
        log.warning("%s: checkpoint is already at step %d of %d; nothing to train", name, step0, total_steps)

    last_eval: dict = {}
    bar = Progress(total_steps, initial=step0, desc=name, enabled=progress)
    window_t0, window_steps, excluded = time.time(), 0, 0.0
    first_step_of_process = True
    step = step0
    tok_s = float("nan")

    def meta_now() -> dict:
        return {**meta, "stage": name, "held_out_loss_initial": held_initial, "tokens_seen": tokens_seen,
                "train_time_s": train_time}

    with PreemptionGuard() as guard:
        while step < total_steps:
            batch = to_device(loader.next_batch())
            t0 = time.time()
            state, metrics = step_fn(state, batch)
            step += 1
            tokens_seen += tokens_per_step
            window_steps += 1
            is_log = step % log_every == 0 or step == total_steps or first_step_of_process
            if is_log:
                host = jax.device_get(metrics)
                now = time.time()
                if first_step_of_process:  # compile time: not counted in throughput
                    excluded += now - t0
                    first_step_of_process = False
                    dt = now - window_t0 - excluded
                    window_t0, window_steps, excluded = now, 0, 0.0
                else:
                    dt = now - window_t0 - excluded
                    if dt > 0 and window_steps:
                        tok_s = window_steps * tokens_per_step / dt
                        train_time += dt
                    window_t0, window_steps, excluded = now, 0, 0.0
                rec = {k: float(np.asarray(v)) for k, v in host.items()}
                rec["tokens_seen"] = tokens_seen
                if np.isfinite(tok_s):
                    rec["tokens_per_s"] = tok_s
                logger.log("train", step, rec)
                bar.update(0, loss=rec["loss"], tok_s=tok_s)
            bar.update(1)
            if step % eval_every == 0 or step == total_steps:
                te = time.time()
                last_eval = dict(evaluate(state.params))
                logger.log("eval", step, {**last_eval, "tokens_seen": tokens_seen})
                excluded += time.time() - te
            if step % ckpt_every == 0 or step == total_steps or guard.requested:
                tc = time.time()
                ckpt.save(step, state.to_tree(), _to_json(loader.state()), meta_now())
                excluded += time.time() - tc
            if guard.requested:
                ckpt.close()
                logger.close()
                bar.close()
                log.warning("%s: stopped by signal after step %d; checkpoint saved", name, step)
                raise SystemExit(PREEMPTED_EXIT_CODE)
    ckpt.close()
    bar.close()
    logger.close()
    if not last_eval:
        evs = read_jsonl(logger.path("eval"))
        last_eval = evs[-1] if evs else dict(evaluate(state.params))
    trains = read_jsonl(logger.path("train"))
    last = [r["loss"] for r in trains[-10:]]
    tps = [r["tokens_per_s"] for r in trains if r.get("tokens_per_s") and np.isfinite(r["tokens_per_s"])]
    summary = {
        "steps": int(step),
        "tokens": int(tokens_seen),
        "held_out_loss_initial": held_initial,
        "held_out_loss_final": float(last_eval["held_out_loss"]),
        "train_loss_final": float(trains[-1]["loss"]) if trains else float("nan"),
        "train_loss_final_mean10": float(np.mean(last)) if last else float("nan"),
        "tokens_per_s": float(np.median(tps)) if tps else None,
        "train_time_s": train_time,
        "wall_time_s": time.time() - t_wall0,
        "resumed_from_step": resumed_from,
        "held_out": {k: v for k, v in last_eval.items() if k not in ("step", "time")},
    }
    return state, summary
