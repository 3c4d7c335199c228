"""Graded rollouts on a task record: reward terms land in the trajectory, a group per task, the pool
bounds the sandboxes; the bench adapter returns the diff."""
from __future__ import annotations

import asyncio
import json

from _agent_common import FIX_PATCH, chat_format, make_task, needs_bwrap  # noqa: F401
from c2jax.agent.harness import Harness
from c2jax.agent.policies import OraclePolicy, ScriptedPolicy
from c2jax.agent.rollout import HarnessBenchPolicy, arollout_many

pytestmark = needs_bwrap

def test_graded_rollouts_fill_reward_terms(repo_env):
    from c2jax.envs.pool import SandboxPool

    fmt = chat_format()
    task = make_task(repo_env[1])
    h = Harness(fmt)
    with SandboxPool(max_concurrency=2) as pool:
        good = asyncio.run(arollout_many(h, OraclePolicy(fmt, FIX_PATCH), [task], pool, samples=2))
        null = asyncio.run(arollout_many(h, ScriptedPolicy(fmt, [], final="Nothing to do."), [task], pool))
    for ep in good:
        t = ep.trajectory
        assert t.reward_terms["reward"] == 1.0 and t.reward_terms["resolved"] == 1.0 and not t.infra_failed
        assert t.group_id == "calc-add-sign" and ep.events[-1]["type"] == "grade"
    assert [e.trajectory.sample_id for e in good] == ["calc-add-sign#0", "calc-add-sign#1"]
    (ep,) = null
    assert ep.trajectory.reward_terms["reward"] == 0.0 and not ep.trajectory.infra_failed
    assert json.loads(ep.trajectory.to_json())["reward_terms"]["resolved"] == 0.0


def test_bench_adapter_returns_the_diff(repo_env):
    from c2jax.bench.run import run_policy

    fmt = chat_format()
    task = make_task(repo_env[1])
    rows = run_policy([task], HarnessBenchPolicy(Harness(fmt), OraclePolicy(fmt, FIX_PATCH)), k=1, workers=1)
    s = rows[0]["samples"][0]
    assert s["resolved"] and s["reward"] == 1.0 and s["tokens"] > 0
