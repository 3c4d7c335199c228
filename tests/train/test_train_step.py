"""Train step, optimizers and schedules on a small pure-JAX routed model (tests/train_toy_model.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_toy_model as toy
from c2jax.train import optim
from c2jax.train.state import TrainState
from c2jax.train.step import make_eval_step, make_train_step

LOSS = {"xent": 1.0, "z_loss": 1e-4, "moe_seq_balance": 1e-3, "mtp_distill": 0.3}


def _state(opt="adamw", lr=3e-2, steps=50):
    params = toy.init(jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "wsd", "peak_lr": lr, "warmup_steps": 2}, steps)
    tx = optim.make_optimizer({"name": opt, "weight_decay": 0.01, "clip_norm": 1.0}, sched, params,
                              trainable=toy.trainable(params))
    return TrainState.create(params, tx), sched


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_loss_falls_and_router_bias_moves_only_by_the_aux_free_rule(opt):
    state, sched = _state(opt)
    step = jax.jit(make_train_step(toy.apply, LOSS, bias_update_rate=1e-2, schedule=sched))
    batch = toy.random_batch(0)
    losses = []
    for _ in range(40):
        prev_bias = state.params["moe_layers"]["moe"]["router"]["bias"]
        state, m = step(state, batch)
        losses.append(float(m["loss/xent"]))
        db = np.asarray(state.params["moe_layers"]["moe"]["router"]["bias"] - prev_bias)
        assert np.allclose(np.abs(db), 1e-2) or np.allclose(db[np.abs(db) > 0], np.sign(db[np.abs(db) > 0]) * 1e-2)
    assert losses[-1] < losses[0] - 0.5, losses
    assert int(state.step) == 40


def test_bias_update_direction_follows_load():
    state, _ = _state()
    outputs = toy.apply(state.params, toy.random_batch(1))
    counts = np.asarray(outputs["expert_counts"])[0]
    step = jax.jit(make_train_step(toy.apply, {"xent": 1.0}, bias_update_rate=0.1))
    new, _ = step(state, toy.random_batch(1))
    db = np.asarray(new.params["moe_layers"]["moe"]["router"]["bias"])[0]
    np.testing.assert_allclose(db, 0.1 * np.sign(counts.mean() - counts), atol=1e-7)


def test_router_bias_frozen_without_bias_rule_and_gets_no_optimizer_state():
    state, _ = _state()
    step = jax.jit(make_train_step(toy.apply, LOSS, bias_update_rate=0.0))
    for i in range(3):
        state, _ = step(state, toy.random_batch(i))
    assert float(jnp.abs(state.params["moe_layers"]["moe"]["router"]["bias"]).max()) == 0.0
    n_opt = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state))
    assert n_opt < 3 * sum(x.size for x in jax.tree_util.tree_leaves(state.params))


def test_gradient_accumulation_matches_full_batch():
    s1, _ = _state()
    s2, _ = _state()
    batch = toy.random_batch(2, B=4)
    a, m1 = jax.jit(make_train_step(toy.apply, {"xent": 1.0, "z_loss": 1e-3}))(s1, batch)
    b, m2 = jax.jit(make_train_step(toy.apply, {"xent": 1.0, "z_loss": 1e-3}, accum_steps=2))(s2, batch)
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m1["grad_norm"]), float(m2["grad_norm"]), rtol=1e-4)
    for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    assert float(m2["xent/tokens"]) == float(m1["xent/tokens"]) == 64


def test_eval_step_counts_masked_tokens():
    state, _ = _state()
    batch = dict(toy.random_batch(3))
    batch["loss_mask"] = batch["loss_mask"].at[:, :5].set(0)
    s, n = jax.jit(make_eval_step(toy.apply))(state.params, batch)
    assert float(n) == 4 * 11 and np.isfinite(float(s))


def test_schedules():
    wsd = optim.make_schedule({"name": "wsd", "peak_lr": 1.0, "warmup_steps": 10, "decay_frac": 0.2,
                               "min_lr_ratio": 0.1}, 100)
    assert float(wsd(0)) == pytest.approx(0.1)
    assert float(wsd(9)) == pytest.approx(1.0)
    assert float(wsd(50)) == pytest.approx(1.0)
    assert float(wsd(80)) == pytest.approx(1.0)
    assert float(wsd(90)) == pytest.approx(0.55)
    assert float(wsd(100)) == pytest.approx(0.1)
    cos = optim.make_schedule({"name": "cosine", "peak_lr": 2.0, "warmup_steps": 4, "min_lr_ratio": 0.1,
                               "init_lr_ratio": 0.0}, 104)
    assert float(cos(0)) == pytest.approx(0.5)
    assert float(cos(4)) == pytest.approx(2.0)
    assert float(cos(54)) == pytest.approx(1.1)
    assert float(cos(104)) == pytest.approx(0.2)
    with pytest.raises(KeyError, match="known"):
        optim.make_schedule({"name": "linear_warmup_typo", "peak_lr": 1.0}, 10)


def test_muon_dimension_numbers_follow_logical_axes_of_the_real_param_tree():
    from c2jax.model.config import preset
    from c2jax.model.params_spec import logical_axes, param_specs, trainable_mask, map_specs

    cfg = preset("tiny")
    specs = param_specs(cfg)
    params = map_specs(lambda s: jnp.full(s.shape, 0.01, jnp.float32), specs)
    axes = logical_axes(cfg)
    dims = optim.muon_dimension_numbers(params, axes)
    d = dims["moe_layers"]["attn"]["o_proj"]["kernel"]  # [layers, heads, v_head, embed]
    assert (d.reduction_axis, d.output_axis) == ((1, 2), 3)
    d = dims["moe_layers"]["moe"]["experts"]["gate_proj"]  # [layers, experts, embed, expert_mlp]
    assert (d.reduction_axis, d.output_axis) == (2, 3)
    d = dims["dense_layers"]["attn"]["q_b_proj"]["kernel"]  # [layers, q_lora, heads, qk_head]
    assert (d.reduction_axis, d.output_axis) == (1, (2, 3))
    assert dims["embed"]["embedding"] is None and dims["lm_head"]["kernel"] is None
    assert dims["final_norm"]["scale"] is None
    # A Muon update runs on the full tree (stacked 3-D/4-D matrices) and leaves the router bias alone.
    sched = optim.make_schedule({"name": "constant", "peak_lr": 1e-2}, 10)
    tx = optim.make_optimizer({"name": "muon"}, sched, params, trainable=trainable_mask(cfg), axes=axes)
    st = tx.init(params)
    grads = jax.tree_util.tree_map(lambda p: jnp.ones_like(p), params)
    upd, _ = jax.jit(tx.update)(grads, st, params)
    assert float(jnp.abs(upd["moe_layers"]["moe"]["router"]["bias"]).max()) == 0.0
    assert float(jnp.abs(upd["moe_layers"]["moe"]["experts"]["down_proj"]).max()) > 0.0


@pytest.mark.slow
def test_real_tiny_model_trains_with_mtp_distillation_and_balances_mtp_routers():
    """(The default suite trains the real model end to end in tests/test_train_pretrain.py.)"""
    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.model.params_spec import logical_axes, trainable_mask
    from c2jax.train.pretrain import model_apply_fn

    cfg = preset("tiny").replace(vocab_size=64, num_layers=2, max_position_embeddings=64)
    params = init(cfg, jax.random.PRNGKey(0))
    sched = optim.make_schedule({"name": "constant", "peak_lr": 3e-3}, 10)
    tx = optim.make_optimizer({"name": "adamw"}, sched, params, trainable=trainable_mask(cfg), axes=logical_axes(cfg))
    state = TrainState.create(params, tx)
    step = jax.jit(make_train_step(model_apply_fn(cfg), LOSS, bias_update_rate=1e-3))
    batch = toy.random_batch(7, B=2, S=32, vocab=64)
    first = None
    for _ in range(6):
        state, m = step(state, batch)
        first = first if first is not None else float(m["loss/xent"])
    assert float(m["loss/xent"]) < first - 0.3
    assert float(m["loss/mtp_distill"]) > 0
    bias = np.asarray(state.params["mtp"]["layer"]["moe"]["router"]["bias"])
    assert np.abs(bias).max() > 0  # the MTP routers are balanced too


def test_term_start_step_gates_a_loss_term():
    state, _ = _state()
    step = jax.jit(make_train_step(toy.apply, {"xent": 1.0, "mtp_distill": 1.0}, term_start_steps={"mtp_distill": 2}))
    b = toy.random_batch(5)
    totals = []
    for _ in range(3):
        state, m = step(state, b)
        totals.append((float(m["loss"]), float(m["loss/xent"]), float(m["loss/mtp_distill"])))
    assert totals[0][0] == totals[0][1] and totals[1][0] == totals[1][1]  # gated off at steps 0, 1
    assert abs(totals[2][0] - (totals[2][1] + totals[2][2])) < 1e-5 and totals[2][2] > 0
