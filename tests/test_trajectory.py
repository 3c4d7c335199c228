"""Trajectory record: validation names the bad field, JSON round trip, and pad_batch alignment."""
import json

import numpy as np
import pytest

from c2jax.batching import pad_batch
from c2jax.trajectory import (EFFORT_FIELDS, Effort, Segment, ToolEvent, Trajectory, TrajectoryError,
                              load_jsonl, save_jsonl)


def make_segment(prompt=(1, 2, 3), completion=(4, 5, 6, 7), mask=(1, 1, 0, 1), version=3, routes=None, raw=False):
    c = len(completion)
    logp = -0.1 * (np.arange(c) + 1)
    return Segment(prompt_ids=list(prompt), completion_ids=list(completion), loss_mask=list(mask),
                   behaviour_logprobs=logp.tolist(), policy_versions=[version] * c,
                   raw_logprobs=(logp * 0.9).tolist() if raw else None, routes=routes)


def make_traj(group="g0", task="t0", segments=None, **kw):
    return Trajectory(segments=segments or [make_segment()], task_id=task, group_id=group, **kw)


def test_valid_trajectory_summaries():
    t = make_traj(segments=[make_segment(), make_segment(prompt=(9,), completion=(8, 7), mask=(1, 1))],
                  reward_terms={"task": 1.0}, effort=Effort(thinking_tokens=5, tool_calls=1, turns=2),
                  tool_events=[ToolEvent(name="terminal", call_tokens=3, output_tokens=4)])
    assert t.num_policy_tokens == 3 + 2
    assert t.segments[0].num_positions == 6
    assert t.segments[0].loss_mask.dtype == np.bool_


@pytest.mark.parametrize("kwargs, field", [
    (dict(loss_mask=[1, 1, 0]), "segment.loss_mask"),
    (dict(behaviour_logprobs=[-0.1, -0.2]), "segment.behaviour_logprobs"),
    (dict(policy_versions=[0, 0, 0, 0, 0]), "segment.policy_versions"),
    (dict(behaviour_logprobs=[-0.1, float("nan"), -0.1, -0.1]), "segment.behaviour_logprobs"),
    (dict(behaviour_logprobs=[-0.1, 0.5, -0.1, -0.1]), "segment.behaviour_logprobs"),
    (dict(policy_versions=[0, -1, 0, 0]), "segment.policy_versions"),
    (dict(prompt_ids=[]), "segment.prompt_ids"),
    (dict(completion_ids=[[1, 2]]), "segment.completion_ids"),
    (dict(completion_ids=[1.5, 2, 3, 4]), "segment.completion_ids"),
    (dict(loss_mask=[0, 2, 1, 1]), "segment.loss_mask"),
    (dict(routes=np.zeros((5, 2, 2), np.int32)), "segment.routes"),
    (dict(routes=np.zeros((8, 2, 2), np.int32)), "segment.routes"),
    (dict(prompt_ids=None), "segment.prompt_ids"),
])
def test_segment_errors_name_the_field(kwargs, field):
    base = dict(prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6, 7], loss_mask=[1, 1, 0, 1],
                behaviour_logprobs=[-0.1] * 4, policy_versions=[0] * 4)
    base.update(kwargs)
    with pytest.raises(TrajectoryError) as e:
        Segment(**base)
    assert e.value.field == field
    assert str(e.value).startswith(field)


def test_masked_out_tokens_may_have_any_logprob():
    # Tool-output tokens (mask 0) were not sampled: their logprob slot is ignored (and JSON gets 0 there).
    seg = Segment(prompt_ids=[1], completion_ids=[2, 3], loss_mask=[1, 0], behaviour_logprobs=[-0.5, float("nan")],
                  policy_versions=[0, -1])
    t = Trajectory.from_json(make_traj(segments=[seg]).to_json())
    np.testing.assert_array_equal(t.segments[0].behaviour_logprobs, [-0.5, 0.0])


@pytest.mark.parametrize("kwargs, field", [
    (dict(task_id=""), "task_id"),
    (dict(group_id=None), "group_id"),
    (dict(segments=[]), "segments"),
    (dict(reward_terms={"task": "good"}), "reward_terms['task']"),
    (dict(effort=Effort(turns=-1)), "effort.turns"),
    (dict(tool_events=[ToolEvent(name="t", segment=3)]), "tool_events[0].segment"),
    (dict(infra_failed="no"), "infra_failed"),
])
def test_trajectory_errors_name_the_field(kwargs, field):
    base = dict(segments=[make_segment()], task_id="t", group_id="g")
    base.update(kwargs)
    with pytest.raises(TrajectoryError) as e:
        Trajectory(**base)
    assert e.value.field == field


def test_segment_index_in_error_and_route_consistency():
    good = make_segment(routes=np.zeros((7, 2, 2), np.int32))
    bad = make_segment(routes=np.zeros((7, 3, 2), np.int32))
    with pytest.raises(TrajectoryError, match=r"segments\[1\]\.routes"):
        make_traj(segments=[good, bad])
    with pytest.raises(TrajectoryError, match="segments.routes"):
        make_traj(segments=[good, make_segment()])
    seg = make_segment()
    seg.behaviour_logprobs = seg.behaviour_logprobs[:2]  # mutated after construction
    with pytest.raises(TrajectoryError, match=r"segments\[0\]\.behaviour_logprobs"):
        make_traj(segments=[seg])


def test_infra_failed_may_be_empty():
    t = Trajectory(segments=[], task_id="t", group_id="g", infra_failed=True)
    assert t.num_policy_tokens == 0


def test_json_round_trip(tmp_path):
    routes = np.arange(7 * 2 * 2, dtype=np.int32).reshape(7, 2, 2) % 5
    t = make_traj(segments=[make_segment(routes=routes, raw=True)], reward_terms={"task": 1.0, "nan_term": float("nan")},
                  effort=Effort(thinking_tokens=3, tool_output_tokens=2, turns=1),
                  tool_events=[ToolEvent(name="edit", malformed=True, ok=False, error="bad json")],
                  sample_id="s1", metadata={"trigger": 80})
    text = t.to_json()
    json.loads(text)  # strict JSON (no NaN literal)
    u = Trajectory.from_json(text)
    for a, b in zip(t.segments, u.segments):
        for name in ("prompt_ids", "completion_ids", "loss_mask", "behaviour_logprobs", "policy_versions", "raw_logprobs", "routes"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert u.reward_terms["task"] == 1.0 and np.isnan(u.reward_terms["nan_term"])
    assert u.effort == t.effort and u.tool_events == t.tool_events and u.metadata == t.metadata
    save_jsonl([t, u], str(tmp_path / "x.jsonl"))
    assert len(load_jsonl(str(tmp_path / "x.jsonl"))) == 2


def test_from_dict_missing_fields():
    d = make_traj().to_dict()
    del d["segments"][0]["behaviour_logprobs"]
    with pytest.raises(TrajectoryError) as e:
        Trajectory.from_dict(d)
    assert e.value.field == "segments[0].behaviour_logprobs"
    d = make_traj().to_dict()
    d["segments"][0]["loss_mask"] = [1]
    with pytest.raises(TrajectoryError) as e:
        Trajectory.from_dict(d)
    assert e.value.field == "segments[0].loss_mask"
    d = make_traj().to_dict()
    del d["group_id"]
    with pytest.raises(TrajectoryError, match="group_id"):
        Trajectory.from_dict(d)
    with pytest.raises(TrajectoryError, match="segments: must be a list"):
        Trajectory.from_dict(dict(make_traj().to_dict(), segments=None))
    with pytest.raises(TrajectoryError, match=r"segments\[0\]: must be an object"):
        Trajectory.from_dict(dict(make_traj().to_dict(), segments=[3]))
    with pytest.raises(TrajectoryError, match="invalid JSON"):
        Trajectory.from_json("{")


def test_pad_batch_alignment_and_packing():
    s0 = make_segment(prompt=(1, 2, 3), completion=(4, 5, 6, 7), mask=(1, 1, 0, 1), version=2)
    s1 = make_segment(prompt=(9,), completion=(8, 7), mask=(1, 1), version=5)
    s2 = make_segment(prompt=(11, 12), completion=(13,), mask=(1,), version=1)
    t0 = make_traj(segments=[s0, s1], group="a", reward_terms={"task": 1.0}, effort=Effort(turns=2))
    t1 = make_traj(segments=[s2], group="b", reward_terms={"task": 0.0, "style": -0.5}, infra_failed=False,
                   tool_events=[ToolEvent(name="x", malformed=True, ok=False), ToolEvent(name="y", ok=False)])
    b = pad_batch([t0, t1], max_len=10, max_trajectories=4, num_rows=3)
    assert b["tokens"].shape == (3, 10) and b["traj_valid"].shape == (4,)
    # Row 0 holds s0 (6 positions) then s1 (2 positions) by first fit; s2 (2 positions) also fits there.
    np.testing.assert_array_equal(b["segment_ids"][0], [1] * 6 + [2] * 2 + [3] * 2)
    np.testing.assert_array_equal(b["tokens"][0, :6], [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(b["targets"][0, :6], [2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(b["positions"][0], [0, 1, 2, 3, 4, 5, 0, 1, 0, 1])
    np.testing.assert_array_equal(b["loss_mask"][0, :6], [0, 0, 1, 1, 0, 1])
    np.testing.assert_allclose(b["behaviour_logp"][0, :6], [0, 0, -0.1, -0.2, 0, -0.4], rtol=1e-6)
    np.testing.assert_array_equal(b["versions"][0, :8], [-1, -1, 2, 2, -1, 2, 5, 5])
    np.testing.assert_array_equal(b["traj_index"][0], [0] * 8 + [1] * 2)
    assert (b["segment_ids"][1:] == 0).all() and (b["traj_index"][1:] == -1).all()
    np.testing.assert_array_equal(b["group_index"], [0, 1, -1, -1])
    np.testing.assert_array_equal(b["traj_valid"], [1, 1, 0, 0])
    np.testing.assert_array_equal(b["policy_tokens"][:2], [5, 1])
    assert np.isnan(b["reward_terms"]["style"][0]) and b["reward_terms"]["style"][1] == -0.5
    np.testing.assert_array_equal(b["tool_stats"]["malformed"][:2], [0, 1])
    np.testing.assert_array_equal(b["tool_stats"]["failed"][:2], [0, 1])
    assert set(b["effort"]) == set(EFFORT_FIELDS) and b["effort"]["turns"][0] == 2
    # The loss mask counts exactly the policy tokens of every trajectory.
    for i in range(2):
        assert b["loss_mask"][b["traj_index"] == i].sum() == b["policy_tokens"][i]
    # Without packing each segment takes its own row.
    u = pad_batch([t0, t1], max_len=10, pack=False)
    assert u["tokens"].shape == (3, 10) and (u["segment_ids"].max(axis=1) == 1).all()


def test_pad_batch_routes_and_errors():
    r = np.arange(7 * 2 * 2, dtype=np.int32).reshape(7, 2, 2)
    t = make_traj(segments=[make_segment(routes=r)])
    b = pad_batch([t], max_len=8)
    assert b["routes"].shape == (1, 8, 2, 2)
    np.testing.assert_array_equal(b["routes"][0, :6], r[:6])
    t_short = make_traj(segments=[make_segment(routes=r[:6])])  # without the never-fed final token
    np.testing.assert_array_equal(pad_batch([t_short], max_len=8)["routes"], b["routes"])
    with pytest.raises(ValueError, match=r"segments\[0\] needs 6 positions > max_len=5"):
        pad_batch([t], max_len=5)
    with pytest.raises(TrajectoryError, match="routes"):
        pad_batch([t, make_traj()], max_len=8)
    with pytest.raises(ValueError, match="num_rows=1"):
        pad_batch([make_traj(), make_traj()], max_len=8, num_rows=1)
    with pytest.raises(ValueError, match="max_trajectories=1"):
        pad_batch([make_traj(), make_traj()], max_len=8, max_trajectories=1)
    with pytest.raises(ValueError, match="min_group_size=2"):
        pad_batch([make_traj(group="a"), make_traj(group="b")], max_len=8, min_group_size=2)
    with pytest.raises(TrajectoryError, match=r"trajectories\[0\]"):
        pad_batch([{"segments": []}], max_len=8)


def test_routes_json_is_compact_and_checked():
    routes = (np.arange(7 * 4 * 2, dtype=np.int32).reshape(7, 4, 2) * 37) % 384  # > 255 experts -> uint16
    t = make_traj(segments=[make_segment(routes=routes)])
    d = t.to_dict()
    enc = d["segments"][0]["routes"]
    assert enc["dtype"] == "<u2" and enc["shape"] == [7, 4, 2]
    np.testing.assert_array_equal(Trajectory.from_dict(d).segments[0].routes, routes)
    d["segments"][0]["routes"] = [[[int(x) for x in r] for r in tok] for tok in routes]  # plain lists accepted too
    np.testing.assert_array_equal(Trajectory.from_dict(d).segments[0].routes, routes)
    d["segments"][0]["routes"] = dict(enc, b64="!!notbase64")
    with pytest.raises(TrajectoryError) as e:
        Trajectory.from_dict(d)
    assert e.value.field == "segments[0].routes"
    d["segments"][0]["routes"] = dict(enc, shape=[7, 4, 3])
    with pytest.raises(TrajectoryError, match=r"segments\[0\]\.routes"):
        Trajectory.from_dict(d)


from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def random_trajectories(draw):
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        segs = []
        for _ in range(draw(st.integers(1, 3))):
            p = draw(st.integers(1, 5))
            c = draw(st.integers(0, 8))
            mask = draw(st.lists(st.booleans(), min_size=c, max_size=c))
            segs.append(Segment(prompt_ids=draw(st.lists(st.integers(0, 99), min_size=p, max_size=p)),
                                completion_ids=draw(st.lists(st.integers(0, 99), min_size=c, max_size=c)),
                                loss_mask=mask, behaviour_logprobs=[-0.01 * (j + 1) for j in range(c)],
                                policy_versions=[i] * c))
        out.append(Trajectory(segs, task_id="t", group_id=f"g{draw(st.integers(0, 2))}"))
    return out


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(trajs=random_trajectories(), pack=st.booleans())
def test_pad_batch_reconstructs_every_segment(trajs, pack):
    """Property: from the padded arrays every segment's token sequence, loss mask and logprobs come back."""
    b = pad_batch(trajs, max_len=16, pack=pack)
    flat = [(i, s) for i, t in enumerate(trajs) for s in t.segments if s.num_tokens > 1]
    found = []
    for row in range(b["tokens"].shape[0]):
        for sid in range(1, b["segment_ids"][row].max() + 1):
            sel = b["segment_ids"][row] == sid
            assert np.all(np.diff(np.flatnonzero(sel)) == 1)  # contiguous
            np.testing.assert_array_equal(b["positions"][row][sel], np.arange(sel.sum()))
            seq = np.concatenate([b["tokens"][row][sel][:1], b["targets"][row][sel]])
            found.append((int(b["traj_index"][row][sel][0]), seq, b["loss_mask"][row][sel], b["behaviour_logp"][row][sel]))
    assert len(found) == len(flat)
    for i, s in flat:
        seq = np.concatenate([s.prompt_ids, s.completion_ids])
        match = [f for f in found if f[0] == i and len(f[1]) == len(seq) and np.array_equal(f[1], seq)]
        assert match
        _, _, m, lp = match[0]
        p = len(s.prompt_ids)
        np.testing.assert_array_equal(m[p - 1:], s.loss_mask)
        assert np.all(m[: p - 1] == 0)
        np.testing.assert_allclose(lp[p - 1:], np.where(s.loss_mask, s.behaviour_logprobs, 0))
    for i, t in enumerate(trajs):
        assert b["loss_mask"][b["traj_index"] == i].sum() == t.num_policy_tokens
    assert np.all(b["loss_mask"][b["segment_ids"] == 0] == 0)


def test_fit_row_length_minimises_padded_positions():
    """fit_row_length picks the cheapest row length (rows x length) among the multiples, checked by
    brute force; demonstration-like lengths (520-578 tokens) that fit one per 1024-token row get rows of 640."""
    from c2jax.batching import fit_row_length

    rng = np.random.default_rng(0)

    def trajs_of(lengths):
        return [make_traj(segments=[make_segment(prompt=[1] * (n - 3), completion=(4, 5, 6), mask=(1, 1, 1))])
                for n in lengths]

    demo_like = trajs_of([*rng.integers(520, 578, 49), 578])  # 578 tokens: 577 positions
    assert fit_row_length(demo_like, 1024) == 640
    assert fit_row_length(demo_like[:-1], 1024) == 576
    assert pad_batch(demo_like, 640)["tokens"].shape[0] == pad_batch(demo_like, 1024)["tokens"].shape[0] == 50
    for _ in range(20):
        trajs = trajs_of(rng.integers(4, 300, rng.integers(1, 12)))
        got = fit_row_length(trajs, 512, multiple=32)
        costs = {L: pad_batch(trajs, L)["tokens"].size for L in list(range(32, 513, 32)) + [512]
                 if L >= max(t.segments[0].num_positions for t in trajs)}
        best = min(costs.values())
        assert costs[got] == best and got == min(L for L, c in costs.items() if c == best)
    with pytest.raises(ValueError, match="max_len=100"):
        fit_row_length(trajs_of([200]), 100)
