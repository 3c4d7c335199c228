"""One RL step through the real harness, engine and sandbox, checked exactly:

* with the dropless MoE and the sampler's routes replayed, the learner's f32 logprobs equal the
  sampler's raw logprobs on the same weights (within 1e-5);
* the learner's gradient equals autodiff of a hand-written Dr. GRPO loss on the same batch;
* the engine's version increments after the step and tokens sampled afterwards carry it;
* a masked (infrastructure-failed) trajectory contributes nothing to the gradient.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _agent_common import agent_tokenizer, chat_format, needs_bwrap  # noqa: F401
from _agent_common import make_task

pytestmark = needs_bwrap


@functools.lru_cache(maxsize=None)
def _model():
    from c2jax.model import init
    from c2jax.model.config import preset

    cfg = preset("tiny").replace(vocab_size=1024, max_position_embeddings=1024, mtp_depth=0,
                                 **{"moe.impl": "dropless"})
    return cfg, init(cfg, jax.random.PRNGKey(3))


def _rl(**over):
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage

    rl = resolve_rl_config({"group_size": 4, "rewards": {"task": {"weight": 1.0}}})
    rl.update(resolve_stage({"steps": 1, "tasks_per_step": 1, "max_in_flight": 4, "max_len": 1024,
                             "learning_rate": 1e-3}))
    rl.update(over)
    return rl


@pytest.fixture(scope="module")
def stepped(repo_env):
    """Run one rl_step on one task (group of 4); return what the checks need."""
    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.policies import EnginePolicy
    from c2jax.agent.tools import ToolConfig
    from c2jax.envs import SandboxPool
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.rl_step import RLContext, rl_step
    from c2jax.train.state import TrainState

    cfg, params = _model()
    rl = _rl()
    fmt = chat_format()
    engine = Engine(params, cfg, EngineConfig(max_slots=4, max_len=1024, recompute_cache_on_update=True),
                    tokenizer=agent_tokenizer())
    harness = Harness(fmt, HarnessConfig(max_turns=2, max_new_tokens=24, system_prompt="Fix it.",
                                         tools=ToolConfig(enabled=("read_file", "search_replace"),
                                                          compact_declarations=True)))
    policy = EnginePolicy(engine, fmt, temperature=1.0, seed=0)
    learner = make_learner(cfg, rl, params)
    state = TrainState.create(params, learner.tx)
    task = make_task(repo_env[1])
    with SandboxPool(max_concurrency=4) as pool:
        ctx = RLContext(rl=rl, learner=learner, engine=engine, policy=policy, harness=harness, pool=pool,
                        ref_params=params, seed=0)
        out = rl_step(ctx, state, [task], step=0, version=0, engine_version=0)
        after = engine.submit(_req(fmt)).result()
    engine.shutdown()
    return dict(cfg=cfg, params=params, rl=rl, learner=learner, out=out, after=after, engine=engine)


def _req(fmt):
    from c2jax.sampling import Request, SamplingParams

    return Request(fmt.tok.encode("def add(a, b):"), SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))


def _batch(trajs, num_rows=None):
    from c2jax.batching import pad_batch

    return pad_batch(trajs, 1024, num_rows=num_rows, reward_names=("task", "reward"))


def test_replayed_learner_logprobs_equal_sampler_raw_logprobs(stepped):
    trajs = [s.trajectory for s in stepped["out"].samples if not s.mask_reason]
    assert trajs, "every rollout was masked"
    b = _batch(trajs)
    assert "routes" in b and "raw_logp" in b
    logp, _ = stepped["learner"].logp(stepped["params"], b, replay=True)
    m = b["loss_mask"] > 0
    assert m.sum() > 10
    err = np.abs(np.asarray(logp) - b["raw_logp"])[m]
    assert err.max() < 1e-5, err.max()
    assert stepped["out"].metrics["mismatch/with_replay/mean"] < 1e-5


def test_step_diagnostics_from_the_update_forward_equal_separate_forwards(stepped):
    """The step takes its mismatch and route-flip diagnostics from the update's own forward (no extra
    forward); they equal those of separate forwards on the parameters before the update."""
    from c2jax.train.rl_learner import mismatch_stats, route_flip_rate

    trajs = [s.trajectory for s in stepped["out"].samples]
    b = _batch(trajs)
    live = (b["loss_mask"] * (b["traj_index"] >= 0)
            * (1.0 - b["infra_failed"][np.clip(b["traj_index"], 0, None)]))
    lp_replay, _ = stepped["learner"].logp(stepped["params"], b, replay=True)
    _, aux_free = stepped["learner"].logp(stepped["params"], b, replay=False)
    want = mismatch_stats(np.asarray(lp_replay), b["raw_logp"], live)
    flips = route_flip_rate(np.asarray(aux_free["routes"]), b["routes"], (b["segment_ids"] > 0).astype(np.float32))
    got = stepped["out"].metrics
    assert got["mismatch/with_replay/mean"] == pytest.approx(want["mean"], abs=1e-7)
    assert got["mismatch/with_replay/p99"] == pytest.approx(want["p99"], abs=1e-6)
    assert got["route_flip_rate"] == pytest.approx(flips, abs=1e-9)


def _hand_token_weights(b, rewards, valid):
    """Per-token Dr. GRPO weights (R_i - mean_group R) and the live-token mask, in numpy."""
    g = b["group_index"]
    adv = np.zeros_like(rewards)
    for gi in set(g.tolist()):
        members = (g == gi) & (valid > 0)
        adv[members] = rewards[members] - rewards[members].mean()
    ti = b["traj_index"]
    tok_adv = np.where(ti >= 0, adv[np.clip(ti, 0, None)], 0.0)
    tok_valid = np.where(ti >= 0, valid[np.clip(ti, 0, None)], 0.0)
    return tok_adv, b["loss_mask"] * tok_valid


def _hand_dr_grpo_loss(params, cfg, b, tok_adv, mask):
    """-(1/(B*L)) sum_i sum_t (R_i - mean_group R) log pi(o_it), written out from the report
    (jitted by the caller: eager op-by-op autodiff of the model costs ~30 s on CPU)."""
    from c2jax.model.transformer import apply

    out = apply(params, b["tokens"], cfg, segment_ids=b["segment_ids"], positions=b["positions"],
                routes=b["routes"])
    logits = out["logits"].astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), b["targets"][..., None], -1)[..., 0]
    return -jnp.sum(jnp.where(mask > 0, tok_adv * logp, 0.0)) / b["tokens"].size


def test_gradient_equals_hand_written_dr_grpo(stepped):
    from c2jax.train.rl_learner import learner_model_config

    trajs = [s.trajectory for s in stepped["out"].samples if not s.mask_reason]
    rewards = np.asarray([1.0, 0.0, 1.0, 0.0][: len(trajs)], np.float32)
    for t, r in zip(trajs, rewards):
        t.reward_terms["task"] = float(r)
    b = _batch(trajs)
    g, _ = stepped["learner"].grads(stepped["params"], b)
    cfg = learner_model_config(stepped["cfg"], stepped["rl"])
    tok_adv, mask = _hand_token_weights(b, rewards, np.ones(len(trajs), np.float32))
    arrays = {k: jnp.asarray(b[k]) for k in ("tokens", "segment_ids", "positions", "routes", "targets")}
    want = jax.jit(jax.grad(_hand_dr_grpo_loss), static_argnums=1)(stepped["params"], cfg, arrays, tok_adv, mask)
    leaves_g, leaves_w = jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(want)
    total = sum(float(jnp.abs(x).sum()) for x in leaves_w)
    assert total > 0  # the batch has reward variance: the gradient is not trivially 0
    for a, w in zip(leaves_g, leaves_w):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-4, atol=1e-7)


def test_masked_infra_failure_contributes_nothing(stepped):
    trajs = [s.trajectory for s in stepped["out"].samples if not s.mask_reason]
    if len(trajs) < 3:
        pytest.skip("fewer than 3 live rollouts")
    for t, r in zip(trajs, [1.0, 0.0, 1.0, 0.0]):
        t.reward_terms["task"] = r
    import copy

    masked = [copy.deepcopy(t) for t in trajs]
    masked[0].infra_failed = True
    masked[0].reward_terms["task"] = 123.0  # a masked sample's reward must not matter either
    rows = _batch(trajs)["tokens"].shape[0]
    g_masked, m = stepped["learner"].grads(stepped["params"], _batch(masked, rows))
    g_without, _ = stepped["learner"].grads(stepped["params"], _batch(trajs[1:], rows))
    for a, w in zip(jax.tree_util.tree_leaves(g_masked), jax.tree_util.tree_leaves(g_without)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-5, atol=1e-9)
    assert float(m["batch/infra_failed"]) == 1.0


def test_version_increments_and_later_tokens_carry_it(stepped):
    out = stepped["out"]
    assert out.version == 1 and out.engine_version == 1
    assert stepped["engine"].version == 1
    assert set(stepped["after"].versions[stepped["after"].prompt_len:]) == {1}
    # tokens of the step's rollouts were sampled by version 0
    vs = {int(v) for s in out.samples for seg in s.trajectory.segments for v, m in
          zip(seg.policy_versions, seg.loss_mask) if m}
    assert vs <= {0}
    assert out.metrics["staleness/hist/0"] > 0 and out.metrics["time/learner_s"] > 0


def test_group_chunks_keep_whole_groups_in_order():
    from types import SimpleNamespace

    from c2jax.train.rl_step import group_chunks

    trajs = [SimpleNamespace(group_id=g, i=i) for i, g in enumerate("aaabbbcccddd")]
    chunks = group_chunks(trajs, 2)
    assert [[t.i for t in c] for c in chunks] == [list(range(6)), list(range(6, 12))]
    assert len(group_chunks(trajs, 9)) == 4  # never more chunks than groups
    assert [len(c) for c in group_chunks(trajs, 3)] in ([3, 6, 3], [6, 3, 3], [3, 3, 6])
    assert group_chunks(trajs, 1)[0] == trajs


@pytest.mark.slow  # ~20 s of learner compiles and updates; the default run keeps test_group_chunks_*
def test_minibatches_equal_successive_updates_on_each_group(stepped):
    """rl.minibatches=2 on two groups = one full-batch update on group A's samples, then one on B's
    (advantages are per group, so a minibatch of whole groups sees exactly its own advantages)."""
    import copy
    from types import SimpleNamespace

    from c2jax.train.rl_step import _minibatch_updates
    from c2jax.train.state import TrainState

    trajs = [s.trajectory for s in stepped["out"].samples if not s.mask_reason]
    if len(trajs) < 4:
        pytest.skip("fewer than 4 live rollouts")
    a = [copy.deepcopy(t) for t in trajs[:4]]
    b = [copy.deepcopy(t) for t in trajs[:4]]
    for t, r in zip(a, [1.0, 0.0, 0.0, 0.0]):
        t.group_id, t.reward_terms["task"] = "A", r
    for t, r in zip(b, [0.0, 1.0, 1.0, 0.0]):
        t.group_id, t.reward_terms["task"] = "B", r
    learner, params = stepped["learner"], stepped["params"]
    rl = dict(stepped["rl"], minibatches=2)
    ctx = SimpleNamespace(rl=rl, learner=learner, ref_params=None, reward_names=("task", "reward"))
    state0 = TrainState.create(params, learner.tx)
    got, m = _minibatch_updates(ctx, state0, a + b, 2, version=0)
    assert int(got.step) == 2 and m["learner/minibatches"] == 2.0
    assert m["batch/trajectories"] == 8.0  # counts add up over the minibatches
    rows = max(_batch(a)["tokens"].shape[0], _batch(b)["tokens"].shape[0])
    rows = max(4, -(-rows // 4) * 4)
    want, _ = learner.update(state0, _batch(a, rows))
    want, _ = learner.update(want, _batch(b, rows))
    for x, y in zip(jax.tree_util.tree_leaves(got.params), jax.tree_util.tree_leaves(want.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-8)
    moved = sum(float(jnp.abs(x - y).sum()) for x, y in zip(jax.tree_util.tree_leaves(got.params),
                                                            jax.tree_util.tree_leaves(params)))
    assert moved > 0


def test_update_with_logp_is_the_same_update(stepped):
    """The step's update (`update_with_logp`, which also returns the forward's logprobs and routes)
    moves the parameters and optimizer state bit for bit like `update`, and the logprobs it returns
    are those of the parameters before the update."""
    from c2jax.train.state import TrainState

    trajs = [s.trajectory for s in stepped["out"].samples]
    b = _batch(trajs, num_rows=4 * -(-_batch(trajs)["tokens"].shape[0] // 4))
    learner, params = stepped["learner"], stepped["params"]
    state0 = TrainState.create(params, learner.tx)
    want, m_want = learner.update(state0, b)
    got, m_got, (lp, routes) = learner.update_with_logp(state0, b)
    for x, y in zip(jax.tree_util.tree_leaves((got.params, got.opt_state)),
                    jax.tree_util.tree_leaves((want.params, want.opt_state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert float(m_got["loss"]) == float(m_want["loss"])
    lp_sep, aux = learner.logp(params, b, replay=True)
    live = b["loss_mask"] > 0
    np.testing.assert_allclose(np.asarray(lp)[live], np.asarray(lp_sep)[live], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(routes), np.asarray(aux["routes"]))


def test_fitted_learner_rows_give_the_same_gradient(stepped):
    """``rl.learner_row_multiple``: the step's learner rows as long as its trajectories need (here far
    below max_len = 1024) give the gradient and logprobs of full-length rows (padding is masked, and
    the Dr. GRPO normaliser B * L counts rows of max_len whatever length they were cut to);
    a real change of the batch (two rewards swapped) moves the gradient well outside that tolerance,
    so the comparison can fail."""
    import copy

    from c2jax.train.rl_step import learner_row_len

    trajs = [copy.deepcopy(s.trajectory) for s in stepped["out"].samples if not s.mask_reason]
    if len(trajs) < 2:
        pytest.skip("fewer than 2 live rollouts")
    for t, r in zip(trajs, [1.0, 0.0, 1.0, 0.0]):
        t.reward_terms["task"] = r
    rl = dict(stepped["rl"], learner_row_multiple=64)
    row_len = learner_row_len(trajs, rl)
    longest = max(s.num_positions for t in trajs for s in t.segments)
    assert row_len % 64 == 0 and longest <= row_len < 1024
    assert learner_row_len(trajs, dict(rl, learner_row_multiple=0)) == 1024
    from c2jax.batching import pad_batch

    def batch(ts, length):
        return pad_batch(ts, length, num_rows=4, reward_names=("task", "reward"))

    learner, params = stepped["learner"], stepped["params"]
    full, fitted = batch(trajs, 1024), batch(trajs, row_len)
    g_full, _ = learner.grads(params, full)
    g_fit, _ = learner.grads(params, fitted)
    leaves_full, leaves_fit = jax.tree_util.tree_leaves(g_full), jax.tree_util.tree_leaves(g_fit)
    assert sum(float(jnp.abs(x).sum()) for x in leaves_full) > 0
    for a, w in zip(leaves_fit, leaves_full):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-4, atol=1e-7)
    lp_full, _ = learner.logp(params, full, replay=True)
    lp_fit, _ = learner.logp(params, fitted, replay=True)
    np.testing.assert_allclose(np.asarray(lp_fit)[fitted["loss_mask"] > 0],
                               np.asarray(lp_full)[full["loss_mask"] > 0], atol=1e-6)
    swapped = copy.deepcopy(trajs)  # positive control: the same tokens, two rewards swapped
    swapped[0].reward_terms["task"], swapped[1].reward_terms["task"] = 0.0, 1.0
    g_swap, _ = learner.grads(params, batch(swapped, row_len))
    assert any(not np.allclose(np.asarray(a), np.asarray(w), rtol=1e-4, atol=1e-7)
               for a, w in zip(jax.tree_util.tree_leaves(g_swap), leaves_full))


def test_learner_token_filter_ranks_by_the_policys_entropy(stepped):
    """rl.token_filter through the learner: with fraction 1.0 every policy token is kept (the gradient of
    the unfiltered loss); with 0.2 the gradient differs (the learner computed the entropies)."""
    import copy

    from c2jax.train.rl_learner import make_learner

    trajs = [copy.deepcopy(s.trajectory) for s in stepped["out"].samples if not s.mask_reason]
    for t, r in zip(trajs, [1.0, 0.0, 1.0, 0.0]):
        t.reward_terms["task"] = r
    b = _batch(trajs, num_rows=4)
    cfg, params = stepped["cfg"], stepped["params"]
    g_plain, _ = stepped["learner"].grads(params, b)
    all_tokens = make_learner(cfg, dict(stepped["rl"], token_filter={"name": "top_entropy", "fraction": 1.0}), params)
    g_all, m = all_tokens.grads(params, b)
    assert float(m["token_filter/kept_fraction"]) == 1.0
    for a, w in zip(jax.tree_util.tree_leaves(g_all), jax.tree_util.tree_leaves(g_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-5, atol=1e-8)
    some = make_learner(cfg, dict(stepped["rl"], token_filter={"name": "top_entropy", "fraction": 0.2}), params)
    g_some, m = some.grads(params, b)
    assert 0.15 < float(m["token_filter/kept_fraction"]) < 0.3
    assert any(not np.allclose(np.asarray(a), np.asarray(w), rtol=1e-5, atol=1e-8)
               for a, w in zip(jax.tree_util.tree_leaves(g_some), jax.tree_util.tree_leaves(g_plain)))
