"""The RL stage's task stream: single epoch (a task is never trained twice), deterministic, resumable.

    stream = TaskStream(tasks, seed=0, upsample_after_step=8, weights={"turns": 1.0}, pool=4)
    batch = stream.take(4, step)           # the next 4 tasks
    stream.observe(task_id, turns=3.0, thinking_tokens=120.0)   # rollout heuristics of a task
    state = stream.state(); stream.load_state(state)            # JSON-able, for step checkpoints

Order: a seeded permutation of the training tasks. Until ``upsample_after_step`` tasks are taken in
that order. From then on (the report's curriculum, section 3.2: "in later stages, simple heuristics
upsample harder data points, e.g. the number of turns and thinking tokens in rollouts") each pick
looks at the next ``pool`` unseen tasks in the order and takes the one with the highest hardness
score; a task's score is the weighted heuristics of the rollouts of its *nearest trained neighbour*
in the same family bucket (tasks share a bucket when their records' ``metadata['bucket']`` agree,
e.g. the bug kind), since a task itself has never been rolled out before it is trained (single
epoch). Ties and buckets never seen fall back to the permutation order, so the stream is a pure
function of (tasks, seed, observations) and a resumed run draws the same tasks.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Sequence


def task_bucket(task: Any) -> str:
    md = getattr(task, "metadata", None) or {}
    return str(md.get("bucket") or md.get("kind") or md.get("category") or getattr(task, "category", "") or "")


class TaskStream:
    """Single-epoch stream over `tasks` (see module docstring)."""

    def __init__(self, tasks: Sequence[Any], *, seed: int = 0, upsample_after_step: int | None = None,
                 weights: Mapping[str, float] | None = None, pool: int = 4) -> None:
        ids = [t.instance_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("TaskStream: duplicate instance ids in the training tasks")
        self.tasks = {t.instance_id: t for t in tasks}
        order = sorted(ids)
        random.Random(seed).shuffle(order)
        self.order = order
        self.used: list[str] = []
        self.upsample_after_step = upsample_after_step
        self.weights = dict(weights or {})
        self.pool = max(1, int(pool))
        self.bucket_stats: dict[str, list[float]] = {}  # bucket -> [sum of scores, count]

    def remaining(self) -> int:
        return len(self.order) - len(self.used)

    def _score(self, tid: str) -> float | None:
        s = self.bucket_stats.get(task_bucket(self.tasks[tid]))
        return None if not s or not s[1] else s[0] / s[1]

    def take(self, n: int, step: int) -> list[Any]:
        """The next `n` unseen tasks (fewer only if the epoch is exhausted: raises then)."""
        if self.remaining() < n:
            raise RuntimeError(f"task stream exhausted: {self.remaining()} unseen tasks left, {n} needed "
                               f"(single epoch: a task is never trained twice; raise rl.tasks.n_train)")
        used = set(self.used)
        out = []
        upsample = self.upsample_after_step is not None and step >= self.upsample_after_step and self.weights
        for _ in range(n):
            cand = [t for t in self.order if t not in used][: self.pool if upsample else 1]
            pick = cand[0]
            if upsample:
                scored = [(self._score(t), -i, t) for i, t in enumerate(cand)]
                known = [s for s in scored if s[0] is not None]
                if known:
                    pick = max(known)[2]
            used.add(pick)
            self.used.append(pick)
            out.append(self.tasks[pick])
        return out

    def observe(self, task_id: str, **heuristics: float) -> None:
        """Record the mean rollout heuristics (turns, thinking_tokens) of a trained task."""
        if not self.weights or task_id not in self.tasks:
            return
        score = sum(float(self.weights.get(k, 0.0)) * float(v) for k, v in heuristics.items())
        s = self.bucket_stats.setdefault(task_bucket(self.tasks[task_id]), [0.0, 0.0])
        s[0] += score
        s[1] += 1.0

    def state(self) -> dict:
        return {"used": list(self.used), "bucket_stats": {k: list(v) for k, v in self.bucket_stats.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        used = list(state.get("used", []))
        missing = [t for t in used if t not in self.tasks]
        if missing:
            raise ValueError(f"task stream state names tasks not in the training set: {missing[:3]}")
        self.used = used
        self.bucket_stats = {k: list(v) for k, v in dict(state.get("bucket_stats", {})).items()}


def kind_weights(tasks: Sequence[Any], power: float = 1.0, kind_of: Any = None) -> tuple[dict[str, float], dict]:
    """Per-task weights for ``rl.task_weights.by="kind"``: count(kind) ** -power over `tasks`, normalised
    to mean 1, so with power 1 every kind of fix carries the same total weight in the updates (the
    common kind's groups no longer outvote the rare kinds'). `kind_of(task)` defaults to
    `c2jax.train.agent_sft.demo_kind`. Returns ({instance_id: weight}, {kind: {"tasks", "weight"}})."""
    if kind_of is None:
        from c2jax.train.agent_sft import demo_kind as kind_of
    kinds = {t.instance_id: kind_of(t) for t in tasks}
    counts: dict[str, int] = {}
    for k in kinds.values():
        counts[k] = counts.get(k, 0) + 1
    raw = {i: counts[k] ** -float(power) for i, k in kinds.items()}
    mean = sum(raw.values()) / max(len(raw), 1)
    weights = {i: w / mean for i, w in raw.items()}
    by_kind = {k: {"tasks": n, "weight": counts[k] ** -float(power) / mean} for k, n in sorted(counts.items())}
    return weights, by_kind

