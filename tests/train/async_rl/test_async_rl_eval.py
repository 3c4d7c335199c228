"""Online evaluation on its own service: every ``eval_every`` steps the driver pins the current
weights and submits them to the evaluator; training never waits for it (the evaluation of step 2 is
held until the trainer reaches the last step, so a blocking evaluation would deadlock the run), and
each result names the step whose weights it scored."""
from __future__ import annotations

import threading

from test_async_rl_restart import FakeCkpt, FakePublisher, FakeState, FakeTrainer, FakeWorker, fake_tasks

from c2jax.train.async_rl.runner import AsyncRL
from c2jax.train.async_rl.services import LocalBackend
from c2jax.train.async_rl.workers import Evaluator
from c2jax.train.rl_step import RLContext
from c2jax.train.rl_tasks import TaskStream

STEPS = 6


def test_pinned_checkpoints_are_evaluated_without_blocking_training(tmp_path):
    rl = {"tasks_per_step": 2, "group_size": 2, "max_staleness": 1, "max_in_flight": 4, "ckpt_every": 1}
    ctx = RLContext(rl=rl, learner=None, engine=None, policy=None, harness=None, seed=0)
    last_step_reached = threading.Event()
    seen = []

    def eval_fn(params, step):
        if step == 2:
            assert last_step_reached.wait(timeout=300), "training waited for the evaluation"
        params = str(params)  # the pinned host copy (a 0-d array of the fake trainer's hash)
        seen.append((step, params))
        return {"eval/pass_at_1": float(int(params[:4], 16) % 7) / 7}

    pub, be, ckpt = FakePublisher(0), LocalBackend(), FakeCkpt()
    run = AsyncRL(ctx, rollout=be.spawn("rollout", lambda: FakeWorker(pub, 0), workers=2),
                  trainer=be.spawn("trainer", FakeTrainer), publisher=pub,
                  stream=TaskStream(fake_tasks(40), seed=0, upsample_after_step=None), steps=STEPS,
                  out_dir=str(tmp_path), ckpt=ckpt, evaluator=be.spawn("eval", lambda: Evaluator(eval_fn)),
                  eval_every=2, on_step=lambda s, m: s == STEPS and last_step_reached.set())
    try:
        run.run(FakeState("init"))
    finally:
        for svc in (run.rollout, run.trainer, run.evaluator):
            svc.shutdown()
    assert sorted(s for s, _ in seen) == [2, 4, 6]
    params_at = {step: params for step, params, _ in ckpt.saved}
    for step, params in seen:
        assert params == params_at[step]  # the pinned weights of that step, not later ones
    got = sorted(run.summary()["evals"], key=lambda r: r["step"])
    assert [r["step"] for r in got] == [2, 4, 6] and all("eval/pass_at_1" in r and "error" not in r for r in got)
