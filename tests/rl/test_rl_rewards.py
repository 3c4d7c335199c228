"""Reward terms: the length penalty C_{k,q} against its closed-form properties, and reward composition."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.rl.rewards import compute_rewards, effort_measure, length_penalty
from c2jax.batching import pad_batch
from c2jax.trajectory import EFFORT_FIELDS, Effort, Segment, ToolEvent, Trajectory

X = jnp.array([0.0, 0.5, 1.0, 10.0, 100.0, 1e4])
PARAMS = [(k, q) for k in (0.01, 0.5, 2.0) for q in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)]


def c_numpy(x, k, q):
    """Reference in float64 straight from the definition (and its log limit at q = 1)."""
    x = np.asarray(x, np.float64)
    return np.log1p(k * x) / k if q == 1 else ((1 + k * x) ** (1 - q) - 1) / (k * (1 - q))


@pytest.mark.parametrize("k, q", PARAMS)
def test_value_zero_and_derivative(k, q):
    np.testing.assert_allclose(length_penalty(X, k, q), c_numpy(X, k, q), rtol=2e-5, atol=1e-7)
    assert float(length_penalty(0.0, k, q)) == 0.0
    dc = jax.vmap(jax.grad(lambda x: length_penalty(x, k, q)))(X)
    np.testing.assert_allclose(dc, (1 + k * np.asarray(X, np.float64)) ** (-q), rtol=2e-5, atol=1e-9)
    assert np.all(np.diff(np.asarray(length_penalty(X, k, q))) > 0)  # increasing
    assert np.all(np.diff(np.asarray(dc)) <= 1e-6)  # concave (marginal penalty decays)


def test_q0_is_linear_and_k0_limit():
    np.testing.assert_allclose(length_penalty(X, 0.3, 0.0), X, rtol=1e-5)
    np.testing.assert_allclose(length_penalty(X, 0.0, 2.0), X)
    np.testing.assert_allclose(length_penalty(X, 1e-4, 2.0)[:4], X[:4], rtol=2e-3)


def test_q_to_1_log_limit():
    k = 0.5
    log_form = np.log1p(k * np.asarray(X, np.float64)) / k
    np.testing.assert_allclose(length_penalty(X, k, 1.0), log_form, rtol=1e-6)
    errs = []
    for eps in (1e-1, 1e-2, 1e-3):
        for q in (1 - eps, 1 + eps):
            err = np.max(np.abs(np.asarray(length_penalty(X, k, q), np.float64) - log_form) / np.maximum(log_form, 1e-12))
            errs.append(err)
    errs = np.array(errs).reshape(3, 2).max(1)
    assert np.all(errs[1:] < errs[:-1] / 5)  # converges roughly linearly in |1 - q|
    assert errs[-1] < 1e-2
    # continuous through q = 1: the switch to the log form at |1 - q| < 1e-7 is invisible
    np.testing.assert_allclose(length_penalty(X, k, 1 + 2e-7), log_form, rtol=1e-5)


@pytest.mark.parametrize("k, q", [(0.01, 1.5), (0.5, 2.0), (2.0, 3.0)])
def test_bounded_for_q_above_1(k, q):
    bound = 1.0 / (k * (q - 1))
    big = jnp.array([1e3, 1e6, 1e9, 1e12])
    c = np.asarray(length_penalty(big, k, q), np.float64)
    assert np.all(c < bound * (1 + 1e-6))
    # and approaches the bound: bound - C = (1 + k x)^(1-q) / (k (q - 1))
    np.testing.assert_allclose(bound - c, (1 + k * np.asarray(big, np.float64)) ** (1 - q) / (k * (q - 1)), atol=bound * 1e-5)
    # for q <= 1 it is unbounded
    assert float(length_penalty(1e12, k, 1.0)) > 10 * bound


def make_traj(i, reward, group="g", **effort):
    c = 4 + i
    seg = Segment([1], list(range(2, 2 + c)), [1] * c, [-0.3] * c, [0] * c)
    return Trajectory([seg], task_id="t", group_id=group, reward_terms=reward, effort=Effort(**effort),
                      tool_events=[ToolEvent(name="edit", malformed=True, ok=False)] * i)


def test_compose_rewards_reports_every_term():
    trajs = [
        make_traj(0, {"task": 1.0, "comment_reasoning": 0.0}, thinking_tokens=100, tool_calls=2, turns=1),
        make_traj(1, {"task": 0.0, "comment_reasoning": -1.0}, thinking_tokens=400, tool_calls=10, turns=3),
        make_traj(2, {"task": float("nan"), "comment_reasoning": 0.0}, thinking_tokens=0),
    ]
    b = pad_batch(trajs, max_len=16, max_trajectories=4)
    weights = dict(thinking_tokens=0.01, tool_calls=1.0, turns=0.5)
    cfg = dict(task=dict(weight=1.0),
               length=dict(fn="length_penalty", weight=0.2, k=0.1, q=1.5, weights=weights),
               comment_reasoning=dict(weight=0.5),
               broken=dict(fn="broken_tool_calls", weight=0.25))
    total, m = jax.jit(lambda bb: compute_rewards(bb, cfg))(b)
    x = np.array([1.0 + 2 + 0.5, 4.0 + 10 + 1.5, 0.0])
    expect = np.array([1.0, 0.0, np.nan]) - 0.2 * c_numpy(x, 0.1, 1.5) + 0.5 * np.array([0.0, -1.0, 0.0]) - 0.25 * np.arange(3)
    np.testing.assert_allclose(total[:3], expect, rtol=1e-5)
    assert set(m) >= {"reward/task", "reward/length", "reward/comment_reasoning", "reward/broken", "reward/total"}
    assert float(m["reward/task"]) == pytest.approx(0.5)  # NaN excluded from the mean ...
    assert float(m["reward/task/nonfinite"]) == 1.0  # ... and counted
    assert float(m["reward/broken"]) == pytest.approx(-1.0)
    assert float(m["reward/length"]) == pytest.approx(-c_numpy(x, 0.1, 1.5).mean(), rel=1e-5)
    np.testing.assert_allclose(effort_measure(b["effort"], weights)[:3], x, rtol=1e-6)


def test_reward_config_errors():
    b = pad_batch([make_traj(0, {"task": 1.0})], max_len=16)
    with pytest.raises(KeyError, match="'style' is not in batch"):
        compute_rewards(b, dict(style=dict(weight=1.0)))
    with pytest.raises(KeyError, match="unknown effort fields"):
        compute_rewards(b, dict(length_penalty=dict(k=1.0, q=1.0, weights=dict(thoughts=1.0))))
    with pytest.raises(KeyError, match="unknown rl_reward_term"):
        compute_rewards(b, dict(x=dict(fn="nope")))
    with pytest.raises(ValueError, match="at least one"):
        compute_rewards(b, {})
    assert len(EFFORT_FIELDS) == 6


def _traj_logp(logps, reward, group, infra_failed=False, tool_mask=None):
    """A one-segment trajectory whose policy tokens have sampler logprobs `logps` (tool tokens: 0, -9)."""
    c = len(logps)
    mask = [1] * c if tool_mask is None else tool_mask
    lp = [float(v) if m else -9.0 for v, m in zip(logps, mask)]
    seg = Segment([1], list(range(2, 2 + c)), mask, lp, [0] * c)
    return Trajectory([seg], task_id=group, group_id=group, reward_terms={"task": reward}, infra_failed=infra_failed)


def _unlikeliness_numpy(means, rewards, groups, usable, beta):
    """He, Fried & Welleck's rank penalty, transcribed from the paper's description: per group,
    ranks = argsort(argsort(mean logprob)) / G over the usable members, reward * (1 - beta * rank)."""
    out = np.array(rewards, np.float64)
    for g in set(groups):
        idx = [i for i, (gg, u) in enumerate(zip(groups, usable)) if gg == g and u]
        ranks = np.argsort(np.argsort(np.array([means[i] for i in idx]), kind="stable"), kind="stable") / len(idx)
        for i, r in zip(idx, ranks):
            out[i] = rewards[i] * (1 - beta * r)
    return out


def test_unlikeliness_matches_the_rank_penalty_brute_force():
    rng = np.random.default_rng(0)
    trajs, means, rewards, groups, usable = [], [], [], [], []
    for g, size in (("a", 8), ("b", 5), ("c", 3)):
        for j in range(size):
            n_tok = int(rng.integers(3, 9))
            lps = -np.abs(rng.normal(1.0, 0.5, n_tok))
            tool = [1] * n_tok
            tool[0] = 0  # a tool-output token: must not count in the mean
            r = float(rng.integers(0, 2))
            failed = g == "b" and j == 2  # an infra failure: outside the ranking and the group size
            trajs.append(_traj_logp(lps, r, g, infra_failed=failed, tool_mask=tool))
            means.append(float(np.mean(np.asarray(lps, np.float32)[1:])))
            rewards.append(r)
            groups.append(g)
            usable.append(not failed)
    # a tie in group c: equal means rank by trajectory order
    trajs[-1] = _traj_logp([0.0, -0.5, -0.5], 1.0, "c", tool_mask=[0, 1, 1])
    trajs[-2] = _traj_logp([0.0, -0.5, -0.5], 1.0, "c", tool_mask=[0, 1, 1])
    means[-1] = means[-2] = -0.5
    rewards[-1] = rewards[-2] = 1.0
    b = pad_batch(trajs, max_len=16, max_trajectories=20)
    beta = 0.25
    cfg = dict(task=dict(weight=1.0), unlikely=dict(fn="unlikeliness", weight=beta))
    total, m = jax.jit(lambda bb: compute_rewards(bb, cfg))(b)
    expect = _unlikeliness_numpy(means, rewards, groups, usable, beta)
    ok = np.array(usable)
    np.testing.assert_allclose(np.asarray(total)[:len(trajs)][ok], expect[ok], rtol=1e-6, atol=1e-7)
    # the failure keeps its plain reward (it is masked out of the loss downstream)
    assert float(total[10]) == rewards[10]
    # the penalty only touches rewarded samples
    assert float(m["reward/unlikely"]) < 0
    zero = np.array(rewards) == 0.0
    np.testing.assert_array_equal(np.asarray(total)[:len(trajs)][zero], 0.0)
    assert zero.any() and (~zero).any()


def test_unlikeliness_gives_an_all_correct_group_a_signal_towards_the_unlikely_sample():
    """Without the term a group of 4 successes has zero advantage; with it the least likely success
    gets the largest advantage and the likeliest the smallest (the paper's point), and beta = 0
    reproduces plain GRPO exactly."""
    from c2jax.rl.advantages import compute_advantages
    trajs = [_traj_logp([-0.1 * (i + 1)] * 4, 1.0, "g") for i in range(4)]  # likeliest first
    b = pad_batch(trajs, max_len=8)
    valid = jnp.asarray(b["traj_valid"])
    for beta, expect_zero in ((0.0, True), (0.25, False)):
        cfg = dict(task=dict(weight=1.0), u=dict(fn="unlikeliness", weight=beta))
        total, _ = compute_rewards(b, cfg)
        adv, _ = compute_advantages("grpo", total, jnp.asarray(b["group_index"]), valid)
        adv = np.asarray(adv)
        if expect_zero:
            np.testing.assert_array_equal(adv, 0.0)
        else:
            assert np.all(np.diff(adv) > 0)  # less likely -> larger advantage
            np.testing.assert_allclose(np.asarray(total), 1 - beta * np.array([3, 2, 1, 0]) / 4, rtol=1e-6)


def test_unlikeliness_config_errors():
    b = pad_batch([_traj_logp([-0.5, -0.5], 1.0, "g")], max_len=8)
    with pytest.raises(KeyError, match="'grade' is not in batch"):
        compute_rewards(b, dict(u=dict(fn="unlikeliness", of="grade")))
    with pytest.raises(KeyError, match="no 'raw_logp'"):
        compute_rewards(b, dict(u=dict(fn="unlikeliness", logp_key="raw_logp")))
