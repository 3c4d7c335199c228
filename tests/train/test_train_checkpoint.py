"""Checkpointer: bit-exact round trip of the train state + loader state, keep-N, and fallback to the
previous checkpoint when the latest is truncated or corrupted."""
import os
import warnings

import jax
import numpy as np
import pytest

import train_toy_model as toy
from c2jax.train import optim
from c2jax.checkpoint import Checkpointer, CheckpointCorruptWarning
from c2jax.train.state import TrainState
from c2jax.train.step import make_train_step


def _run(n):
    params = toy.init(jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "constant", "peak_lr": 1e-2}, 10)
    tx = optim.make_optimizer({"name": "adamw"}, sched, params, trainable=toy.trainable(params))
    state = TrainState.create(params, tx)
    step = jax.jit(make_train_step(toy.apply, {"xent": 1.0}, bias_update_rate=1e-3))
    states = []
    for i in range(n):
        state, _ = step(state, toy.random_batch(i))
        states.append(state)
    return states


def _equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def test_roundtrip_is_bit_exact_and_keeps_n(tmp_path):
    states = _run(4)
    ck = Checkpointer(str(tmp_path / "ckpt"), keep=2)
    for i, s in enumerate(states):
        ck.save(i + 1, s.to_tree(), {"cursor": i * 10, "seed": 3}, {"stage": "cpt"})
    ck.close()
    ck = Checkpointer(str(tmp_path / "ckpt"), keep=2)
    assert ck.all_steps() == [3, 4]
    step, tree, loader, meta = ck.restore_latest(states[0].to_tree())
    assert step == 4 and loader == {"cursor": 30, "seed": 3} and meta == {"stage": "cpt"}
    assert _equal(tree, states[-1].to_tree())
    assert sorted(os.listdir(tmp_path / "ckpt" / "manifests")) == ["3.json", "4.json"]


def _largest_file(d):
    files = [os.path.join(p, f) for p, _, fs in os.walk(d) for f in fs]
    return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_dir_contents"])
def test_corrupt_latest_falls_back_to_previous_with_warning(tmp_path, damage):
    states = _run(2)
    root = tmp_path / "ckpt"
    ck = Checkpointer(str(root), keep=3)
    for i, s in enumerate(states):
        ck.save(i + 1, s.to_tree(), {"cursor": i})
    ck.close()
    victim = _largest_file(root / "2" / "state")
    if damage == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    elif damage == "flip":
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
    else:
        for p, _, fs in os.walk(root / "2" / "state"):
            for f in fs:
                os.remove(os.path.join(p, f))
    ck = Checkpointer(str(root), keep=3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        step, tree, loader, _ = ck.restore_latest(states[0].to_tree())
    assert step == 1 and loader == {"cursor": 0}
    assert _equal(tree, states[0].to_tree())
    assert any(issubclass(x.category, CheckpointCorruptWarning) for x in w)
    # Nothing is deleted: the bad checkpoint is kept aside, and the step can be saved again.
    assert os.listdir(str(root) + ".corrupt")
    ck.save(2, states[1].to_tree(), {"cursor": 1})
    ck.close()
    assert Checkpointer(str(root)).restore_latest(states[0].to_tree())[0] == 2


def test_no_checkpoint_returns_none(tmp_path):
    assert Checkpointer(str(tmp_path / "empty")).restore_latest({"a": np.zeros(3)}) is None
