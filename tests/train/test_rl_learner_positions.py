"""The RL learner computes its LM head only at the positions the loss reads (`LOGITS_AT`), and every
figure that depends on it is the same as with the full logits: the logprobs at the loss positions,
the loss and its metrics, the gradient, the updated parameters.

A positive control checks the gathered path is the one under test: at a position outside the loss
mask (and outside the filler) its logprob is 0, where the full-logits path gives the real value.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from c2jax.train import rl_learner
from c2jax.train.rl_learner import logprob_positions


def test_logprob_positions_cover_the_mask_in_few_shapes():
    rng = np.random.default_rng(0)
    mask = (rng.random((8, 64)) < 0.3).astype(np.float32)
    idx = logprob_positions(mask, buckets=8)
    assert idx is not None and idx.dtype == np.int32
    assert idx.size % (8 * 64 // 8) == 0 and idx.size >= mask.sum()
    assert np.all(np.diff(idx) > 0)  # sorted, distinct
    assert set(np.flatnonzero(mask.reshape(-1))) <= set(idx.tolist())
    # a mask covering more than 7/8 of the positions: nothing to save
    full = np.ones((4, 16), np.float32)
    full[0, 0] = 0
    assert logprob_positions(full, buckets=8) is None
    # an empty mask still gives one bucket (a valid gather)
    assert logprob_positions(np.zeros((4, 16)), buckets=8).size == 8


@functools.lru_cache(maxsize=None)
def _setup():
    from c2jax.batching import pad_batch
    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage
    from c2jax.trajectory import Segment, Trajectory

    cfg = preset("tiny").replace(vocab_size=512, max_position_embeddings=256, mtp_depth=0,
                                 **{"moe.impl": "dropless"})
    params = init(cfg, jax.random.PRNGKey(0))
    rl = resolve_rl_config({"group_size": 4, "rewards": {"task": {"weight": 1.0}}})
    rl.update(resolve_stage({"steps": 1, "tasks_per_step": 2, "max_in_flight": 4, "max_len": 128,
                             "learning_rate": 1e-3}))
    rng = np.random.default_rng(1)
    nl, k, e = cfg.n_moe_layers, cfg.moe.top_k, cfg.moe.n_routed_experts
    trajs = []
    for i in range(8):
        p, c = int(rng.integers(20, 50)), int(rng.integers(20, 60))
        routes = np.stack([rng.permutation(e)[:k] for _ in range((p + c - 1) * nl)]).reshape(p + c - 1, nl, k)
        seg = Segment(prompt_ids=rng.integers(1, 512, p).tolist(), completion_ids=rng.integers(1, 512, c).tolist(),
                      loss_mask=(rng.random(c) < 0.6).astype(int).tolist(), behaviour_logprobs=[-6.0] * c,
                      policy_versions=[0] * c, raw_logprobs=[-6.0] * c, routes=routes.astype(np.int32))
        trajs.append(Trajectory(segments=[seg], task_id=f"t{i // 4}", group_id=f"g{i // 4}",
                                reward_terms={"task": float(i % 3 == 0)}))
    batch = pad_batch(trajs, 128, reward_names=("task",))
    return cfg, params, rl, batch


def _run(monkeypatch, where: str):
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.state import TrainState

    monkeypatch.setattr(rl_learner, "LOGITS_AT", where)
    cfg, params, rl, batch = _setup()
    learner = make_learner(cfg, rl, params)
    lp, _ = learner.logp(params, batch, replay=True)
    ref = np.asarray(lp) - 0.01  # a reference policy's logprobs, for the KL metrics
    grads, gm = learner.grads(params, batch, ref)
    state, um, (lp_seen, _) = learner.update_with_logp(TrainState.create(params, learner.tx), batch, ref)
    return dict(lp=np.asarray(lp), grads=grads, gm=jax.device_get(gm), params=state.params,
                um=jax.device_get(um), lp_seen=np.asarray(lp_seen))


def test_gathered_logits_give_the_full_logits_figures(monkeypatch):
    cfg, params, rl, batch = _setup()
    assert logprob_positions(batch["loss_mask"]) is not None  # the batch exercises the gather
    new, old = _run(monkeypatch, "loss_positions"), _run(monkeypatch, "all")
    m = batch["loss_mask"] > 0
    np.testing.assert_allclose(new["lp"][m], old["lp"][m], rtol=0, atol=2e-6)
    np.testing.assert_allclose(new["lp_seen"][m], old["lp_seen"][m], rtol=0, atol=2e-6)
    for key in ("loss", "loss/pg", "kl/k1", "kl/k3", "mismatch/abs_logp_diff", "grad_norm"):
        assert new["um"][key] == pytest.approx(old["um"][key], rel=1e-5, abs=1e-7), key
    for a, b in zip(jax.tree_util.tree_leaves(new["grads"]), jax.tree_util.tree_leaves(old["grads"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)  # summation order
    # one Adam step moves each parameter by up to the learning rate; the two paths' steps agree to
    # within 0.1% of it (Adam's first step divides each gradient by its own size)
    step_tol = 1e-3 * float(rl["learning_rate"])
    for a, b in zip(jax.tree_util.tree_leaves(new["params"]), jax.tree_util.tree_leaves(old["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=step_tol)
    # positive control: outside the gathered set the new path leaves 0, the full path a real logprob
    idx = logprob_positions(batch["loss_mask"])
    outside = np.setdiff1d(np.flatnonzero(batch["segment_ids"].reshape(-1) > 0), idx)
    assert outside.size > 0
    assert np.all(new["lp"].reshape(-1)[outside] == 0.0)
    assert np.all(old["lp"].reshape(-1)[outside] < 0.0)
