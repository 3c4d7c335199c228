"""Policies a benchmark run evaluates: `solve(task, sample) -> Attempt` (a diff plus effort).

Built in: `oracle` (the gold patch: must resolve every validated task) and `null` (no change:
must resolve none). The agent harness registers its own (`POLICIES.register("agent")`), e.g. a
model driving c2jax's tools in the task's sandbox, returning `Sandbox.diff()`.
"""
from __future__ import annotations

from typing import Protocol

from c2jax.envs.tasks import Attempt, TaskRecord
from c2jax.registry import Registry

POLICIES = Registry("bench_policies")


class Policy(Protocol):
    name: str

    def solve(self, task: TaskRecord, sample: int) -> Attempt: ...


@POLICIES.register("oracle")
class OraclePolicy:
    """Applies the gold patch."""

    name = "oracle"

    def solve(self, task: TaskRecord, sample: int) -> Attempt:
        return Attempt(task.patch, tokens=0)


@POLICIES.register("null")
class NullPolicy:
    """Changes nothing."""

    name = "null"

    def solve(self, task: TaskRecord, sample: int) -> Attempt:
        return Attempt("", tokens=0)


def make_policy(name: str) -> Policy:
    return POLICIES.get(name)()
