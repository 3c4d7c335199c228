"""A discrete-event model of the asynchronous loop around the real `Reconciler` (virtual time).

    res = simulate(SimConfig(steps=200, batch_groups=4, group_size=8, max_staleness=1))
    res.wall, res.trained_lengths, res.completed_lengths, res.staleness, res.trainer_idle_fraction
    base = simulate_sync(SimConfig(...))   # the synchronous stage: all groups of a step, then train

Each sample has a length L ~ lognormal(len_mu, len_sigma) (policy tokens) and a rollout latency
``L * s_per_token + env`` with env ~ lognormal(env_mu, env_sigma) (sandbox, tools, tests: the heavy
tail). A group is ready when its slowest sample is. The trainer takes ``train_s`` per update and
the engine applies a published version ``publish_s`` later; with in-flight updates a token carries
the version live when it was generated (tokens are spread evenly over the sample's generation).

The driver logic is the same as `runner.AsyncRL`'s (admit while admissible, consume
``batch_groups`` ready groups when the trainer is free, publish after each update), only the clock is
virtual, so the reconciler's admission, staleness and drop rules are exercised deterministically and
in milliseconds (the tests' length-bias check, the benchmark's latency model).
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import types
from typing import Any

import numpy as np

from c2jax.train.async_rl.ledger import SampleLedger
from c2jax.train.async_rl.reconciler import Reconciler


@dataclasses.dataclass
class SimConfig:
    steps: int = 100
    batch_groups: int = 4  # groups per update (tasks_per_step)
    group_size: int = 8
    max_staleness: int = 1
    max_running: int = 4  # groups rolling out at once (engine slots / group_size)
    len_mu: float = 5.0  # log of the median policy tokens of a rollout
    len_sigma: float = 0.8
    s_per_token: float = 0.01
    env_mu: float = 0.0  # log of the median environment seconds of a rollout
    env_sigma: float = 1.0  # heavy tail
    train_s: float = 1.0
    publish_s: float = 0.05
    inflight_updates: bool = True
    admission: str = "bounded"
    seed: int = 0


@dataclasses.dataclass
class SimResult:
    wall: float
    trained_lengths: np.ndarray
    completed_lengths: np.ndarray
    staleness: dict[int, int]  # trainer version at update - oldest token version -> tokens
    trainer_idle_fraction: float
    drops: dict[str, int]
    ledger: dict


def _sample(rng: np.random.Generator, c: SimConfig) -> tuple[float, float]:
    length = float(np.ceil(rng.lognormal(c.len_mu, c.len_sigma)))
    return length, length * c.s_per_token + float(rng.lognormal(c.env_mu, c.env_sigma))


def _versions(t0: float, gen_s: float, n: int, history: list[tuple[float, int]], fixed: int | None) -> list[int]:
    """Version of each of n tokens generated evenly over [t0, t0 + gen_s]."""
    if fixed is not None:
        return [fixed] * n
    times = t0 + gen_s * (np.arange(n) + 1) / max(n, 1)
    ts = np.asarray([h[0] for h in history])
    vs = np.asarray([h[1] for h in history])
    return vs[np.searchsorted(ts, times, side="right") - 1].tolist()


def simulate(c: SimConfig) -> SimResult:
    """The asynchronous loop in virtual time (see module docstring)."""
    rng = np.random.default_rng(c.seed)
    ledger = SampleLedger()
    rec = Reconciler(batch_groups=c.batch_groups, group_size=c.group_size, max_staleness=c.max_staleness,
                     ledger=ledger, max_running=c.max_running,
                     max_batches=c.steps if c.admission == "bounded" else None,
                     admission=c.admission)
    now, live, version = 0.0, 0, 0
    history: list[tuple[float, int]] = [(0.0, 0)]  # (time applied, version) in the engine
    pending_pub: list[tuple[float, int]] = []
    events: list = []  # (time, seq, kind, payload)
    seq = itertools.count()
    training_until: float | None = None
    training_slots: list = []
    busy = 0.0
    completed: list[float] = []
    trained: list[float] = []
    stale_hist: dict[int, int] = {}
    held: int | None = None
    tasks = itertools.count()
    steps_done = 0

    def start(slot: Any) -> None:
        rec.started(slot)
        draws = [_sample(rng, c) for _ in range(c.group_size)]
        done = now + max(lat for _, lat in draws)
        heapq.heappush(events, (done, next(seq), "group", (slot, draws, now)))

    while steps_done < c.steps:
        # engine applies published versions whose delay elapsed
        for t, v in [p for p in pending_pub if p[0] <= now]:
            live = v
            history.append((t, v))
        pending_pub = [p for p in pending_pub if p[0] > now]
        if held is not None and rec.running() == 0:
            pending_pub.append((now + c.publish_s, held))
            heapq.heappush(events, (now + c.publish_s, next(seq), "tick", None))
            held = None
        if held is None:
            while rec.admissible(live):
                start(rec.admit(f"task{next(tasks)}", live))
        if training_until is None:
            slots = rec.take(version)
            if slots is not None:
                training_slots, training_until = slots, now + c.train_s
                busy += c.train_s
                heapq.heappush(events, (training_until, next(seq), "train", None))
        if not events:
            raise RuntimeError("simulation starved: nothing in flight and too few ready groups")
        now, _, kind, payload = heapq.heappop(events)
        if kind == "group":
            slot, draws, t0 = payload
            if slot.state == "dropped":
                continue
            fixed = None if c.inflight_updates else live
            samples = []
            for length, lat in draws:
                n = int(length)
                vs = _versions(t0, n * c.s_per_token, n, history, fixed)
                seg = types.SimpleNamespace(policy_versions=vs, loss_mask=[1] * n)
                samples.append(types.SimpleNamespace(trajectory=types.SimpleNamespace(segments=[seg]),
                                                     mask_reason=None, length=length))
                completed.append(length)
            rec.completed(slot, samples)
        elif kind == "train":
            for slot in training_slots:
                for s in slot.samples:
                    trained.append(s.length)
                    for v in s.trajectory.segments[0].policy_versions:
                        stale_hist[version - v] = stale_hist.get(version - v, 0) + 1
            rec.trained(training_slots, steps_done + 1, version)
            version += 1
            steps_done += 1
            training_until = None
            if c.inflight_updates or rec.running() == 0:
                pending_pub.append((now + c.publish_s, version))
                heapq.heappush(events, (now + c.publish_s, next(seq), "tick", None))
            else:
                held = version
    rec.drain("run_ended")
    return SimResult(now, np.asarray(trained), np.asarray(completed), dict(sorted(stale_hist.items())),
                     1.0 - busy / now if now else 0.0, dict(rec.drops), ledger.summary())


def simulate_sync(c: SimConfig) -> SimResult:
    """The synchronous stage: a step's groups all roll out (``max_running`` at a time), then the update,
    then the publish; the trainer idles while rollouts run and the rollouts while it trains."""
    rng = np.random.default_rng(c.seed)
    now, busy, lengths = 0.0, 0.0, []
    for _ in range(c.steps):
        free = [now] * c.max_running  # group slots
        for _g in range(c.batch_groups):
            draws = [_sample(rng, c) for _ in range(c.group_size)]
            i = int(np.argmin(free))
            free[i] += max(lat for _, lat in draws)
            lengths.extend(length for length, _ in draws)
        now = max(free) + c.train_s + c.publish_s
        busy += c.train_s
    arr = np.asarray(lengths)
    return SimResult(now, arr, arr, {0: int(arr.sum())}, 1.0 - busy / now, {}, {})
