"""Group checkpoints hold the synchronous stage's own sample type: `rl_rollouts.Sample` goes through
`sample_to_record` / `sample_from_record` (and a saved group) and comes back equal, field by field,
with the task re-attached; a record of the previous format (no events) still loads; an unknown
format is a clear error."""
from __future__ import annotations

import dataclasses
import json
import types

import numpy as np
import pytest

from c2jax.train.async_rl.group_store import GroupStore, sample_from_record, sample_to_record
from c2jax.train.rl_rollouts import Sample
from c2jax.trajectory import Segment, Trajectory


TASK = types.SimpleNamespace(instance_id="t7")


def _sample(k: int, masked: bool = False) -> Sample:
    seg = Segment(prompt_ids=[1, 2, 3], completion_ids=[4 + k, 5, 6], loss_mask=[1, 0, 1],
                  behaviour_logprobs=[-0.1 - k, -2.5, -0.3333333], policy_versions=[3, 3, 4])
    traj = Trajectory(segments=[seg], task_id="t7", group_id="t7", reward_terms={"reward": 1.0, "task": 0.5},
                      sample_id=f"t7#{k}")
    events = [{"type": "grade", "t": 0.25, "duration_s": 1.5, "flags": ["x"]}, {"type": "odd", "obj": {1, 2}}]
    return Sample(TASK, k, traj, "infra:sandbox" if masked else None, "stop", 2.5, 1.5, events)


def _same(a: Sample, b: Sample) -> None:
    assert a.task is b.task and a.index == b.index and a.mask_reason == b.mask_reason
    assert (a.stop_reason, a.wall_s, a.grade_s) == (b.stop_reason, b.wall_s, b.grade_s)
    assert a.trajectory.to_json() == b.trajectory.to_json()
    for sa, sb in zip(a.trajectory.segments, b.trajectory.segments):
        np.testing.assert_array_equal(sa.behaviour_logprobs, sb.behaviour_logprobs)  # exact, not rounded
        np.testing.assert_array_equal(sa.policy_versions, sb.policy_versions)


def test_sample_round_trip_is_exact():
    s = _sample(1)
    back = sample_from_record(json.loads(json.dumps(sample_to_record(s))), s.task)
    assert type(back) is Sample
    _same(s, back)
    assert back.events[0] == s.events[0] and back.events[1]["obj"] == repr({1, 2})  # non-JSON values: repr


def test_saved_group_restores_samples_and_checks_the_task(tmp_path):
    store = GroupStore(str(tmp_path))
    samples = [_sample(0), _sample(1, masked=True)]
    slot = types.SimpleNamespace(index=4, batch=2, task_id="t7", sample_ids=["g4/t7#0", "g4/t7#1"], min_version=3,
                                 max_version=4, samples=samples)
    store.save(slot)
    rec = store.load(4)
    for a, b in zip(samples, rec.restore_samples(samples[0].task)):
        _same(a, b)
    assert rec.advantages == [0.0, 0.0]  # one live sample: reward minus its own mean; masked -> 0
    with pytest.raises(ValueError, match="stored for task 't7'"):
        rec.restore_samples(types.SimpleNamespace(instance_id="other"))

    d = json.load(open(store.path(4)))
    d["format"] = 1
    for r in d["samples"]:
        del r["events"]
    json.dump(d, open(store.path(4), "w"))
    old = store.load(4).restore_samples(samples[0].task)
    assert [s.events for s in old] == [[], []]
    _same(dataclasses.replace(samples[0], events=[]), old[0])
    d["format"] = 99
    json.dump(d, open(store.path(4), "w"))
    with pytest.raises(ValueError, match="format 99"):
        store.load(4)
