"""The asynchronous driver on the embedded backend, through the real harness, engine and sandbox:
with ``max_staleness = 0`` its parameters after 2 steps are bit-identical to the synchronous stage's
(`rl_step`), and the ledger shows every sample trained exactly once."""
from __future__ import annotations

import numpy as np
import pytest

from _agent_common import needs_bwrap  # noqa: F401
from _async_rl_common import build, make_async, param_hash, rl_section, run_sync, tasks

# Two real 2-step runs, learner compile included: ~25 s on an idle 2-core machine (default run); under
# heavy contention the compile alone can take minutes, hence the longer timeout.
pytestmark = [needs_bwrap, pytest.mark.timeout(1800)]

STEPS = 2


def test_max_staleness_0_is_bit_identical_to_the_synchronous_stage(repo_env, tmp_path):
    rl = rl_section(max_staleness=0, max_len=512)
    task_list = tasks(repo_env[1], 4)
    sync = build(rl, task_list)
    try:
        state_sync, rows_sync = run_sync(sync, STEPS)
    finally:
        sync.close()
    parts = build(rl, task_list)
    try:
        run = make_async(parts, tmp_path / "async", STEPS)
        state_async, version = run.run(parts.state)
        run.rollout.shutdown()
        run.trainer.shutdown()
    finally:
        parts.close()
    assert version == STEPS
    # Control: training moved the parameters (a no-op would also be "identical").
    assert param_hash(state_sync.params) != param_hash(parts.params)
    assert param_hash(state_async.params) == param_hash(state_sync.params)
    for a, b in zip(rows_sync, run.step_rows):
        assert a["loss"] == b["loss"] and a["rollouts/total"] == b["rollouts/total"]
        assert np.isclose(a["reward/total"], b["reward/total"])
    summary = run.summary()
    n = STEPS * int(rl["tasks_per_step"]) * int(rl["group_size"])
    led = summary["ledger"]
    assert led["samples"] == n and led["open"] == {}
    assert led["trained"] + sum(led["dropped"].values()) == n
    assert set(led["dropped"]) <= {"masked:infra:sandbox", "masked:infra:grader", "masked:too_long"}
    run.ledger.check_complete()
    assert set(summary["staleness_hist"]) == {0}  # on-policy: every token sampled by the trained version
    assert (tmp_path / "async" / "ledger.jsonl").exists()
