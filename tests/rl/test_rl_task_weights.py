"""`rl.task_weights`: each task's group advantages times its weight, the weights from the kinds of fix.

The exact check is the policy-gradient identity of `test_rl_loss.py`: each policy token's gradient is
-A_i / constant, so with a group weight it must be -w_g * A_i / constant, token for token; a batch
without weights is the batch it always was (no `group_weight` key). The weights: every kind's total
weight equal with power 1, all 1 with power 0, mean 1 over the stream; a bad `by` fails validation
naming the choices."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.loss import make_rl_loss
from c2jax.train.rl_tasks import kind_weights
from tests.rl.test_rl_loss import batch_of, trajs_two_groups


def _grad(b):
    loss_fn = make_rl_loss(dict(aggregation=dict(name="constant", constant=100.0)))
    logp = jnp.asarray(b["behaviour_logp"])
    (_, m), g = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(logp, b)
    return np.asarray(g), m


def test_group_weight_scales_each_groups_policy_gradient_exactly():
    plain = batch_of(trajs_two_groups())
    assert "group_weight" not in plain  # no weights set: the batch (and its jit signature) as before
    trajs = trajs_two_groups()
    for t in trajs:
        t.metadata["group_weight"] = {"a": 3.0, "b": 0.5}[t.group_id]
    b = batch_of(trajs)
    np.testing.assert_array_equal(b["group_weight"][:5], [3.0, 3.0, 3.0, 0.5, 0.5])
    g0, _ = _grad(plain)
    g, m = _grad(b)
    ti, mask = b["traj_index"], b["loss_mask"]
    adv = np.array([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5])
    w = np.array([3.0, 3.0, 3.0, 0.5, 0.5])
    for i in range(5):
        sel = (ti == i) & (mask > 0)
        np.testing.assert_allclose(g[sel], -w[i] * adv[i] / 100.0, rtol=1e-5)
        np.testing.assert_allclose(g[sel], w[i] * g0[sel], rtol=1e-6)
    assert np.all(g[mask == 0] == 0)
    assert float(m["adv/group_weight_mean"]) == pytest.approx((3 * 3.0 + 2 * 0.5) / 5)


def _task(i: int, kind: str):
    return types.SimpleNamespace(instance_id=f"t{i}", kind=kind)


def test_kind_weights_give_every_kind_the_same_total_and_mean_one():
    tasks = [_task(i, k) for i, k in enumerate(["a"] * 12 + ["b"] * 3 + ["c"] * 1)]
    w, by = kind_weights(tasks, 1.0, kind_of=lambda t: t.kind)
    assert sum(w.values()) == pytest.approx(len(tasks))
    totals = {k: sum(w[t.instance_id] for t in tasks if t.kind == k) for k in "abc"}
    assert totals["a"] == pytest.approx(totals["b"]) == pytest.approx(totals["c"]) == pytest.approx(16 / 3)
    assert by["c"] == {"tasks": 1, "weight": pytest.approx(16 / 3)}
    flat, _ = kind_weights(tasks, 0.0, kind_of=lambda t: t.kind)
    assert set(flat.values()) == {1.0}
    half, _ = kind_weights(tasks, 0.5, kind_of=lambda t: t.kind)
    assert half["t0"] < half["t12"] < half["t15"] and sum(half.values()) == pytest.approx(len(tasks))


def test_bad_task_weights_fail_validation_naming_the_choices():
    from _rl_smoke_common import load_rl_quickstart
    from c2jax.config import ConfigError, validate

    cfg = load_rl_quickstart().get_config("kind_weighted")
    validate(cfg)  # the preset itself is fine
    cfg.rl.task_weights.by = "kinds"
    cfg.rl.task_weights.power = -1.0
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert "task_weights.by" in str(e.value) and "'kind'" in str(e.value) and "task_weights.power" in str(e.value)
