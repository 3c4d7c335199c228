"""Fault injection on the asynchronous RL services (embedded backend, real harness, engine, bwrap
sandboxes, checkpointer): a rollout worker, the engine, a sandbox and the trainer process are killed
at seeded random moments, and the run still ends with every sample trained exactly once or dropped
with a named reason.

One run = a process (tests/train/async_rl/fault_run.py) in which a rollout worker dies mid-group, the
engine's thread dies while it serves and a running sandbox's bwrap is SIGKILLed; that process is
SIGKILLed right after a random step checkpoint (+ a random delay: groups are ready or rolling out
then); the run is resumed from the checkpoint (parameters, task stream, reconciler, ledger, group
checkpoints). `audit_fault_run` then checks, against an independent log the trainer wrote and every
sample id any process ever queued: updates 1..N once each, no sample or group trained twice,
nothing lost, the ledger agreeing with the trainer. Each kill must show up where it is handled: the
driver's health checks replaced the engine and restarted the rollout service (counters persisted
after every update), the sandbox's sample is dropped 'masked:infra:sandbox'.

Positive control: the same killed run resumed without its recovery (parameters and task stream only,
no ledger / group store) fails the audit.

Default: 6 updates without gradient steps (the trainer only logs; the services are what is tested),
one fault of each kind. Slow: 30 updates of the real learner, faults in both processes; and with
``max_staleness = 0``, worker + engine + trainer kills (a lost group is rolled out again with the
same seeds on the same policy version), the resumed run's parameters equal the uninterrupted run's.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys

import pytest

from _agent_common import needs_bwrap
from _async_rl_common import param_hash, tiny_model
from _async_rl_faults import AuditError, audit_fault_run, fault_run
from _rl_smoke_common import _env, kill9_after_first_step_checkpoint

pytestmark = [needs_bwrap, pytest.mark.timeout(3600),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]  # killed engine threads

FAULT_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_run.py")


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in open(path) if x.strip()] if os.path.exists(path) else []


def _kill_first_process(out, env_id, *, steps: int, seed: int, faults: tuple, kill_after: int, delay_s: float,
                        learn: bool, staleness: int = 1, kinds: str = "worker,engine,sandbox") -> dict:
    """Run fault_run.py until its step-`kill_after` checkpoint (+ `delay_s`), SIGKILL it; what it left."""
    cmd = [sys.executable, FAULT_RUN, str(out), env_id, "--steps", str(steps), "--seed", str(seed),
           "--faults", str(faults[0]), str(faults[1]), "--staleness", str(staleness), "--kinds", kinds]
    cmd += [] if learn else ["--no-learn"]
    left = kill9_after_first_step_checkpoint(cmd, out / "checkpoints", min_step=kill_after, delay_s=delay_s,
                                             env=_env())
    assert left and max(int(s) for s in left) < steps, f"not killed before the end: checkpoints {left}"
    (run,) = _lines(out / "runs.jsonl")
    faults_seen = [f for f in _lines(out / "faults.jsonl") if f["run"] == run["run"]]
    health = [h for h in _lines(out / "health.jsonl") if h["run"] == run["run"]]
    return {"run": run, "faults": faults_seen, "restarts": health[-1]["restarts"] if health else {},
            "checkpoint": max(int(s) for s in left)}


def _kinds(faults: list[dict]) -> dict:
    out: dict = {}
    for f in faults:
        out[f["kind"]] = out.get(f["kind"], 0) + 1
    return out


def _check_handled(kinds: dict, restarts: dict) -> None:
    """Every injected engine / worker kill was seen and counted by a health check."""
    assert restarts.get("engine", 0) >= kinds.get("engine", 0) >= 1, (kinds, restarts)
    assert restarts.get("rollout", 0) >= kinds.get("worker", 0) >= 1, (kinds, restarts)


def test_killed_worker_engine_sandbox_and_trainer_lose_and_repeat_nothing(repo_env, tmp_path):
    rng = random.Random(17)
    steps, out = 6, tmp_path / "run"
    # Killed after checkpoint 4 of 6: batch 5's groups are only admitted once version 4 is live, so
    # the last update cannot slip in before the kill; faults after updates 0 (worker, engine) and 1
    # (sandbox: its group is trained by update 3, before the checkpoint the run resumes from).
    first = _kill_first_process(out, repo_env[1], steps=steps, seed=0, faults=(0, 1), kill_after=steps - 2,
                                delay_s=rng.uniform(0.0, 0.3), learn=False)
    kinds = _kinds(first["faults"])
    assert set(kinds) == {"worker", "engine", "sandbox"}, first["faults"]
    _check_handled(kinds, first["restarts"])
    control = tmp_path / "control"
    shutil.copytree(out, control)

    summary = fault_run(str(out), repo_env[1], steps=steps, seed=0, learn=False)  # the trainer restarts
    assert summary["start"] == first["checkpoint"] and summary["final_version"] == steps
    assert summary["restored"].get("ready_reloaded", 0) + summary["restored"].get("rolled_out_again", 0) >= 1
    audit = audit_fault_run(str(out), steps)
    assert audit["runs"] == 2 and audit["updates"] == steps
    assert audit["trained"] + sum(audit["dropped"].values()) == audit["queued_ever"]
    assert audit["dropped"].get("masked:infra:sandbox", 0) >= 1, audit  # the killed sandbox's sample
    assert set(audit["dropped"]) <= {"masked:infra:sandbox", "masked:infra:grader", "masked:too_long"}, audit

    # Positive control: resumed without the ledger / group-store recovery, the audit catches the loss
    # (as samples no update trained, or, when the kill lands mid-rollout, as samples left unfinished).
    fault_run(str(control), repo_env[1], steps=steps, seed=0, learn=False, recovery=False)
    with pytest.raises(AuditError, match=r"\(lost|final ledger incomplete"):
        audit_fault_run(str(control), steps)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_thirty_updates_with_random_faults_in_both_processes(repo_env, tmp_path, seed):
    rng = random.Random(seed)
    steps, out = 30, tmp_path / "run"
    kill_after = rng.randrange(14, 21)
    first = _kill_first_process(out, repo_env[1], steps=steps, seed=seed, faults=(0, kill_after - 4),
                                kill_after=kill_after, delay_s=rng.uniform(0.0, 2.0), learn=True)
    _check_handled(_kinds(first["faults"]), first["restarts"])
    start = first["checkpoint"]
    summary = fault_run(str(out), repo_env[1], steps=steps, seed=seed, faults=(start + 1, steps - 4))
    assert summary["start"] == start and summary["final_version"] == steps
    second = [f for f in _lines(out / "faults.jsonl") if f["run"] != first["run"]["run"]]
    _check_handled(_kinds(second), summary["restarts"])
    kinds = _kinds(first["faults"] + second)
    assert all(kinds.get(k, 0) >= 2 for k in ("worker", "engine", "sandbox")), kinds
    audit = audit_fault_run(str(out), steps)
    assert audit["runs"] == 2 and audit["updates"] == steps
    assert audit["dropped"].get("masked:infra:sandbox", 0) >= 1, audit
    assert max(int(k) for k in summary["staleness_hist"]) <= 1


@pytest.mark.slow
def test_max_staleness_0_run_with_worker_engine_and_trainer_kills_equals_the_uninterrupted_run(repo_env, tmp_path):
    steps, seed = 8, 2
    ref = fault_run(str(tmp_path / "ref"), repo_env[1], steps=steps, seed=seed, staleness=0)  # no faults
    first = _kill_first_process(tmp_path / "run", repo_env[1], steps=steps, seed=seed, faults=(0, 3), kill_after=5,
                                delay_s=0.5, learn=True, staleness=0, kinds="worker,engine")
    kinds = _kinds(first["faults"])
    assert kinds == {"worker": 1, "engine": 1}, first["faults"]
    _check_handled(kinds, first["restarts"])
    summary = fault_run(str(tmp_path / "run"), repo_env[1], steps=steps, seed=seed, staleness=0)
    assert summary["start"] == first["checkpoint"] < steps
    assert ref["param_hash"] != param_hash(tiny_model()[1])  # control: the updates moved the weights
    assert summary["param_hash"] == ref["param_hash"]
    audit = audit_fault_run(str(tmp_path / "run"), steps)
    assert audit["trained"] + sum(audit["dropped"].values()) == steps * 2 * 2
