"""Trainer restart from group-level sample checkpoints, on the real driver (`AsyncRL`), ledger,
reconciler and group store, with fast stand-ins for the model-bound services (a rollout worker whose
samples are a pure function of (task, sample), jittered latency; a trainer whose "parameters" are a
hash chain over the exact samples it trained, in order). A trainer crash at a random step, then a
restart from the last checkpoint, must end with the uninterrupted run's hash (no sample lost,
repeated or reordered) and a complete ledger; a checkpointed group sampled by a policy version the
restored trainer never published is dropped and counted."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
import types

import pytest

from c2jax.train.async_rl.ledger import SampleLedger
from c2jax.train.async_rl.runner import AsyncRL
from c2jax.train.async_rl.services import LocalBackend
from c2jax.train.rl_rollouts import Sample
from c2jax.train.rl_step import RLContext
from c2jax.train.rl_tasks import TaskStream
from c2jax.trajectory import Segment, Trajectory

B, G, STEPS = 3, 2, 8


@dataclasses.dataclass
class FakeState:
    params: str

    def to_tree(self) -> dict:
        return {"params": self.params}


class FakePublisher:
    def __init__(self, version: int = 0) -> None:
        self.live, self.publish_s = version, 0.0

    def publish(self, params, version):
        self.live = version

    def live_version(self) -> int:
        return self.live


class FakeWorker:
    """Samples depend on (task, k) only; latency jitter reorders completions; versions = live."""

    def __init__(self, publisher: FakePublisher, seed: int) -> None:
        self.pub, self.rng = publisher, random.Random(seed)

    def run_group(self, task, batch, on_state=None):
        out = []
        for k in range(G):
            if on_state:
                on_state(task, k, "rolling_out")
            time.sleep(self.rng.uniform(0, 0.01))
            v = self.pub.live_version()
            h = int(hashlib.sha256(f"{task.instance_id}#{k}".encode()).hexdigest()[:6], 16)
            seg = Segment(prompt_ids=[1, 2], completion_ids=[h % 97, h % 89, 7], loss_mask=[1, 1, 1],
                          behaviour_logprobs=[-0.5, -0.25, -1.0], policy_versions=[v, v, v])
            r = float(h % 2)
            traj = Trajectory(segments=[seg], task_id=task.instance_id, group_id=task.instance_id,
                              reward_terms={"reward": r, "task": r, "resolved": r}, sample_id=f"{task.instance_id}#{k}")
            if on_state:
                on_state(task, k, "grading")
            out.append(Sample(task, k, traj, None, "stop", 0.0, 0.0, []))
        return out


class FakeTrainer:
    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at, self.calls = crash_at, 0

    def train(self, state, samples, version):
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            raise RuntimeError("trainer process killed")
        h = hashlib.sha256(state.params.encode())
        for s in samples:  # everything but the policy versions (timing-dependent when max_staleness > 0)
            seg = s.trajectory.segments[0]
            h.update(seg.completion_ids.tobytes() + seg.behaviour_logprobs.tobytes())
            h.update(json.dumps([s.trajectory.sample_id, s.trajectory.reward_terms]).encode())
        return types.SimpleNamespace(state=FakeState(h.hexdigest()), metrics={"loss": 0.0}, batch=None, logp=None)


class FakeCkpt:
    def __init__(self) -> None:
        self.saved: list = []

    def save(self, step, tree, loader_state=None, meta=None):
        self.saved.append((step, tree["params"], json.loads(json.dumps(loader_state))))


def fake_tasks(n):
    return [types.SimpleNamespace(instance_id=f"task{i:03d}", metadata={}) for i in range(n)]


def _run(out_dir, *, staleness, crash_at=None, seed=0, ckpt=None, restore_from=None):
    rl = {"tasks_per_step": B, "group_size": G, "max_staleness": staleness, "max_in_flight": 2 * G, "ckpt_every": 1}
    ctx = RLContext(rl=rl, learner=None, engine=None, policy=None, harness=None, seed=0)
    stream = TaskStream(fake_tasks(3 * STEPS * B), seed=0, upsample_after_step=None)
    version, start, state = 0, 0, FakeState("init")
    if restore_from is not None:
        start, params, loader = restore_from
        stream.load_state(loader["stream"])
        version, state = loader["version"], FakeState(params)
    pub = FakePublisher(version)
    be = LocalBackend()
    run = AsyncRL(ctx, rollout=be.spawn("rollout", lambda: FakeWorker(pub, seed), workers=2),
                  trainer=be.spawn("trainer", lambda: FakeTrainer(crash_at)), publisher=pub, stream=stream,
                  steps=STEPS, out_dir=str(out_dir), ckpt=ckpt)
    counts = run.restore(restore_from[2], version) if restore_from is not None else {}
    try:
        state, version = run.run(state, start_step=start, version=version)
    finally:
        run.rollout.shutdown()
        run.trainer.shutdown()
    return run, state, counts


@pytest.mark.parametrize("staleness,crash_at,seed", [(0, 4, 0), (1, 5, 1), (2, 3, 2)])
def test_trainer_crash_then_restart_neither_loses_nor_repeats_a_sample(tmp_path, staleness, crash_at, seed):
    ref, ref_state, _ = _run(tmp_path / "ref", staleness=staleness, seed=seed, ckpt=FakeCkpt())
    ckpt = FakeCkpt()
    with pytest.raises(RuntimeError, match="trainer process killed"):
        _run(tmp_path / "run", staleness=staleness, crash_at=crash_at, seed=seed + 10, ckpt=ckpt)
    assert [s for s, _, _ in ckpt.saved] == list(range(1, crash_at))
    run, state, counts = _run(tmp_path / "run", staleness=staleness, seed=seed + 20, ckpt=FakeCkpt(),
                              restore_from=ckpt.saved[-1])
    assert state.params == ref_state.params  # same samples, same order, each exactly once
    assert state.params != FakeState("init").params
    run.ledger.check_complete()
    led = run.ledger.summary()
    assert led["trained"] == STEPS * B * G and led["dropped"] == {} and led["samples"] == STEPS * B * G
    assert ref.ledger.summary()["trained"] == STEPS * B * G
    if staleness > 0:
        assert counts.get("ready_reloaded", 0) + counts.get("rolled_out_again", 0) > 0
    assert max(run.staleness or {0: 0}) <= staleness
    # the on-disk event log replays to the same final ledger
    assert SampleLedger.load(str(tmp_path / "run" / "ledger.jsonl")).records == run.ledger.records


def test_checkpointed_group_from_an_unknown_policy_version_is_dropped_and_counted(tmp_path):
    ckpt = FakeCkpt()
    with pytest.raises(RuntimeError):
        _run(tmp_path / "run", staleness=2, crash_at=3, ckpt=ckpt)
    step, params, loader = ckpt.saved[-1]
    open_slots = loader["async"]["reconciler"]["slots"]
    assert open_slots  # with max_staleness 2, later batches were rolling out at the checkpoint
    # Tamper: one open group's file claims a version the checkpoint never published.
    from c2jax.train.async_rl.group_store import GroupStore

    store = GroupStore(str(tmp_path / "run" / "groups"))
    idx = open_slots[0]["index"]
    path = store.path(idx)
    rec = store.load(idx)
    if rec is None:  # the group had not finished before the crash: write it as if it had
        pytest.skip("first open group had no file")
    d = json.load(open(path))
    d["max_version"] = loader["version"] + 5
    json.dump(d, open(path, "w"))
    run, state, counts = _run(tmp_path / "run", staleness=2, ckpt=FakeCkpt(), restore_from=(step, params, loader))
    assert counts["unknown_policy_version"] == 1
    led = run.ledger.summary()
    assert led["dropped"] == {"unknown_policy_version": G}
    assert led["trained"] == STEPS * B * G  # a replacement task filled the dropped group's place
    run.ledger.check_complete()
