"""A complete toy training run through `train_loop` (used by the kill -9 resume test as a real
subprocess): python tests/train_toy_run.py OUT_DIR STEPS [SLEEP_PER_STEP]."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import train_toy_model as toy  # noqa: E402
from c2jax.train import optim  # noqa: E402
from c2jax.train.loop import train_loop  # noqa: E402
from c2jax.train.state import TrainState  # noqa: E402
from c2jax.train.step import make_eval_step, make_train_step  # noqa: E402


class ToyLoader:
    def __init__(self, seed=0, sleep=0.0):
        self.step, self.seed, self.sleep = 0, seed, sleep

    def next_batch(self):
        time.sleep(self.sleep)
        b = toy.random_batch(self.seed * 100003 + self.step)
        self.step += 1
        return b

    def state(self):
        return {"step": np.asarray(self.step, np.int64)}

    def restore(self, st):
        self.step = int(np.asarray(st["step"]))


def main(out, steps, sleep=0.0):
    params = toy.init(jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "wsd", "peak_lr": 1e-2, "warmup_steps": 3}, steps)
    tx = optim.make_optimizer({"name": "adamw"}, sched, params, trainable=toy.trainable(params))
    state = TrainState.create(params, tx)
    step = jax.jit(make_train_step(toy.apply, {"xent": 1.0, "mtp_distill": 0.3}, bias_update_rate=1e-3,
                                   schedule=sched))
    ev = jax.jit(make_eval_step(toy.apply))
    held = toy.random_batch(999)

    def evaluate(p):
        s, n = ev(p, held)
        return {"held_out_loss": float(s / n)}

    _, summary = train_loop(name="toy", out_dir=out, state=state, step_fn=step, loader=ToyLoader(sleep=sleep),
                            evaluate=evaluate, total_steps=steps, tokens_per_step=64, log_every=1,
                            eval_every=5, ckpt_every=3, keep=2, progress=False)
    print("SUMMARY", summary)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
