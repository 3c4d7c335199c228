"""Group-level sample checkpoints: every complete group is on disk until an update that trained it is.

    store = GroupStore(dir)
    store.save(slot, advantages)       # when the group becomes ready (atomic: tmp file + rename)
    store.load(index)                  # -> GroupRecord or None (missing file: roll the group out again)
    store.remove(indices)              # after a trainer checkpoint that includes their update

A record holds the group's samples -- the same `rl_rollouts.Sample` the synchronous stage trains,
in the serialisation `sample_to_record` / `sample_from_record` documents (the trajectory with exact
token ids, behaviour logprobs, routes, policy versions and reward terms; mask reason, stop reason,
timings and episode events; only the task is left out and re-attached from the task stream) -- the
group's advantages (the loss recomputes them from the same rewards; stored for inspection), the admission
index, the step whose seeds it used, and the oldest/newest policy version of its loss tokens.
Restoring the trainer from checkpoint step c reloads the ready groups of the snapshot from here, so
a restart neither loses nor repeats a sample (see `runner.AsyncRL.restore`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np

from c2jax.train.rl_rollouts import Sample
from c2jax.trajectory import Trajectory

FORMAT = 2  # 2: samples carry their episode events (1: without; still read, events = [])
READABLE = (1, 2)


def sample_to_record(sample: Sample) -> dict:
    """A JSON-able record of `sample`, every field but ``task`` (a group's task is stored once, as its
    id). The trajectory is `Trajectory.to_json` (exact: ids, logprobs, routes, versions); event values
    JSON cannot hold are stored as their ``repr``."""
    return {"index": int(sample.index), "trajectory": sample.trajectory.to_json(), "mask_reason": sample.mask_reason,
            "stop_reason": sample.stop_reason, "wall_s": float(sample.wall_s), "grade_s": float(sample.grade_s),
            "events": json.loads(json.dumps(list(sample.events or []), default=repr))}


def sample_from_record(record: dict, task: Any) -> Sample:
    """The `Sample` of `sample_to_record` with its `task` re-attached."""
    return Sample(task, int(record["index"]), Trajectory.from_json(record["trajectory"]), record["mask_reason"],
                  record["stop_reason"], float(record["wall_s"]), float(record["grade_s"]),
                  list(record.get("events", [])))


@dataclasses.dataclass
class GroupRecord:
    index: int
    batch: int
    task_id: str
    sample_ids: list[str]
    min_version: int
    max_version: int
    advantages: list[float]
    samples: list[dict]

    def restore_samples(self, task: Any) -> list[Sample]:
        if str(getattr(task, "instance_id", task)) != self.task_id:
            raise ValueError(f"group {self.index}: stored for task {self.task_id!r}, restored with "
                             f"{getattr(task, 'instance_id', task)!r}")
        return [sample_from_record(d, task) for d in self.samples]


def group_advantages(samples: Sequence[Any], reward_key: str = "task") -> list[float]:
    """Dr. GRPO advantages (reward minus the mean over the group's live samples; masked -> 0)."""
    live = [float(s.trajectory.reward_terms.get(reward_key, 0.0)) for s in samples if not s.mask_reason]
    mean = float(np.mean(live)) if live else 0.0
    return [0.0 if s.mask_reason else float(s.trajectory.reward_terms.get(reward_key, 0.0)) - mean for s in samples]


class GroupStore:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)

    def path(self, index: int) -> str:
        return os.path.join(self.dir, f"group_{int(index):08d}.json")

    def save(self, slot: Any) -> str:
        rec = {"format": FORMAT, "index": slot.index, "batch": slot.batch, "task_id": slot.task_id,
               "sample_ids": list(slot.sample_ids), "min_version": int(slot.min_version),
               "max_version": int(slot.max_version), "advantages": group_advantages(slot.samples),
               "samples": [sample_to_record(s) for s in slot.samples]}
        path = self.path(slot.index)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def load(self, index: int) -> GroupRecord | None:
        path = self.path(index)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            d = json.load(f)
        if d.get("format") not in READABLE:
            raise ValueError(f"{path}: group checkpoint format {d.get('format')!r}, expected one of {READABLE}")
        return GroupRecord(int(d["index"]), int(d["batch"]), d["task_id"], list(d["sample_ids"]),
                           int(d["min_version"]), int(d["max_version"]), list(d["advantages"]), list(d["samples"]))

    def indices(self) -> list[int]:
        return sorted(int(n[6:14]) for n in os.listdir(self.dir) if n.startswith("group_") and n.endswith(".json"))

    def remove(self, indices: Iterable[int]) -> None:
        for i in indices:
            try:
                os.remove(self.path(i))
            except FileNotFoundError:
                pass
