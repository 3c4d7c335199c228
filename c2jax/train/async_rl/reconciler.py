"""The reconciler: slot-based sample lifecycle and bounded-staleness admission (no clock, no threads).

    rec = Reconciler(batch_groups=4, group_size=8, max_staleness=1, ledger=SampleLedger())
    while rec.admissible(live_version):              # live_version: the policy the engine serves now
        slot = rec.admit(task, live_version)         # queued; its seeds belong to step slot.batch
        rec.started(slot)                            # rolling_out (per sample: rec.sample_state)
    rec.completed(slot, samples)                     # ready (a complete group), or rec.lost(slot, why)
    slots = rec.take(trainer_version)                # batch_groups ready groups, or None
    rec.trained(slots, step, trainer_version)        # ledger: trained / dropped 'masked:<reason>'

A *slot* is one group (one task x ``group_size`` samples); the drivers (`runner.AsyncRL` for the
real services, the discrete-event simulation of the tests and the benchmark) only call these
methods, so the rules below hold on every path.

Admission (``admission='bounded'``, the default). Every group belongs to a batch (the update
that will train it): update u trains exactly the ``batch_groups`` groups of batch u, in admission
order, once all of them are ready. A new group joins the lowest batch that is not full, and may
start only while that batch u satisfies ``u <= live_version + max_staleness`` (and fewer than
``max_running`` groups roll out). Its first token is then sampled by a version >= u - max_staleness
and it is trained at learner version u, so no consumed token is ever more than ``max_staleness``
versions old, whatever the latencies. The bound is enforced *before* generation: nothing is dropped
for staleness and slow (long) rollouts are trained exactly like fast ones, so admission does not
bias training toward short rollouts. Rollouts of batches u+1..u+s overlap the wait for batch u's
slowest group and the update itself; that overlap is the speedup. A dropped group (worker lost)
frees its place in its batch, and a replacement task joins that batch.
``admission='unbounded'`` is the naive rule kept as the tests' control: start whenever a worker is
free, train the first ``batch_groups`` groups to complete, drop stale ones at training time; that
drops the slow (long) rollouts and biases training toward short ones.

What is dropped, and why (each a ledger reason; nothing else leaves the pipeline untrained):
  stale                     a consumed group's oldest loss token lags the learner by more than
                            ``max_staleness`` (cannot happen under bounded admission: a safety net)
  masked:<reason>           an infrastructure-masked sample (`rl_rollouts` reasons); its group is
                            trained, the sample contributes nothing (as in the synchronous step)
  worker_lost               a group whose rollout worker died ``max_retries + 1`` times
  unknown_policy_version    a checkpointed group sampled by a version the restored trainer never
                            published (its updates were lost in a crash)
  run_ended                 a group still queued, rolling out or ready when the last step trained
                            (partial groups are never trained)
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Sequence

from c2jax.train.async_rl.ledger import SampleLedger

ADMISSIONS = ("bounded", "unbounded")


@dataclasses.dataclass
class Slot:
    """One group moving through queued -> rolling_out -> (grading) -> ready -> trained | dropped."""

    index: int  # admission number (unique over the run, never reused)
    batch: int  # the update that trains it (and the synchronous step whose seeds it uses)
    task: Any
    sample_ids: list[str]
    admitted_version: int  # the engine's live version when the group was admitted
    state: str = "queued"
    samples: list | None = None
    min_version: int | None = None  # oldest policy version among the group's loss tokens
    max_version: int | None = None
    attempts: int = 0
    t_admit: float = dataclasses.field(default_factory=time.monotonic)
    t_ready: float | None = None

    @property
    def task_id(self) -> str:
        return str(getattr(self.task, "instance_id", self.task))


def sample_ids(index: int, task_id: str, group_size: int) -> list[str]:
    """Run-unique ids of a group's samples ("g<admission>/<task>#<k>"; the task may recur in tests)."""
    return [f"g{index}/{task_id}#{k}" for k in range(group_size)]


def loss_versions(samples: Sequence[Any]) -> list[int]:
    """Policy versions of every loss token of the live samples (objects with .trajectory/.mask_reason)."""
    out: list[int] = []
    for s in samples:
        if getattr(s, "mask_reason", None):
            continue
        for seg in s.trajectory.segments:
            out.extend(int(v) for v, m in zip(seg.policy_versions, seg.loss_mask) if m)
    return out


class Reconciler:
    """See module docstring. Not thread-safe by itself: the driver calls it from one thread."""

    def __init__(self, *, batch_groups: int, group_size: int, max_staleness: int, ledger: SampleLedger | None = None,
                 max_running: int | None = None, max_batches: int | None = None, max_retries: int = 2,
                 admission: str = "bounded", first_batch: int = 0) -> None:
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {admission!r}")
        if batch_groups < 1 or group_size < 1 or max_staleness < 0:
            raise ValueError("batch_groups and group_size must be >= 1, max_staleness >= 0")
        self.B, self.G, self.s = int(batch_groups), int(group_size), int(max_staleness)
        self.ledger = ledger if ledger is not None else SampleLedger()
        self.max_running = max_running
        self.max_batches = max_batches  # batches 0..max_batches-1 (the run's updates)
        self.max_retries = int(max_retries)
        self.admission = admission
        self.slots: dict[int, Slot] = {}
        self.n_admitted = 0
        self.n_dropped_groups = 0
        self.ready_order: list[int] = []  # slot indices in completion order
        self.drops: dict[str, int] = {}
        self.next_train = int(first_batch)  # the batch the next update trains
        self.batch_live: dict[int, int] = {}  # batch -> live (admitted, not dropped) groups

    # ---- admission --------------------------------------------------------------------------------
    def live_groups(self) -> int:
        return self.n_admitted - self.n_dropped_groups

    def running(self) -> int:
        return sum(1 for s in self.slots.values() if s.state in ("queued", "rolling_out"))

    def next_batch(self) -> int:
        """The lowest batch (not yet trained) with room for another group."""
        u = self.next_train
        while self.batch_live.get(u, 0) >= self.B:
            u += 1
        return u

    def admissible(self, live_version: int) -> bool:
        if self.max_running is not None and self.running() >= self.max_running:
            return False
        if self.admission == "unbounded":
            return True
        u = self.next_batch()
        if self.max_batches is not None and u >= self.max_batches:
            return False
        return u <= int(live_version) + self.s

    def admit(self, task: Any, live_version: int) -> Slot:
        if not self.admissible(live_version):
            raise RuntimeError("admit: not admissible now (check admissible() first)")
        idx = self.n_admitted
        task_id = str(getattr(task, "instance_id", task))
        slot = Slot(idx, self.next_batch(), task, sample_ids(idx, task_id, self.G), int(live_version))
        self.slots[idx] = slot
        self.n_admitted += 1
        self.batch_live[slot.batch] = self.batch_live.get(slot.batch, 0) + 1
        self.ledger.queue(slot.sample_ids, group=idx)
        return slot

    def restore_slot(self, slot: Slot) -> None:
        """Re-register a slot from a checkpoint (its ledger records come from the ledger snapshot)."""
        self.slots[slot.index] = slot
        self.batch_live[slot.batch] = self.batch_live.get(slot.batch, 0) + 1
        if slot.state == "ready" and slot.index not in self.ready_order:
            self.ready_order.append(slot.index)

    # ---- lifecycle --------------------------------------------------------------------------------
    def started(self, slot: Slot) -> None:
        slot.state = "rolling_out"
        slot.attempts += 1

    def sample_state(self, slot: Slot, k: int, state: str) -> None:
        """Per-sample progress from the rollout worker (``rolling_out`` / ``grading``)."""
        self.ledger.move([slot.sample_ids[k]], state)

    def completed(self, slot: Slot, samples: Sequence[Any]) -> None:
        """A complete group (all `group_size` samples graded or masked) becomes ready."""
        if len(samples) != self.G:
            raise ValueError(f"group {slot.index}: {len(samples)} samples, expected {self.G} (partial groups never train)")
        if slot.state in ("ready", "trained", "dropped"):
            raise RuntimeError(f"group {slot.index} completed twice (state {slot.state})")
        slot.samples = list(samples)
        vs = loss_versions(samples)
        slot.min_version = min(vs) if vs else slot.admitted_version
        slot.max_version = max(vs) if vs else slot.admitted_version
        slot.state, slot.t_ready = "ready", time.monotonic()
        self.ledger.move(slot.sample_ids, "ready")
        self.ready_order.append(slot.index)

    def lost(self, slot: Slot, why: str) -> bool:
        """The group's worker died: True = roll it out again (same ids and seeds), False = dropped."""
        if slot.attempts <= self.max_retries:
            slot.state = "queued"
            self.ledger.requeue(slot.sample_ids, why)
            return True
        self.drop(slot, "worker_lost")
        return False

    def drop(self, slot: Slot, reason: str) -> None:
        open_ids = [i for i in slot.sample_ids if self.ledger.state(i) not in ("trained", "dropped")]
        self.ledger.dropped(open_ids, reason)
        if slot.index in self.ready_order:
            self.ready_order.remove(slot.index)
        slot.state = "dropped"
        self.batch_live[slot.batch] = self.batch_live.get(slot.batch, 0) - 1
        self.n_dropped_groups += 1
        self.drops[reason] = self.drops.get(reason, 0) + 1

    # ---- the trainer's side -----------------------------------------------------------------------
    def ready_count(self) -> int:
        return len(self.ready_order)

    def take(self, trainer_version: int) -> list[Slot] | None:
        """The next update's groups, sorted by admission, or None while they are not all ready.
        Bounded: the ``batch_groups`` groups of batch `next_train`. Unbounded (control): the first
        ``batch_groups`` groups to complete. Groups beyond the staleness bound are dropped ('stale')."""
        for idx in list(self.ready_order):
            slot = self.slots[idx]
            if int(trainer_version) - int(slot.min_version) > self.s:
                self.drop(slot, "stale")
        if self.admission == "unbounded":
            chosen = self.ready_order[: self.B]
        else:
            chosen = [i for i in self.ready_order if self.slots[i].batch == self.next_train]
        if len(chosen) < self.B or (self.admission == "bounded" and self.batch_live.get(self.next_train, 0) > self.B):
            return None
        self.ready_order = [i for i in self.ready_order if i not in chosen]
        self.batch_live.pop(self.next_train, None)
        self.next_train += 1
        return sorted((self.slots[i] for i in chosen), key=lambda s: s.index)

    def trained(self, slots: Iterable[Slot], step: int, version: int) -> None:
        """Ledger after an update: live samples trained, masked ones dropped with their reason."""
        for slot in slots:
            live, masked = [], {}
            for sid, s in zip(slot.sample_ids, slot.samples or []):
                if s.mask_reason:
                    masked.setdefault("masked:" + s.mask_reason.split(" ")[0], []).append(sid)
                else:
                    live.append(sid)
            self.ledger.trained(live, step, version)
            for reason, ids in masked.items():
                self.ledger.dropped(ids, reason)
            slot.state = "trained"
            slot.samples = None  # trained: the trajectories are no longer needed
            del self.slots[slot.index]

    def drain(self, reason: str = "run_ended") -> None:
        for slot in list(self.slots.values()):
            if slot.state not in ("trained", "dropped"):
                self.drop(slot, reason)
            self.slots.pop(slot.index, None)

    # ---- checkpoint -------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-able counters and open slots (task ids only; samples live in the group store)."""
        return {"n_admitted": self.n_admitted, "n_dropped_groups": self.n_dropped_groups, "drops": dict(self.drops),
                "next_train": self.next_train,
                "slots": [{"index": s.index, "batch": s.batch, "task_id": s.task_id, "state": s.state,
                           "admitted_version": s.admitted_version, "attempts": s.attempts}
                          for s in self.slots.values() if s.state not in ("trained", "dropped")]}
