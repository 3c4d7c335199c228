"""The engine/learner-backed claim probes (c2jax.workflow.rl_probes) on the smoke model shape, with
controls: a near-zero learning rate changes (almost) no bf16 weight while larger ones change more;
without weight drift the learner matches the sampler at every position; held updates give flat
staleness, in-flight ones a falling staleness. Slow (compiles of the engine and the learner)."""
from __future__ import annotations

import numpy as np
import pytest

from c2jax.workflow.rl_probes import inflight_mismatch, learner_bf16_deltas

pytestmark = pytest.mark.slow


def test_learner_bf16_delta_share_grows_with_the_learning_rate():
    small = dict(steps=2, prompts=2, group_size=2, new_tokens=8)
    tiny, mid = (learner_bf16_deltas(lr, 0, **small) for lr in (1e-9, 1e-4))
    for r in (tiny, mid):
        assert len(r["rows"]) == 2 and all(np.isfinite(x["loss"]) and x["update_norm"] > 0 for x in r["rows"])
    share = {k: np.mean([x["changed_bf16"] for x in r["rows"]]) for k, r in (("tiny", tiny), ("mid", mid))}
    # 1e-9 moves only weights that are (near) zero in bf16; 1e-4 moves a large share of them
    assert share["tiny"] < 0.02 and share["mid"] > 5 * share["tiny"] and share["mid"] < 1.0
    with pytest.raises(ValueError, match="lr"):
        learner_bf16_deltas(0.0, 0, steps=1)


def test_inflight_staleness_and_mismatch_by_position():
    kw = dict(new_tokens=16, update_every=4, rollouts=4)
    on, off = inflight_mismatch(0, True, **kw), inflight_mismatch(0, False, **kw)
    # quarter i was sampled by version i; the learner scores at V = 4
    assert on["staleness"] == [4.0, 3.0, 2.0, 1.0] and off["staleness"] == [4.0] * 4
    assert on["mismatch"][-1] < on["mismatch"][0]
    control = inflight_mismatch(0, True, drift=0.0, **kw)  # no policy change: only numerics remain
    assert max(control["mismatch"]) < 0.1 * on["mismatch"][0]
    with pytest.raises(ValueError, match="multiple"):
        inflight_mismatch(0, True, new_tokens=10, update_every=4)
