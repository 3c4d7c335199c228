"""The RL step's rollout metrics count how grading settled hidden-test timeouts (retried and finished,
the policy's, masked), so a step whose grading shared an overloaded machine shows it in train.jsonl."""
from __future__ import annotations

import types

from c2jax.train.rl_rollouts import Sample, sample_stats
from c2jax.trajectory import Segment, Trajectory

TASK = types.SimpleNamespace(instance_id="t0")


def _sample(k: int, flags: list[str], masked: bool = False, resolved: float = 0.0) -> Sample:
    seg = Segment(prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6], loss_mask=[1, 1, 1],
                  behaviour_logprobs=[-0.1, -0.2, -0.3], policy_versions=[0, 0, 0])
    traj = Trajectory(segments=[seg], task_id="t0", group_id="t0", sample_id=f"t0#{k}",
                      reward_terms={"reward": resolved, "task": resolved, "resolved": resolved},
                      metadata={"grade": {"flags": flags, "masked": masked, "duration_s": 1.0}})
    return Sample(TASK, k, traj, "grade:infra:timeout" if masked else None, "finished", 1.0, 1.0, [])


def test_timeouts_are_counted_by_how_grading_settled_them():
    samples = [_sample(0, ["retried:timeout"], resolved=1.0), _sample(1, ["timeout", "no_report"]),
               _sample(2, ["timeout", "infra:timeout"], masked=True), _sample(3, [])]
    out = sample_stats(samples)
    assert (out["grading/timeouts_retried"], out["grading/timeouts_policy"], out["grading/timeouts_masked"]) \
        == (1.0, 1.0, 1.0)
    assert out["rollouts/masked"] == 1.0 and out["rollouts/graded"] == 3.0
    calm = sample_stats([_sample(0, []), _sample(1, ["unsafe_diff"])])
    assert calm["grading/timeouts_retried"] == calm["grading/timeouts_policy"] == calm["grading/timeouts_masked"] == 0.0
