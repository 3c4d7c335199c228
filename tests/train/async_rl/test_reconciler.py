"""The reconciler and the sample ledger, driven by the discrete-event model (virtual time, lognormal
heavy-tailed latencies, lengths drawn independently of the policy): the staleness bound holds on
every token, admission does not bias training toward short rollouts (with the naive rule as the
positive control, which does), partial groups never train, lost workers are retried then dropped
with a reason, and the ledger refuses a repeated sample."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from c2jax.train.async_rl.ledger import LedgerError, SampleLedger
from c2jax.train.async_rl.reconciler import Reconciler
from c2jax.train.async_rl.simulate import SimConfig, simulate, simulate_sync


def _mean_ci(x: np.ndarray, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = rng.choice(x, size=(n, x.size), replace=True).mean(1)
    return float(np.quantile(means, 0.005)), float(np.quantile(means, 0.995))


@pytest.mark.parametrize("s", [0, 1, 3])
def test_staleness_never_beyond_the_bound_and_nothing_dropped(s):
    c = SimConfig(steps=40, batch_groups=4, group_size=4, max_staleness=s, seed=s)
    r = simulate(c)
    assert max(r.staleness) <= s
    if s > 0:
        assert max(r.staleness) >= 1  # the bound is used, not trivially met by a synchronous schedule
    assert r.drops == {}
    assert r.ledger["trained"] == c.steps * c.batch_groups * c.group_size and r.ledger["open"] == {}


def test_admission_does_not_bias_training_toward_short_rollouts():
    c = SimConfig(steps=80, batch_groups=4, group_size=4, max_staleness=1, max_running=8, len_sigma=1.0, seed=3)
    pop_mean = float(np.exp(c.len_mu + c.len_sigma ** 2 / 2))  # lognormal mean (lengths are ceil'ed: +<1)
    bounded = simulate(c)
    lo, hi = _mean_ci(bounded.trained_lengths)
    assert lo <= bounded.completed_lengths.mean() <= hi
    assert lo <= pop_mean + 0.5 <= hi
    # Same quantiles as every completed rollout (the tail is trained, not dropped).
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(bounded.trained_lengths, q) == pytest.approx(np.quantile(bounded.completed_lengths, q),
                                                                        rel=0.05)
    # Positive control: the naive rule (start whenever a worker is free, drop stale groups at
    # training time) drops the slow rollouts, and the long ones are the slow ones.
    naive = simulate(SimConfig(**{**c.__dict__, "admission": "unbounded"}))
    assert naive.drops.get("stale", 0) > 10
    lo_n, hi_n = _mean_ci(naive.trained_lengths)
    assert hi_n < naive.completed_lengths.mean() and hi_n < pop_mean


def test_async_overlaps_rollouts_and_training_and_staleness_0_is_synchronous():
    c = SimConfig(steps=40, batch_groups=4, group_size=4, max_staleness=0, seed=1)
    sync = simulate_sync(c)
    on_policy = simulate(c)
    assert on_policy.wall == pytest.approx(sync.wall, rel=1e-3)  # the same schedule
    off = simulate(SimConfig(**{**c.__dict__, "max_staleness": 2}))
    assert off.wall < 0.9 * sync.wall and off.trainer_idle_fraction < sync.trainer_idle_fraction


def test_inflight_updates_give_later_tokens_newer_versions():
    c = SimConfig(steps=30, batch_groups=2, group_size=2, max_staleness=2, s_per_token=0.05, env_sigma=0.3, seed=2)
    with_updates = simulate(c)
    without = simulate(SimConfig(**{**c.__dict__, "inflight_updates": False}))
    # Without in-flight updates a rollout runs on the version it started with; with them, tokens
    # generated after a publish carry the newer version, so fewer tokens are old.
    old = lambda r: sum(n for lag, n in r.staleness.items() if lag >= 1) / sum(r.staleness.values())  # noqa: E731
    assert old(with_updates) < old(without)
    assert max(with_updates.staleness) <= 2 and max(without.staleness) <= 2


def _samples(n, version=0, masked=()):
    seg = types.SimpleNamespace(policy_versions=[version, version], loss_mask=[1, 1])
    return [types.SimpleNamespace(trajectory=types.SimpleNamespace(segments=[seg]),
                                  mask_reason="infra:sandbox" if i in masked else None) for i in range(n)]


def test_partial_groups_never_train_and_masked_samples_are_dropped_with_their_reason():
    rec = Reconciler(batch_groups=1, group_size=3, max_staleness=0)
    slot = rec.admit("t0", 0)
    rec.started(slot)
    with pytest.raises(ValueError, match="partial groups never train"):
        rec.completed(slot, _samples(2))
    assert rec.take(0) is None
    rec.completed(slot, _samples(3, masked=(1,)))
    (got,) = rec.take(0)
    rec.trained([got], step=1, version=0)
    summary = rec.ledger.summary()
    assert summary["trained"] == 2 and summary["dropped"] == {"masked:infra:sandbox": 1}
    rec.ledger.check_complete()


def test_lost_worker_is_retried_then_dropped_and_a_replacement_joins_the_same_batch():
    rec = Reconciler(batch_groups=2, group_size=2, max_staleness=1, max_retries=1)
    a, b = rec.admit("t0", 0), rec.admit("t1", 0)
    c = rec.admit("t2", 0)  # batch 1 (staleness 1 lets it start on version 0)
    assert (a.batch, b.batch, c.batch) == (0, 0, 1)
    rec.started(a)
    assert rec.lost(a, "worker died") is True  # retried: same ids, same seeds
    assert rec.ledger.state(a.sample_ids[0]) == "queued"
    rec.started(a)
    assert rec.lost(a, "worker died again") is False
    assert rec.ledger.summary()["dropped"] == {"worker_lost": 2}
    d = rec.admit("t3", 0)
    assert d.batch == 0  # the freed place in batch 0
    for s in (b, d):
        rec.started(s)
        rec.completed(s, _samples(2))
    got = rec.take(0)
    assert [s.task for s in got] == ["t1", "t3"]
    rec.trained(got, 1, 0)
    rec.drain("run_ended")
    rec.ledger.check_complete()
    assert rec.ledger.summary()["dropped"] == {"worker_lost": 2, "run_ended": 2}


def test_ledger_refuses_repeats_and_replays_from_disk(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = SampleLedger(str(path))
    led.queue(["a", "b"], group=0)
    led.move(["a", "b"], "rolling_out")
    with pytest.raises(LedgerError, match="only 'ready'"):
        led.trained(["a"], step=1, version=0)
    led.move(["a", "b"], "ready")
    led.trained(["a"], step=1, version=0)
    with pytest.raises(LedgerError, match="would be repeated"):
        led.trained(["a"], step=2, version=1)
    with pytest.raises(LedgerError, match="left in state 'ready'"):
        led.check_complete()
    with pytest.raises(ValueError, match="reason"):
        led.dropped(["b"], "")
    led.dropped(["b"], "stale")
    led.check_complete()
    with open(path, "a") as f:
        f.write('{"ev": "trained", "id": "b"')  # a torn last write (killed mid-append)
    again = SampleLedger.load(str(path))
    assert again.records == led.records
    snap = json.loads(json.dumps(led.snapshot()))
    assert SampleLedger.from_snapshot(snap).records == led.records
