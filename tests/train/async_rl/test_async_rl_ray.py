"""The Ray backend of the asynchronous services: the same driver (`AsyncRL`) over a rollout actor on a
local Ray cluster bound to 127.0.0.1 trains exactly the samples the embedded backend trains; a
SIGKILLed rollout actor is restarted by Ray and its lost groups are rolled out again (ledger
complete, nothing trained twice). An unreachable cluster address is a clear error before any compute
(that one runs without Ray)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from c2jax.train.async_rl.services import make_backend


def test_unreachable_ray_cluster_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"Ray cluster at 127\.0\.0\.1:1 is unreachable"):
        make_backend("ray", address="127.0.0.1:1")
    with pytest.raises(ValueError, match="host:port"):
        make_backend("ray", address="nowhere")
    with pytest.raises(ValueError, match="must be one of"):
        make_backend("kubernetes")


class VersionedWorker:
    """Samples depend on (task, k) only; versions = the group's batch (= the live version at s=0)."""

    def run_group(self, task, batch, on_state=None):
        import hashlib

        from c2jax.train.rl_rollouts import Sample
        from c2jax.trajectory import Segment, Trajectory

        out = []
        for k in range(2):
            time.sleep(0.05)
            h = int(hashlib.sha256(f"{task.instance_id}#{k}".encode()).hexdigest()[:6], 16)
            seg = Segment(prompt_ids=[1, 2], completion_ids=[h % 97, 7], loss_mask=[1, 1],
                          behaviour_logprobs=[-0.5, -1.0], policy_versions=[batch, batch])
            r = float(h % 2)
            traj = Trajectory(segments=[seg], task_id=task.instance_id, group_id=task.instance_id,
                              reward_terms={"reward": r, "task": r, "resolved": r}, sample_id=f"{task.instance_id}#{k}")
            out.append(Sample(task, k, traj, None, "stop", 0.0, 0.0, []))
        return out


def _drive(backend, steps=6, kill_after_step=None):
    from test_async_rl_restart import B, FakeCkpt, FakePublisher, FakeState, FakeTrainer, fake_tasks

    from c2jax.train.async_rl.runner import AsyncRL
    from c2jax.train.async_rl.services import LocalBackend
    from c2jax.train.rl_step import RLContext
    from c2jax.train.rl_tasks import TaskStream

    rl = {"tasks_per_step": B, "group_size": 2, "max_staleness": 0, "max_in_flight": 4, "ckpt_every": 1}
    ctx = RLContext(rl=rl, learner=None, engine=None, policy=None, harness=None, seed=0)
    pub = FakePublisher(0)
    rollout = backend.spawn("rollout", VersionedWorker, workers=2)
    trainer = LocalBackend().spawn("trainer", FakeTrainer)
    import tempfile

    killed = []

    def on_step(step, metrics):
        if kill_after_step is not None and step == kill_after_step and not killed:
            pid = rollout.pid()

            def kill():
                time.sleep(0.03)  # mid-group: the actor is inside run_group
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            threading.Thread(target=kill, daemon=True).start()

    run = AsyncRL(ctx, rollout=rollout, trainer=trainer, publisher=pub,
                  stream=TaskStream(fake_tasks(40), seed=0, upsample_after_step=None), steps=steps,
                  out_dir=tempfile.mkdtemp(prefix="c2jax_async_ray_"), ckpt=FakeCkpt(), on_step=on_step,
                  health_every_s=0.5)
    try:
        state, _ = run.run(FakeState("init"))
    finally:
        rollout.shutdown()
        trainer.shutdown()
    return run, state, killed


@pytest.mark.ray
def test_ray_backend_same_samples_and_survives_a_killed_rollout_actor():
    ray = pytest.importorskip("ray")
    from _paths import TESTS_DIR
    sys.path.insert(0, TESTS_DIR)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from c2jax.train.async_rl.services import LocalBackend

    local_run, local_state, _ = _drive(LocalBackend())
    backend = make_backend("ray")
    try:
        ray_run, ray_state, _ = _drive(backend)
        assert ray_state.params == local_state.params  # same code path, same trained samples
        killed_run, killed_state, killed = _drive(backend, kill_after_step=2)
    finally:
        backend.shutdown()
    assert killed, "the rollout actor was not killed"
    assert killed_state.params == local_state.params  # lost groups rolled out again: nothing lost or repeated
    led = killed_run.ledger.summary()
    assert led["trained"] == local_run.ledger.summary()["trained"] and led["dropped"] == {}
    assert led["retries"] >= 1
    killed_run.ledger.check_complete()
