"""Graded rollouts for one RL step: `group_size` episodes per task through the real harness, engine
policy and sandbox pool, each checked and either kept or masked with a counted reason.

    samples = collect(harness, policy, tasks, group_size=8, pool=pool, max_in_flight=32)
    [s.trajectory for s in samples]; Counter(s.mask_reason for s in samples if s.mask_reason)

Masking (never scored as 0; the loss excludes the sample, the step goes on):
  infra:sandbox      the task's environment vanished or its sandbox died (start or mid-episode)
  infra:grader       the grader masked its result (environment at fault, e.g. gold also fails)
  nan_logprobs       a sampled token's behaviour logprob is not finite
  malformed          the trajectory fails `Trajectory.validate` (inconsistent record)
  too_long           a segment does not fit the learner's row (`max_len`)
  error:<Type>       any other exception while rolling out or grading
Grading uses `grade_validated` (the real grader; an empty diff scores 0 without a test run).
A policy failure (malformed tool call, budget or time limit hit, no fix) is NOT masked: it is
graded like any other attempt (reward 0; malformed calls also feed the ``broken_tool_calls`` term).
The grader's reward goes into ``reward_terms['task']`` (what ``rl.rewards.task`` reads).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from c2jax.trajectory import Trajectory, TrajectoryError


@dataclasses.dataclass
class Sample:
    task: Any
    index: int  # sample number within the task's group
    trajectory: Trajectory
    mask_reason: str | None
    stop_reason: str
    wall_s: float
    grade_s: float
    events: list


def _mask(traj: Trajectory, reason: str) -> None:
    traj.infra_failed = True
    traj.metadata["mask_reason"] = reason


def grade_validated(task: Any, diff: str) -> Any:
    """The real grader, except that an EMPTY diff scores 0 without running the tests: a validated task's
    broken state fails its FAIL_TO_PASS tests by construction (every family checks that at build
    time), so the run could only repeat that. Saves a sandboxed pytest run per no-edit episode."""
    from c2jax.envs.grading import GradeResult, grade

    if not (diff or "").strip() and task.hidden_tests.FAIL_TO_PASS:
        return GradeResult(0.0, False, 0.0, 0, False, ["empty_diff"])
    return grade(task, diff)


def check_sample(traj: Trajectory, max_len: int) -> str | None:
    """The reason this trajectory must be masked, or None (see module docstring)."""
    if traj.infra_failed:
        grade = traj.metadata.get("grade") or {}
        return "infra:grader" if grade.get("masked") else "infra:sandbox"
    try:
        traj.validate()
    except (TrajectoryError, ValueError) as e:
        return f"malformed ({str(e)[:80]})"
    for s in traj.segments:
        lp = np.asarray(s.behaviour_logprobs)[np.asarray(s.loss_mask) > 0]
        if lp.size and not np.all(np.isfinite(lp)):
            return "nan_logprobs"
        if s.num_positions > max_len:
            return "too_long"
    if "reward" not in traj.reward_terms or not math.isfinite(float(traj.reward_terms["reward"])):
        return "infra:grader"
    return None


def _announcing(grade_fn: Callable, announce: Callable[[], None]) -> Callable:
    def graded(task: Any, diff: str) -> Any:
        announce()
        return grade_fn(task, diff)
    return graded


async def _one(harness: Any, policy: Any, task: Any, k: int, pool: Any, sem: asyncio.Semaphore, max_len: int,
               grade_fn: Callable | None, on_state: Callable[[Any, int, str], None] | None = None,
               grade_sem: asyncio.Semaphore | None = None) -> Sample:
    """One graded sample: `sem` bounds the episodes solving, `grade_sem` those grading (a finished
    episode frees its place in `sem` before its grader runs; see c2jax.agent.rollout)."""
    from c2jax.agent.rollout import failed_episode, arollout

    t0 = time.monotonic()

    @contextlib.asynccontextmanager
    async def solving():
        nonlocal t0
        async with sem:
            t0 = time.monotonic()  # the sample's wall time starts when it gets its place
            if on_state is not None:
                on_state(task, k, "rolling_out")
            yield

    if on_state is not None:
        grade_fn = _announcing(grade_fn, lambda: on_state(task, k, "grading"))
    try:
        ep = await arollout(harness, policy, task, pool=pool, sample=k, grade_fn=grade_fn,
                            solve_gate=solving(), grade_gate=grade_sem)
    except Exception as e:  # noqa: BLE001 - a crashed rollout is masked and counted, never fatal
        ep = failed_episode(task, k, f"{type(e).__name__}: {e}")
        ep.trajectory.metadata["mask_reason"] = f"error:{type(e).__name__}"
    wall = time.monotonic() - t0
    traj = ep.trajectory
    reason = traj.metadata.get("mask_reason") or check_sample(traj, max_len)
    if reason:
        _mask(traj, reason)
    else:
        traj.reward_terms["task"] = float(traj.reward_terms["reward"])
    grade_s = sum(float(e.get("duration_s", 0.0)) for e in ep.events if e.get("type") == "grade")
    return Sample(task, k, traj, reason, ep.stop_reason, wall, grade_s, ep.events)


async def acollect(harness: Any, policy: Any, tasks: Sequence[Any], *, group_size: int, pool: Any = None,
                   max_in_flight: int = 32, max_len: int = 1 << 30, grade_fn: Callable | None = None,
                   on_state: Callable[[Any, int, str], None] | None = None) -> list[Sample]:
    """`group_size` graded episodes per task, at most `max_in_flight` solving at once (and as many
    grading); order: task-major.
    `on_state(task, k, state)` (optional) hears each episode start ``rolling_out`` and, just before
    its grader runs, ``grading`` (the asynchronous services' sample lifecycle)."""
    from c2jax.bench.agent_eval import ensure_threads

    grade_fn = grade_fn or grade_validated
    ensure_threads(2 * max_in_flight + 8)  # sandbox starts, tools and grading run in threads: room for every episode
    sem, grade_sem = asyncio.Semaphore(max_in_flight), asyncio.Semaphore(max_in_flight)
    return list(await asyncio.gather(*(_one(harness, policy, t, k, pool, sem, max_len, grade_fn, on_state, grade_sem)
                                       for t in tasks for k in range(group_size))))


def collect(*args: Any, **kw: Any) -> list[Sample]:
    return asyncio.run(acollect(*args, **kw))


def sample_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """Per-step rollout metrics: pass rate over graded samples, masks by reason, effort, tools."""
    live = [s for s in samples if not s.mask_reason]
    out: dict[str, float] = {"rollouts/total": float(len(samples)), "rollouts/graded": float(len(live)),
                             "rollouts/masked": float(len(samples) - len(live))}
    for s in samples:
        if s.mask_reason:
            key = "masked/" + s.mask_reason.split(" ")[0]
            out[key] = out.get(key, 0.0) + 1.0
    # hidden-test timeouts by how grading settled them (c2jax.bench.agent_eval.timeout_tally): retried
    # or masked ones say the step's grading shared an overloaded machine
    from c2jax.bench.agent_eval import timeout_tally

    tally = timeout_tally([{"flags": (s.trajectory.metadata.get("grade") or {}).get("flags", [])} for s in samples])
    out.update({f"grading/timeouts_{k}": float(v) for k, v in tally.items()})
    if live:
        res = [float(s.trajectory.reward_terms.get("resolved", 0.0)) for s in live]
        out["pass_rate"] = float(np.mean(res))
        out["reward/grader"] = float(np.mean([s.trajectory.reward_terms["task"] for s in live]))
        calls = [len(s.trajectory.tool_events) for s in live]
        bad = [sum(e.malformed for e in s.trajectory.tool_events) for s in live]
        out["tools/calls_mean"] = float(np.mean(calls))
        out["tools/malformed_mean"] = float(np.mean(bad))
        wf = [s for s in live if not any(e.malformed for e in s.trajectory.tool_events)]
        out["tools/wellformed_share"] = len(wf) / len(live)
        if wf:
            out["pass_rate/wellformed"] = float(np.mean([s.trajectory.reward_terms.get("resolved", 0.0) for s in wf]))
        for f in ("thinking_tokens", "tool_call_tokens", "tool_output_tokens", "final_message_tokens", "tool_calls",
                  "turns"):
            out[f"effort/{f}"] = float(np.mean([getattr(s.trajectory.effort, f) for s in live]))
        out["tokens/policy"] = float(sum(s.trajectory.num_policy_tokens for s in live))
        stops: dict[str, int] = {}
        for s in live:
            stops[s.stop_reason] = stops.get(s.stop_reason, 0) + 1
        for k, v in stops.items():
            out[f"stop/{k}"] = float(v)
    out["time/grading_s_sum"] = float(sum(s.grade_s for s in samples))
    return out
