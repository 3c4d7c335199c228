"""The embedded inference service's health check (`engine_health.SupervisedEngine`) on the real
sampling engine (tiny model): once the engine's scheduler thread dies, its requests never finish
(the control), the health check sees it, and `replace` starts an engine with the latest published
weights at that version, fails the dead engine's requests with `EngineLost`, and serves new
requests exactly as a fresh engine with those weights does. A caller that cancels its request does
not take the engine down."""
from __future__ import annotations

import concurrent.futures as cf
import time

import jax
import numpy as np
import pytest

from _async_rl_common import tiny_model
from _async_rl_faults import kill_engine
from c2jax.sampling import Engine, EngineConfig
from c2jax.sampling.types import Request, SamplingParams
from c2jax.train.async_rl.engine_health import EngineLost, SupervisedEngine

pytestmark = [pytest.mark.timeout(1800),  # the killed engine thread's exception is the point, not a warning
              pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]


def _req(i: int, n: int = 6) -> Request:
    return Request(prompt=[5, 7, 11, i], params=SamplingParams(temperature=1.0, max_new_tokens=n, seed=i), id=f"r{i}")


def _wait(cond, timeout: float = 600.0) -> None:  # generous: a loaded machine, not a result
    t_end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < t_end, "condition not reached"
        time.sleep(0.01)


def test_dead_engine_is_replaced_with_the_latest_weights_and_its_requests_fail():
    cfg, params = tiny_model()
    ecfg = EngineConfig(max_slots=2, max_len=64)
    handle = SupervisedEngine(Engine(params, cfg, ecfg), params=params, version=0).start()
    try:
        assert handle.submit(_req(0)).result(timeout=600).tokens.size > 0 and handle.healthy()
        newer = jax.tree_util.tree_map(lambda x: x * 1.01, params)
        handle.update_weights(newer, 3)
        _wait(lambda: handle.version == 3)

        kill_engine(handle)
        stuck = handle.submit(_req(1))  # the engine's loop wakes for it and dies
        _wait(lambda: not handle.healthy())
        with pytest.raises(cf.TimeoutError):  # control: a dead engine's requests never finish by themselves
            stuck.result(timeout=0.5)

        handle.replace()
        with pytest.raises(EngineLost, match="r1"):
            stuck.result(timeout=60)
        assert handle.healthy() and handle.version == 3 and handle.replacements == 1 and handle.failed_requests == 1
        got = handle.submit(_req(2)).result(timeout=600)
    finally:
        handle.close_replacements()
        handle.original.shutdown()
    want = Engine(newer, cfg, ecfg).generate([_req(2)])[0]
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)
    assert set(got.versions[got.prompt_len:].tolist()) == {3}


def test_a_cancelled_request_does_not_end_the_engine():
    cfg, params = tiny_model()
    handle = SupervisedEngine(Engine(params, cfg, EngineConfig(max_slots=2, max_len=256)), params=params,
                              version=0).start()
    try:
        fut = handle.submit(_req(3, n=200))
        _wait(lambda: handle.current.has_work())
        assert fut.cancel()
        _wait(lambda: not handle.current.has_work())  # the engine finished the cancelled request
        assert handle.healthy()
        assert handle.submit(_req(4)).result(timeout=600).tokens.size > 0
    finally:
        handle.original.shutdown()
