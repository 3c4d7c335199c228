"""Rollouts on task records: an agent episode in the task's sandbox, then grading; the reward terms go
into the trajectory (what the RL library consumes) and infrastructure failures mask it.

    ep = await arollout(harness, policy, task, pool=pool, sample=0)
    ep.trajectory.reward_terms   # reward, resolved, f2p_fraction, p2p_regressions
    ep.trajectory.infra_failed   # sandbox failure while acting, or a masked grade
    eps = await arollout_many(harness, policy, tasks, pool, samples=4)   # groups of 4 per task

`solve_gate` / `grade_gate` (async context managers, e.g. two `asyncio.Semaphore`s) bound the two
phases separately: an episode holds its solve slot (sandbox, policy turns) only until the agent
stops, and waits for a grading slot afterwards. Callers that batch on an engine use this so a
finished episode's slot goes to the next episode while the grader runs: holding one slot through
both phases left about a third of the engine's rows idle in a quickstart evaluation (mean 21.6 of
32 rows active per decode step), since grading takes about as long as solving on 2 cores. On those 2
cores the evaluation's wall time did not change (fewer decode steps, each slower beside the graders;
README, "where else an evaluation's time goes"); the gain is for machines with spare cores.

`HarnessBenchPolicy(harness, policy)` plugs the harness into `c2jax.bench.run.run_policy` (solve ->
Attempt with the diff and the policy's token count).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Callable, Sequence

from c2jax.agent.harness import Episode, Harness
from c2jax.agent.policies import Policy
from c2jax.envs.tasks import TaskRecord


async def arollout(harness: Harness, policy: Policy, task: TaskRecord, *, pool: Any = None, sample: int = 0,
                   grade_fn: Callable | None = None, solve_gate: Any = None, grade_gate: Any = None) -> Episode:
    """One graded episode of `policy` on `task` (sandbox from `task.env_id` with `task.limits`).
    `solve_gate` is held from the sandbox start to its close, `grade_gate` while the grader runs
    (see the module docstring); None: no bound."""
    from c2jax.envs import start
    from c2jax.envs.errors import SandboxError
    from c2jax.envs.grading import grade

    grade_fn = grade_fn or grade
    agent_s = float(task.timeouts.get("agent_s", harness.config.max_wall_s))
    h = Harness(harness.fmt, dataclasses.replace(harness.config, max_wall_s=min(agent_s, harness.config.max_wall_s)))
    limits = dict(task.limits)
    async with solve_gate or contextlib.nullcontext():
        try:
            sb = await asyncio.to_thread(pool.acquire, task.env_id, None, **limits) if pool is not None else \
                await asyncio.to_thread(start, task.env_id, **limits)
        except SandboxError as e:
            return failed_episode(task, sample, f"sandbox start: {e}")
        try:
            ep = await h.arun(policy, sb, task.problem_statement, task_id=task.instance_id, group_id=task.instance_id,
                              sample_id=f"{task.instance_id}#{sample}")
        finally:
            await asyncio.to_thread(sb.close)
    traj = ep.trajectory
    if traj.infra_failed or ep.diff is None:
        return ep
    async with grade_gate or contextlib.nullcontext():
        t0 = time.monotonic()
        g = await asyncio.to_thread(grade_fn, task, ep.diff)
    traj.reward_terms.update(reward=float(g.reward), resolved=float(g.resolved), f2p_fraction=float(g.f2p_fraction),
                             p2p_regressions=float(g.p2p_regressions))
    traj.infra_failed = bool(g.masked)
    traj.metadata["grade"] = {"flags": list(g.flags), "masked": bool(g.masked), "duration_s": g.duration_s}
    ep.events.append({"type": "grade", "t": round(time.monotonic() - t0, 6), "duration_s": round(g.duration_s, 6),
                      "reward": g.reward, "flags": list(g.flags)})
    traj.validate()
    return ep


def failed_episode(task: TaskRecord, sample: int, why: str) -> Episode:
    """An episode masked as an infrastructure failure (no policy tokens): the sample whose sandbox
    start or rollout failed with `why`; the learner skips it, the report counts it."""
    from c2jax.trajectory import Trajectory

    traj = Trajectory(segments=[], task_id=task.instance_id, group_id=task.instance_id, infra_failed=True,
                      sample_id=f"{task.instance_id}#{sample}", metadata={"stop_reason": "infra", "error": why})
    return Episode(traj, [], [{"type": "infra_error", "t": 0.0, "duration_s": 0.0, "error": why}], "infra")


async def arollout_many(harness: Harness, policy: Policy, tasks: Sequence[TaskRecord], pool: Any,
                        samples: int = 1, **kw: Any) -> list[Episode]:
    """Every task x `samples` concurrently (a group per task); the pool bounds running sandboxes."""
    return list(await asyncio.gather(*(arollout(harness, policy, t, pool=pool, sample=k, **kw)
                                       for t in tasks for k in range(samples))))


class HarnessBenchPolicy:
    """A `c2jax.bench` policy: runs the harness on the task, returns the diff (graded by the bench)."""

    name = "agent"

    def __init__(self, harness: Harness, policy: Policy) -> None:
        self.harness, self.policy = harness, policy

    def solve(self, task: TaskRecord, sample: int):
        from c2jax.envs.tasks import Attempt
        from c2jax.envs import start

        t0 = time.monotonic()
        with start(task.env_id, **dict(task.limits)) as sb:
            ep = self.harness.run(self.policy, sb, task.problem_statement, task_id=task.instance_id,
                                  sample_id=f"{task.instance_id}#{sample}")
        return Attempt(ep.diff or "", tokens=ep.trajectory.num_policy_tokens, wall_s=time.monotonic() - t0,
                       info={"stop_reason": ep.stop_reason, "tool_calls": ep.trajectory.effort.tool_calls})
