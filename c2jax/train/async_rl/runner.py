"""The asynchronous RL driver: rollout, trainer and evaluation services around one reconciler.

    run = AsyncRL(ctx, rollout=backend.spawn("rollout", factory, workers=n), publisher=EnginePublisher(engine),
                  stream=stream, steps=16, out_dir=".../rl", ckpt=checkpointer, logger=logger)
    state, version = run.run(state, start_step=0, version=0)     # or run.restore(...) first
    run.summary()            # ledger counts, staleness histogram, trainer idle fraction, wall time

One thread (the driver) owns the reconciler and does, in an event loop woken by futures:
  admit    while `Reconciler.admissible(publisher.live_version())`: the next task of the stream,
           submitted to the rollout service (its samples' lifecycle goes to the ledger);
  collect  a finished group becomes ready and is written to the group store (a sample checkpoint),
           a failed one (worker died) is rolled out again or dropped (`Reconciler.lost`);
  train    when the trainer is free and `batch_groups` groups are ready: `rl_step.mark_stale` +
           `rl_step.learn` on the trainer service; rollouts keep going meanwhile;
  finish   version + 1, ledger, task-stream heuristics, checkpoint (params, Adam, task stream,
           reconciler + ledger snapshots), then `publisher.publish` (non-blocking: the engine swaps
           weights between decode steps, in-flight rollouts continue and their later tokens carry the
           new version), then an evaluation of the pinned weights every ``eval_every`` steps.

Health checks (every ``health_every_s`` and whenever a group is lost): a dead engine
(`engine_health.SupervisedEngine`, embedded backend) is replaced first, then a dead rollout
service restarted; ``summary()['restarts']`` counts each replacement by kind. A lost sandbox needs
no driver action: its episode is masked ``infra:sandbox`` and the pool starts a fresh sandbox for
the next episode.

``max_staleness = 0`` degenerates to the synchronous stage: step k's groups are admitted only once
version k is live, all of them are trained together in task order, so the parameters are bit-identical
to `rl_step`'s (tested). ``inflight_updates = False`` holds a new version back until no rollout is in
flight (every rollout then runs on one policy version; the benchmark's control).
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import time
from typing import Any, Callable

import jax
import numpy as np

from c2jax.train.async_rl.group_store import GroupStore
from c2jax.train.async_rl.ledger import SampleLedger
from c2jax.train.async_rl.reconciler import Reconciler, Slot, sample_ids
from c2jax.train.rl_rollouts import sample_stats
from c2jax.train.rl_step import RLContext, mark_stale

log = logging.getLogger(__name__)


class AsyncRL:
    def __init__(self, ctx: RLContext, *, rollout: Any, trainer: Any, publisher: Any, stream: Any, steps: int,
                 out_dir: str, ckpt: Any = None, logger: Any = None, evaluator: Any = None, eval_every: int = 0,
                 inflight_updates: bool = True, max_retries: int = 2, health_every_s: float = 5.0,
                 engine_params: Callable[[], Any] | None = None, on_step: Callable[[int, dict], None] | None = None,
                 admission: str = "bounded", engine: Any = None) -> None:
        rl = ctx.rl
        self.ctx, self.rl = ctx, rl
        self.rollout, self.trainer, self.publisher, self.stream = rollout, trainer, publisher, stream
        self.steps = int(steps)
        self.B, self.G = int(rl["tasks_per_step"]), int(rl["group_size"])
        self.out_dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        self.ledger = SampleLedger(os.path.join(out_dir, "ledger.jsonl"))
        self.store = GroupStore(os.path.join(out_dir, "groups"))
        self.rec = Reconciler(batch_groups=self.B, group_size=self.G, max_staleness=int(rl["max_staleness"]),
                              ledger=self.ledger, max_running=max(1, int(rl["max_in_flight"]) // self.G),
                              max_batches=self.steps, max_retries=max_retries, admission=admission)
        self.ckpt, self.logger, self.evaluator, self.eval_every = ckpt, logger, evaluator, int(eval_every)
        self.inflight_updates = bool(inflight_updates)
        self.health_every_s = float(health_every_s)
        self.on_step = on_step
        self.events: queue.Queue = queue.Queue()
        self.task_queue: collections.deque = collections.deque()
        self.held: tuple[Any, int] | None = None  # a version waiting for in-flight rollouts (no in-flight updates)
        self.staleness: collections.Counter = collections.Counter()
        self.eval_futs: list = []
        self.eval_results: list[dict] = []
        self.trainer_busy_s = 0.0
        self.wall_s = 0.0
        self.step_rows: list[dict] = []
        self.to_remove: list[int] = []
        self.restarts: collections.Counter = collections.Counter()
        self.engine = engine  # an `engine_health.SupervisedEngine` (embedded backend) or None

    # ---- admission and rollouts ------------------------------------------------------------------
    def _next_task(self) -> Any | None:
        if not self.task_queue:
            k = self.rec.next_batch()
            want = self.B - self.rec.batch_live.get(k, 0)
            try:
                self.task_queue.extend(self.stream.take(want, k))
            except RuntimeError:
                return None  # single epoch exhausted (only after drops): the driver reports it if it starves
        return self.task_queue.popleft()

    def _submit(self, slot: Slot) -> None:
        self.rec.started(slot)
        ledger = self.ledger

        def on_state(task: Any, k: int, state: str, ids=slot.sample_ids) -> None:
            ledger.move([ids[k]], state)

        fut = self.rollout.submit("run_group", slot.task, slot.batch, on_state)
        fut.add_done_callback(lambda f, slot=slot: self.events.put(("group", slot, f)))

    def _admit(self) -> None:
        if self.held is not None:
            return
        while self.rec.admissible(self.publisher.live_version()):
            task = self._next_task()
            if task is None:
                return
            self._submit(self.rec.admit(task, self.publisher.live_version()))

    def _on_group(self, slot: Slot, fut: Any) -> None:
        if slot.state == "dropped" or slot.index not in self.rec.slots:
            return
        exc = fut.exception()
        if exc is not None:
            log.warning("async rl: group %d lost (%s: %s)", slot.index, type(exc).__name__, exc)
            self._health_check()
            republish = getattr(self.publisher, "republish", None)
            if callable(republish):
                republish()  # a restarted worker process starts from its factory's weights
            if self.rec.lost(slot, f"{type(exc).__name__}: {exc}"):
                self._submit(slot)
            return
        self.rec.completed(slot, fut.result())
        self.store.save(slot)

    def _health_check(self) -> None:
        """Replace a dead engine (first: a rollout worker over a dead engine looks dead too), then a
        dead rollout service; each replacement is counted in ``summary()['restarts']``."""
        if self.engine is not None and not self.engine.healthy():
            log.warning("async rl: inference engine died: replacing it (latest published weights)")
            self.engine.replace()
            self.restarts["engine"] += 1
        if not self.rollout.alive():
            log.warning("async rl: rollout service unhealthy: restarting it")
            self.rollout.restart()
            self.restarts["rollout"] += 1

    # ---- training ---------------------------------------------------------------------------------
    def _start_training(self, state: Any, version: int) -> tuple[Any, list[Slot], dict] | None:
        slots = self.rec.take(version)
        if slots is None:
            return None
        samples = [s for slot in slots for s in slot.samples]
        metrics = sample_stats(samples)
        for k, v in mark_stale(samples, version, int(self.rl["max_staleness"])).items():
            metrics[k] = metrics.get(k, 0.0) + v
        fut = self.trainer.submit("train", state, samples, version)
        fut.add_done_callback(lambda f: self.events.put(("train", None, f)))
        return fut, slots, metrics

    def _finish_step(self, step: int, version: int, out: Any, slots: list[Slot], metrics: dict, t_train: float,
                     wait_s: float) -> None:
        state = out.state
        for slot in slots:
            live = [s.trajectory for s in slot.samples if not s.mask_reason]
            if live:
                self.stream.observe(slot.task_id, turns=float(np.mean([t.effort.turns for t in live])),
                                    thinking_tokens=float(np.mean([t.effort.thinking_tokens for t in live])))
        self.rec.trained(slots, step + 1, version)
        self.to_remove.extend(s.index for s in slots)
        metrics.update(out.metrics)
        for k, v in out.metrics.items():
            if k.startswith("staleness/hist/"):
                self.staleness[int(k.rsplit("/", 1)[1])] += int(v)
        new_version = version + 1
        if self.ckpt is not None and ((step + 1) % int(self.rl["ckpt_every"]) == 0 or step + 1 == self.steps):
            self._checkpoint(step + 1, state, new_version)
        t0 = time.monotonic()
        if self.inflight_updates or self.rec.running() == 0:
            self.publisher.publish(state.params, new_version)
            self.held = None
        else:
            self.held = (state.params, new_version)
        publish_s = time.monotonic() - t0
        now = time.monotonic()
        step_s, self._t_last_step = now - getattr(self, "_t_last_step", now - t_train - wait_s), now
        metrics.update({"version": float(new_version), "engine_version": float(self.publisher.live_version()),
                        "time/publish_s": publish_s, "time/train_s": t_train, "time/trainer_wait_s": wait_s,
                        "time/step_s": step_s,
                        "async/ready_groups": float(self.rec.ready_count()),
                        "async/running_groups": float(self.rec.running()),
                        "async/dropped_groups": float(self.rec.n_dropped_groups)})
        if self.evaluator is not None and self.eval_every and (step + 1) % self.eval_every == 0:
            pinned = jax.tree_util.tree_map(np.asarray, state.params)
            fut = self.evaluator.submit("evaluate", pinned, step + 1)
            fut.add_done_callback(lambda f, s=step + 1: self.events.put(("eval", s, f)))
            self.eval_futs.append(fut)
        self.step_rows.append(dict(metrics, step=step + 1))
        if self.logger is not None:
            self.logger.log("train", step + 1, metrics)
        if self.on_step is not None:
            self.on_step(step + 1, metrics)

    def _checkpoint(self, step: int, state: Any, version: int) -> None:
        loader = {"stream": self.stream.state(), "version": version, "engine_version": version,
                  "async": {"reconciler": self.rec.snapshot(), "ledger": self.ledger.snapshot(),
                            "task_queue": [getattr(t, "instance_id", t) for t in self.task_queue]}}
        self.ckpt.save(step, dict(state.to_tree(), engine_params=state.params), loader_state=loader,
                       meta={"seed": self.ctx.seed, "async": True})
        self.store.remove(self.to_remove)  # their update is in a committed checkpoint now
        self.to_remove = []

    # ---- restart ----------------------------------------------------------------------------------
    def restore(self, loader_state: dict, version: int) -> dict:
        """Rebuild the reconciler and ledger from a trainer checkpoint's snapshots: ready groups come
        back from the group store, groups that were rolling out are rolled out again (same ids and
        seeds), groups sampled by a version this checkpoint never published are dropped
        ('unknown_policy_version'). Returns counts of each."""
        snap = loader_state.get("async")
        if not snap:
            raise ValueError("restore: the checkpoint has no asynchronous state (written by the synchronous "
                             "stage?); resume it with rl.services.enabled=False")
        self.ledger = SampleLedger.from_snapshot(snap["ledger"], self.ledger.path)
        self.rec.ledger = self.ledger
        r = snap["reconciler"]
        self.rec.n_admitted, self.rec.n_dropped_groups = int(r["n_admitted"]), int(r["n_dropped_groups"])
        self.rec.drops = dict(r["drops"])
        self.rec.next_train = int(r["next_train"])
        self.task_queue.extend(self.stream.tasks[t] for t in snap["task_queue"])
        counts = collections.Counter()
        known = set()
        resubmit = []
        for d in r["slots"]:
            task = self.stream.tasks[d["task_id"]]
            slot = Slot(int(d["index"]), int(d["batch"]), task, sample_ids(int(d["index"]), d["task_id"], self.G),
                        int(d["admitted_version"]), attempts=int(d["attempts"]))
            known.add(slot.index)
            rec = self.store.load(slot.index)
            self.rec.restore_slot(slot)
            if rec is not None and rec.max_version > version:
                slot.state = "rolling_out"
                self.rec.drop(slot, "unknown_policy_version")
                counts["unknown_policy_version"] += 1
            elif rec is not None:
                slot.samples = rec.restore_samples(task)
                slot.min_version, slot.max_version, slot.state = rec.min_version, rec.max_version, "ready"
                open_ids = [i for i in slot.sample_ids if self.ledger.state(i) not in ("ready", "trained", "dropped")]
                self.ledger.move(open_ids, "ready")
                self.rec.ready_order.append(slot.index)
                counts["ready_reloaded"] += 1
            else:
                self.ledger.requeue(slot.sample_ids, "trainer_restart")
                slot.state = "queued"
                resubmit.append(slot)
                counts["rolled_out_again"] += 1
        stray = [i for i in self.store.indices() if i not in known]
        self.store.remove(stray)  # trained before the checkpoint, or admitted after it (re-admitted now)
        counts["stray_files_removed"] = len(stray)
        for slot in resubmit:
            self._submit(slot)
        return dict(counts)

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self, state: Any, *, start_step: int = 0, version: int = 0) -> tuple[Any, int]:
        t_start = time.monotonic()
        last_health = t_start
        step = start_step
        training: tuple[Any, list[Slot], dict] | None = None
        t_train0 = t_idle0 = time.monotonic()
        try:
            while step < self.steps:
                if self.held is not None and self.rec.running() == 0:
                    self.publisher.publish(*self.held)
                    self.held = None
                self._admit()
                if training is None:
                    training = self._start_training(state, version)
                    if training is not None:
                        wait_s = time.monotonic() - t_idle0
                        t_train0 = time.monotonic()
                    elif self.rec.running() == 0 and self.rec.ready_count() < self.B and not self.task_queue \
                            and not self.rec.admissible(self.publisher.live_version()) and self.held is None \
                            and self.rec.live_groups() >= self.steps * self.B:
                        raise RuntimeError("async rl: starved (no rollouts running, too few ready groups)")
                # Poll fast only while a published version is on its way to the engine (admission may
                # be waiting for it); everything else arrives as an event.
                live = self.publisher.live_version()
                timeout = 0.002 if live < getattr(self.publisher, "published", live) else 0.05
                try:
                    kind, slot, fut = self.events.get(timeout=timeout)
                except queue.Empty:
                    kind = None
                if kind == "group":
                    self._on_group(slot, fut)
                elif kind == "eval":
                    self._on_eval(slot, fut)
                elif kind == "train":
                    out = fut.result()  # a trainer exception ends the run (the stage resumes from the checkpoint)
                    _, slots, metrics = training
                    t_train = time.monotonic() - t_train0
                    self.trainer_busy_s += t_train
                    state = out.state
                    self._finish_step(step, version, out, slots, metrics, t_train, wait_s)
                    version += 1
                    step += 1
                    training = None
                    t_idle0 = time.monotonic()
                if time.monotonic() - last_health > self.health_every_s:
                    self._health_check()
                    last_health = time.monotonic()
            for fut in self.eval_futs:  # evaluation results of the pinned checkpoints
                fut.exception()
            while not self.events.empty():
                kind, slot, fut = self.events.get_nowait()
                if kind == "eval":
                    self._on_eval(slot, fut)
            self.rec.drain("run_ended")  # only on a normal end: after a crash the checkpoint's ledger rules
        finally:
            self.wall_s = time.monotonic() - t_start
        return state, version

    def _on_eval(self, step: int, fut: Any) -> None:
        exc = fut.exception()
        row = {"step": step, "error": f"{type(exc).__name__}: {exc}"} if exc else dict(fut.result(), step=step)
        self.eval_results.append(row)
        if self.logger is not None and not exc:
            self.logger.log("eval", step, {k: v for k, v in row.items() if isinstance(v, (int, float))})

    def summary(self) -> dict[str, Any]:
        return {"ledger": self.ledger.summary(), "staleness_hist": dict(sorted(self.staleness.items())),
                "max_staleness": int(self.rl["max_staleness"]), "wall_s": self.wall_s,
                "trainer_busy_s": self.trainer_busy_s,
                "trainer_idle_fraction": 1.0 - self.trainer_busy_s / self.wall_s if self.wall_s else None,
                "publish_s": float(getattr(self.publisher, "publish_s", 0.0)), "drops": dict(self.rec.drops),
                "restarts": dict(self.restarts), "evals": list(self.eval_results)}
