"""The controlled RL bandits behind several claims (c2jax.workflow.bandits): their closed forms
against sampling, their per-token logprobs against the hand-written trajectory probability, the
batch layout the real loss receives, bad input, and the 1/|o| length bias as a positive control
next to the unbiased constant normaliser (seconds on CPU)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.workflow.bandits import EffortEnv, LengthEnv, rl_batch, train


def test_length_env_closed_forms_match_sampling():
    env = LengthEnv(groups=500, group_size=40, max_len=16, mean_len0=12.0, learn_answer=True, p_right=0.3)
    params = env.init()
    d = jax.jit(env.sample)(params, jax.random.PRNGKey(0))
    length, right, trunc = (np.asarray(x) for x in (env.lengths(d), d["right"], d["truncated"]))
    want = env.expected(params)
    assert right.mean() == pytest.approx(want["p_right"], abs=0.01)
    assert length[right].mean() == pytest.approx(want["len_right"], rel=0.02)
    assert length[~right].mean() == pytest.approx(want["len_wrong"], rel=0.02)
    assert trunc.mean() == pytest.approx((11 / 12) ** 15, abs=0.01)  # no stop in 15 body tokens
    task = np.asarray(env.fields(d)["reward_terms"]["task"])
    assert task.mean() == pytest.approx(want["pass_rate"], abs=0.01) and not task[trunc].any()


def test_length_env_token_logprobs_sum_to_the_trajectory_probability():
    env = LengthEnv(groups=4, group_size=8, max_len=16, learn_answer=True, p_right=0.3)
    params = {"ans": jnp.float32(-0.4), "stop": jnp.asarray([-1.0, -2.5], jnp.float32)}
    d = jax.jit(env.sample)(params, jax.random.PRNGKey(3))
    lp = np.asarray(jax.jit(env.logp)(params, d), np.float64)
    mask = np.asarray(env.mask(d))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for i in range(env.n):
        a = bool(d["right"][i])
        s = sig(float(params["stop"][int(a)]))
        pa = sig(-0.4) if a else 1 - sig(-0.4)
        body, trunc = int(d["body"][i]), bool(d["truncated"][i])
        want = math.log(pa) + body * math.log(1 - s) + (0.0 if trunc else math.log(s))
        assert lp[i].sum() == pytest.approx(want, abs=1e-4)
        assert mask[i].sum() == 1 + body + (not trunc) and (lp[i][mask[i] == 0] == 0).all()
    batch = rl_batch(env, d, jnp.asarray(lp, jnp.float32))  # pad_batch's layout, one trajectory per row
    ti = np.asarray(batch["traj_index"])
    assert ((ti >= 0) == (mask > 0)).all() and (ti[mask > 0] == np.nonzero(mask)[0]).all()
    assert np.asarray(batch["group_index"]).tolist() == [i // 8 for i in range(32)]


def test_effort_env_bookkeeping():
    env = EffortEnv(call0=1.0, par0=0.3)
    d = jax.jit(env.sample)(env.init(), jax.random.PRNGKey(1))
    calls, par, capped, ok = (np.asarray(d[k]) for k in ("calls", "par", "capped", "success"))
    turns = np.asarray(env.turns(d))
    assert (turns == calls - par.sum(-1) + 1).all() and (par.sum(-1) <= np.maximum(calls - 1, 0)).all()
    need = np.asarray(env.need)[np.asarray(d["diff"])]
    assert not ok[calls < need].any() and not ok[capped].any()
    serial_enough = (calls - par.sum(-1) >= need) & ~capped  # serial calls are always useful
    assert ok[serial_enough].all()
    lp = np.asarray(jax.jit(env.logp)(env.init(), d), np.float64)  # call0 = 1, par0 = 0.3
    ls = lambda x: -math.log1p(math.exp(-x))  # noqa: E731  log sigmoid
    for i in range(0, env.n, 17):
        c, p = int(calls[i]), int(par[i].sum())
        want = c * ls(1.0) + p * ls(0.3) + (max(c - 1, 0) - p) * ls(-0.3) + (0.0 if capped[i] else ls(-1.0))
        assert lp[i].sum() == pytest.approx(want, abs=1e-4)


def test_train_rejects_bad_input_before_compute():
    env = LengthEnv(groups=2, group_size=4)
    with pytest.raises(ValueError, match="steps"):
        train(env, {"rewards": {"task": {"weight": 1.0}}}, steps=0, lr=1.0, seed=0)
    with pytest.raises(ValueError, match="lr"):
        train(env, {"rewards": {"task": {"weight": 1.0}}}, steps=5, lr=0.0, seed=0)
    with pytest.raises(KeyError):
        train(env, {"aggregation": {"name": "no_such_aggregation"}}, steps=5, lr=1.0, seed=0)


def test_one_over_length_normalisation_biases_length_and_the_constant_does_not():
    """Positive control: the reward ignores length (p_right fixed), so the unbiased constant
    normaliser leaves E|o| near its start (12) while 1/|o| grows wrong and shrinks right responses."""
    env = LengthEnv(groups=8, p_right=0.5)
    out = {}
    for agg in ("constant", "seq_mean_token_mean"):
        cfg = {"aggregation": {"name": agg, "constant": env.n * 12.0}, "rewards": {"task": {"weight": 1.0}}}
        params, hist = train(env, cfg, steps=150, lr=2.0, seed=0)
        out[agg] = env.expected(params)
        assert np.isfinite(hist["loss"]).all() and hist["reward"].mean() == pytest.approx(0.5, abs=0.05)
    c, s = out["constant"], out["seq_mean_token_mean"]
    assert 9 < c["len_wrong"] < 15 and 9 < c["len_right"] < 16
    assert s["len_wrong"] > 1.5 * c["len_wrong"] and s["len_right"] < 0.6 * c["len_right"]
