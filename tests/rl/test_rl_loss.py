"""The composed RL loss on padded trajectories: jit, shapes, credit assignment over segment chains,
bad-input behaviour, and the `rl` config validator."""
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from c2jax.config import ConfigError, ConfigWarning, validate
from c2jax.rl.loss import DEFAULT_RL_CONFIG, make_rl_loss
from c2jax.batching import pad_batch
from c2jax.trajectory import Effort, Segment, Trajectory

MAX_LEN, ROWS, N = 24, 8, 8


def seg(prompt_len, n, mask=None, start=5):
    mask = [1] * n if mask is None else mask
    return Segment(list(range(1, 1 + prompt_len)), list(range(start, start + n)), mask, [-0.7] * n, [2] * n)


def batch_of(trajs):
    return pad_batch(trajs, MAX_LEN, num_rows=ROWS, max_trajectories=N)


def trajs_two_groups():
    return [
        # group a: a 2-segment self-summarisation chain that succeeded, and a failure with a tool output
        Trajectory([seg(3, 5), seg(2, 4)], "t1", "a", reward_terms={"task": 1.0}, effort=Effort(turns=2)),
        Trajectory([seg(3, 6, mask=[1, 1, 0, 0, 1, 1])], "t1", "a", reward_terms={"task": 0.0}),
        Trajectory([seg(3, 4)], "t1", "a", reward_terms={"task": 0.0}),
        # group b
        Trajectory([seg(2, 3)], "t2", "b", reward_terms={"task": 1.0}),
        Trajectory([seg(2, 7)], "t2", "b", reward_terms={"task": 0.0}),
    ]


def test_jit_shapes_and_segment_chain_credit():
    b = batch_of(trajs_two_groups())
    loss_fn = make_rl_loss(dict(aggregation=dict(name="constant", constant=100.0)))
    logp = jnp.asarray(b["behaviour_logp"])
    (loss, m), g = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(logp, b)
    assert loss.shape == () and g.shape == (ROWS, MAX_LEN) and np.all(np.isfinite(g))
    assert all(np.shape(v) == () for v in m.values())
    ti, mask = b["traj_index"], b["loss_mask"]
    adv = np.array([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5])
    for i, a in enumerate(adv):
        sel = (ti == i) & (mask > 0)
        np.testing.assert_allclose(g[sel], -a / 100.0, rtol=1e-5)  # every token of the chain gets the reward
    assert np.all(g[mask == 0] == 0)  # prompts, tool outputs and padding get no gradient
    assert float(m["batch/policy_tokens"]) == 5 + 4 + 4 + 4 + 3 + 7
    assert float(m["mismatch/abs_logp_diff"]) == 0.0
    _, m = loss_fn(logp, b, current_version=5)  # every token was sampled by version 2
    assert float(m["staleness/mean"]) == 3.0 and float(m["staleness/max"]) == 3.0


@pytest.mark.parametrize("cfg", [
    dict(objective=dict(name="ppo", clip_low=0.2, clip_high=0.28, tis_cap=2.0)),
    dict(objective=dict(name="cispo"), aggregation=dict(name="token_mean")),
    dict(advantage=dict(name="rloo", std_normalize=True), aggregation=dict(name="seq_mean_token_mean")),
    dict(kl=dict(coef=0.1, estimator="k3", placement="loss")),
    dict(kl=dict(coef=0.1, estimator="k1", placement="reward"),
         rewards=dict(task=dict(weight=1.0), length_penalty=dict(weight=0.01, k=0.1, q=1.0, weights=dict(turns=1.0)))),
])
def test_every_piece_runs_under_jit_with_bad_inputs(cfg):
    """Infra failure, NaN reward, NaN logprobs off the mask: finite loss and gradient, failures counted."""
    trajs = trajs_two_groups()
    trajs[2].infra_failed = True
    trajs[4].reward_terms["task"] = float("nan")
    b = batch_of(trajs)
    rng = np.random.default_rng(0)
    logp = np.where(b["loss_mask"] > 0, b["behaviour_logp"] + rng.normal(0, 0.1, b["loss_mask"].shape), np.nan)
    ref = np.where(b["loss_mask"] > 0, b["behaviour_logp"] - 0.2, np.nan)
    loss_fn = make_rl_loss(cfg)
    (loss, m), g = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(jnp.asarray(logp, jnp.float32), b,
                                                                    jnp.asarray(ref, jnp.float32))
    assert np.isfinite(float(loss)) and np.all(np.isfinite(g))
    assert all(np.isfinite(float(v)) for v in m.values())
    assert float(m["batch/infra_failed"]) == 1.0 and float(m["adv/nonfinite_rewards"]) == 1.0
    ti = b["traj_index"]
    assert np.all(np.asarray(g)[(ti == 2) | (ti == 4)] == 0)  # masked samples contribute nothing
    assert float(m["batch/trajectories"]) == 3.0


def test_bad_calls_raise_clear_errors():
    b = batch_of(trajs_two_groups())
    loss_fn = make_rl_loss(dict(kl=dict(coef=0.1)))
    with pytest.raises(ValueError, match="needs logp_ref"):
        loss_fn(jnp.zeros((ROWS, MAX_LEN)), b)
    with pytest.raises(ValueError, match=r"logp shape \(8, 23\) != batch\['loss_mask'\] shape \(8, 24\)"):
        make_rl_loss()(jnp.zeros((ROWS, MAX_LEN - 1)), b)
    with pytest.raises(KeyError, match="'quality' is not in batch"):
        make_rl_loss(dict(rewards=dict(quality=dict(weight=1.0))))(jnp.zeros((ROWS, MAX_LEN)), b)
    with pytest.raises(KeyError, match="unknown rl_policy_loss 'reinforce'"):
        make_rl_loss(dict(objective=dict(name="reinforce")))


def rl_config(**rl):
    return ml_collections.ConfigDict(dict(seed=0, rl=rl))


def test_validator_accepts_defaults_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(rl_config(**DEFAULT_RL_CONFIG)) == []
        assert validate(rl_config()) == []


def test_validator_warns_on_k1_in_loss_and_other_biases():
    warns = validate(rl_config(kl=dict(coef=0.05, estimator="k1", placement="loss")), warn=False)
    assert any(k == "rl.kl.placement" and "zero expected gradient" in msg for k, msg in warns)
    with pytest.warns(ConfigWarning, match="zero expected gradient"):
        validate(rl_config(kl=dict(coef=0.05, estimator="k1", placement="loss")))
    assert validate(rl_config(kl=dict(coef=0.0, estimator="k1", placement="loss")), warn=False) == []  # KL off
    keys = {k for k, _ in validate(rl_config(advantage=dict(name="grpo", std_normalize=True),
                                             aggregation=dict(name="seq_mean_token_mean"),
                                             kl=dict(coef=0.1, estimator="k3", placement="loss"),
                                             objective=dict(name="pg", tis_cap=0.5)), warn=False)}
    assert keys == {"rl.advantage.std_normalize", "rl.aggregation.name", "rl.kl.placement", "rl.objective.tis_cap"}


def test_validator_errors_list_every_problem():
    with pytest.raises(ConfigError) as e:
        validate(rl_config(group_size=1, advantage=dict(name="gae"), objective=dict(name="ppo", clip_low=1.5, eps=0.1),
                           aggregation=dict(name="constant", constant=0), kl=dict(coef=-1.0, estimator="k5", placement="adv"),
                           rewards=dict(task=dict(weight="high"), length_penalty=dict(k=-1.0, q=1.0, weights=dict(tokens=1.0)),
                                        odd=dict(fn="magic")),
                           lr=1e-6))
    keys = {k for k, _ in e.value.problems}
    assert keys == {"rl.group_size", "rl.advantage.name", "rl.objective.clip_low", "rl.objective.eps",
                    "rl.aggregation.constant", "rl.kl.coef", "rl.kl.estimator", "rl.kl.placement",
                    "rl.rewards.task.weight", "rl.rewards.length_penalty.k", "rl.rewards.length_penalty.weights.tokens",
                    "rl.rewards.odd.fn", "rl.lr"}
    assert "a group of 1 has no baseline" in str(e.value)


def test_overlong_mask_is_off_by_default_and_masks_when_on():
    trajs = trajs_two_groups()
    trajs[1].truncated = True
    b = batch_of(trajs)
    logp = jnp.asarray(b["behaviour_logp"])
    for on in (False, True):
        loss_fn = make_rl_loss(dict(overlong_mask=on))
        (_, m), g = jax.value_and_grad(loss_fn, has_aux=True)(logp, b)
        assert float(m["batch/truncated"]) == 1.0
        touched = np.any(np.asarray(g)[b["traj_index"] == 1] != 0)
        assert touched != on
    with pytest.raises(ConfigError, match="overlong_mask"):
        validate(rl_config(overlong_mask="yes"))


def test_rl_config_dict_round_trips_through_validation():
    from c2jax.rl.loss import rl_config_dict

    cfg = ml_collections.ConfigDict(dict(seed=0, rl=rl_config_dict(objective=dict(name="ppo", clip_low=0.2, clip_high=0.28))))
    cfg.lock()
    cfg.rl.objective.tis_cap = 2.0
    assert validate(cfg, warn=False) == []
    loss_fn = make_rl_loss(cfg.rl)
    b = batch_of(trajs_two_groups())
    loss, m = loss_fn(jnp.asarray(b["behaviour_logp"]), b)
    assert np.isfinite(float(loss)) and "ppo/clip_frac" in m


def test_outputs_adapter_temperature_and_raw_behaviour():
    from c2jax.rl.loss import rl_loss_from_outputs, token_logprobs

    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(ROWS, MAX_LEN, 11)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 11, (ROWS, MAX_LEN)), jnp.int32)
    np.testing.assert_allclose(token_logprobs(logits, targets, 0.7),
                               np.take_along_axis(np.asarray(jax.nn.log_softmax(logits / 0.7)), np.asarray(targets)[..., None], -1)[..., 0],
                               rtol=1e-5, atol=1e-6)
    # A sampler at temperature 0.7: behaviour = tempered logprob, raw = temperature-1 logprob.
    segs = []
    for i in range(4):
        segs.append(Segment([1, 2], [3, 4, 5], [1, 1, 1], [-0.5] * 3, [0] * 3, raw_logprobs=[-0.6] * 3))
    trajs = [Trajectory([s], "t", "g", reward_terms={"task": float(i % 2)}) for i, s in enumerate(segs)]
    b = pad_batch(trajs, MAX_LEN, num_rows=ROWS, max_trajectories=N)
    b = dict(b, targets=targets)
    lp_t = token_logprobs(logits, targets, 0.7)
    lp_1 = token_logprobs(logits, targets, 1.0)
    b["behaviour_logp"] = np.where(b["loss_mask"] > 0, lp_t, 0.0).astype(np.float32)
    b["raw_logp"] = np.where(b["loss_mask"] > 0, lp_1, 0.0).astype(np.float32)
    cfg = dict(objective=dict(name="pg", tis_cap=2.0))
    _, m = rl_loss_from_outputs(cfg, temperature=0.7)({"logits": logits}, b)
    assert float(m["tis/ratio_mean"]) == pytest.approx(1.0) and float(m["mismatch/abs_logp_diff"]) < 1e-6
    _, m = rl_loss_from_outputs(dict(cfg, behaviour_logprobs="raw"))({"logits": logits}, b)
    assert float(m["tis/ratio_mean"]) == pytest.approx(1.0) and float(m["mismatch/abs_logp_diff"]) < 1e-6
    _, m = rl_loss_from_outputs(cfg)({"logits": logits}, b)  # temperature mismatch shows up as off-policy
    assert float(m["mismatch/abs_logp_diff"]) > 0.1
    del b["raw_logp"]
    with pytest.raises(KeyError, match="raw_logp"):
        rl_loss_from_outputs(dict(cfg, behaviour_logprobs="raw"))({"logits": logits}, b)


def test_top_fraction_mask_keeps_the_highest_live_scores():
    """Brute force over random scores: exactly ceil(fraction x live tokens) kept, all of them live, none
    lower than a dropped live token."""
    from c2jax.rl.loss import top_fraction_mask

    rng = np.random.default_rng(0)
    for _ in range(20):
        score = rng.standard_normal((4, 16)).astype(np.float32)
        mask = (rng.random((4, 16)) < 0.6).astype(np.float32)
        frac = float(rng.uniform(0.05, 1.0))
        keep = np.asarray(top_fraction_mask(jnp.asarray(score), jnp.asarray(mask), frac))
        n = int(mask.sum())
        assert keep.sum() == max(1, int(np.ceil(frac * n)))
        assert np.all(keep <= mask)
        dropped = (mask > 0) & (keep == 0)
        if dropped.any():
            assert score[keep > 0].min() >= score[dropped].max()


def test_top_entropy_filter_is_the_policy_gradient_on_those_tokens_only():
    """rl.token_filter 'top_entropy': the gradient equals the unfiltered one on the kept tokens and is 0
    on the others; the loss needs batch['token_entropy'] (a clear error without it)."""
    from c2jax.rl.loss import top_fraction_mask

    b = batch_of(trajs_two_groups())
    rng = np.random.default_rng(1)
    ent = rng.random(b["loss_mask"].shape).astype(np.float32)
    logp = jnp.asarray(b["behaviour_logp"])
    cfg = dict(aggregation=dict(name="constant", constant=100.0))
    plain = make_rl_loss(cfg)
    filt = make_rl_loss(dict(cfg, token_filter=dict(name="top_entropy", fraction=0.3)))
    g_plain = np.asarray(jax.grad(lambda lp: plain(lp, b)[0])(logp))
    bf = dict(b, token_entropy=ent)
    (_, m), g = jax.value_and_grad(filt, has_aux=True)(logp, bf)
    keep = np.asarray(top_fraction_mask(jnp.asarray(ent), jnp.asarray(b["loss_mask"]), 0.3)) > 0
    assert 0 < keep.sum() < (b["loss_mask"] > 0).sum()
    np.testing.assert_allclose(np.asarray(g)[keep], g_plain[keep], rtol=1e-6)
    assert np.all(np.asarray(g)[~keep] == 0) and np.any(g_plain[~keep] != 0)
    assert float(m["token_filter/kept_fraction"]) == pytest.approx(keep.sum() / (b["loss_mask"] > 0).sum())
    with pytest.raises(KeyError, match="token_entropy"):
        filt(logp, b)
    with pytest.raises(ConfigError, match="token_filter"):
        validate(rl_config(token_filter=dict(name="entropy", fraction=1.5)))
