"""The delta path into the real sampling engine: `WeightSync` in ``delta`` mode delivers rebuilt,
hash-verified weights through ``Engine.update_weights``; greedy output then equals an engine built
directly on the new weights, and the engine reports the published version. Slow: the engine
compiles its prefill / decode steps."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from c2jax.sampling import Engine, Request, SamplingParams
from c2jax.sync import WeightSync
from _sampling_common import CFG, ENGINE_CFG, random_prompts, tiny_params


def _greedy(eng: Engine, prompts) -> list[list[int]]:
    reqs = [Request(p, SamplingParams(temperature=0.0, max_new_tokens=8), id=str(i)) for i, p in enumerate(prompts)]
    res = eng.generate(reqs)
    assert all(len(set(np.asarray(r.versions).tolist())) == 1 and r.versions[0] == eng.version for r in res)
    return [list(r.tokens) for r in res]


@pytest.mark.slow
def test_delta_weight_sync_reaches_the_engine_bit_exact():
    old, new = tiny_params(0, 4.0), tiny_params(1, 4.0)
    prompts = random_prompts(np.random.default_rng(3), [7, 12])
    reference = _greedy(Engine(new, CFG, ENGINE_CFG, version=5), prompts)
    # as the rl stage runs it: an update drops the prefix cache's stale KV (else reused prompts keep
    # the old weights' KV and their old version, by design)
    eng = Engine(old, CFG, dataclasses.replace(ENGINE_CFG, recompute_cache_on_update=True), version=0)
    before = _greedy(eng, prompts)
    assert before != reference  # control: the two weight sets sample differently
    sync = WeightSync(eng, {"mode": "delta", "full_every": 2})
    sync.publish(old, 4)   # full snapshot
    sync.publish(new, 5)   # XOR delta against version 4
    assert sync.wait() == 5
    m = sync.metrics()
    assert m["weight_sync/is_full"] == 0.0 and m["weight_sync/version"] == 5.0
    after = _greedy(eng, prompts)
    assert eng.version == 5 and after == reference
    sync.close()


def test_a_bf16_wire_needs_a_bf16_engine_and_engine_params_gives_it():
    """``wire_dtype='bfloat16'``: the rebuilt bf16 weights are refused by an engine holding f32 (the
    control: what the RL stage did before), and accepted by one built from `engine_params`."""
    import jax
    import jax.numpy as jnp

    from c2jax.sync.engine_sync import engine_params

    params = tiny_params(0, 4.0)
    cfg = {"mode": "delta", "full_every": 4, "wire_dtype": "bfloat16"}
    cast = engine_params(params, cfg)
    dts = {x.dtype for x in jax.tree_util.tree_leaves(cast) if jnp.issubdtype(x.dtype, jnp.floating)}
    assert dts == {jnp.dtype("bfloat16")}
    assert engine_params(params, {"mode": "direct", "wire_dtype": "bfloat16"}) is params
    assert engine_params(params, {"mode": "delta"}) is params

    f32_engine = Engine(params, CFG, ENGINE_CFG, version=0)
    sync = WeightSync(f32_engine, cfg)
    sync.publish(params, 1)
    with pytest.raises(ValueError, match="does not match the engine's model"):
        sync.wait()
    sync.close()

    eng = Engine(cast, CFG, ENGINE_CFG, version=0)
    sync = WeightSync(eng, cfg)
    sync.publish(params, 1)
    sync.publish(jax.tree_util.tree_map(lambda x: x * 1.01 if jnp.issubdtype(x.dtype, jnp.floating) else x, params), 2)
    assert sync.wait() == 2
    sync.close()
