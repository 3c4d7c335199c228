"""Engine correctness on the tiny preset (f32): greedy == teacher-forced argmax, raw logprobs,
routes replay, continuous-batching joins, prefix reuse, seeds, stops, bad input, async forms."""
import asyncio
import dataclasses

import numpy as np
import pytest

from c2jax.sampling import Engine, Request, SamplingParams
from _sampling_common import (CFG, ENGINE_CFG, check_greedy_and_logprobs, forward, log_softmax,
                                random_prompts, tiny_params)


@pytest.fixture(scope="module")
def params():
    return tiny_params(0, 4.0)


def _greedy(n, **kw):
    return SamplingParams(temperature=0.0, max_new_tokens=n, **kw)


def test_greedy_matches_forward_across_joins(params):
    """6 requests of mixed lengths on 4 slots: later ones join while others are mid-decode.
    min_window 64: rows cross from the 64- to the 128-position attention window."""
    eng = Engine(params, CFG, dataclasses.replace(ENGINE_CFG, min_window=64))
    rng = np.random.default_rng(0)
    lens, news = [5, 40, 17, 3, 70, 9], [12, 5, 25, 3, 8, 30]
    reqs = [Request(p, _greedy(m), id=str(i)) for i, (p, m) in enumerate(zip(random_prompts(rng, lens), news))]
    res = eng.generate(reqs)
    assert [r.id for r in res] == [str(i) for i in range(6)]
    for r, m in zip(res, news):
        assert r.finish_reason == "length" and len(r.output_tokens) == m
        check_greedy_and_logprobs(params, r)
        assert r.routes.shape == (len(r.tokens), CFG.n_moe_layers, CFG.moe.top_k)
        assert (r.versions == 0).all() and (r.route_versions == 0).all()
    # joins happened: fewer decode steps than running the two waves back to back
    assert eng.stats["decode_steps"] < sum(sorted(news)[-2:]) + 10 + 4


def test_routes_replay_reproduces_logits(params):
    eng = Engine(params, CFG, ENGINE_CFG)
    rng = np.random.default_rng(1)
    r = eng.generate([Request(random_prompts(rng, [23])[0], SamplingParams(temperature=1.0, max_new_tokens=20, seed=3))])[0]
    free = forward(params, r.tokens)
    replay = forward(params, r.tokens, routes=r.routes)
    np.testing.assert_allclose(replay["logits"], free["logits"], atol=1e-5, rtol=0)
    P = r.prompt_len
    lp = log_softmax(replay["logits"][P - 1:-1])[np.arange(len(r.output_tokens)), r.output_tokens]
    np.testing.assert_allclose(r.raw_logprobs, lp, atol=1e-4, rtol=0)


def test_prefix_reuse_multi_turn_and_cross_slot(params):
    eng = Engine(params, CFG, ENGINE_CFG)
    rng = np.random.default_rng(2)
    r1 = eng.generate([Request(random_prompts(rng, [30])[0], _greedy(10), id="t1")])[0]
    # turn 2 resends the whole history plus a tool output
    turn2 = list(r1.tokens) + random_prompts(rng, [7])[0]
    before = eng.stats["prefill_tokens"]
    r2 = eng.generate([Request(turn2, _greedy(8), id="t2")])[0]
    assert r2.reused_prefix_len == len(r1.tokens)
    assert eng.stats["prefill_tokens"] - before == 7
    check_greedy_and_logprobs(params, r2)
    np.testing.assert_array_equal(r2.routes[: len(r1.tokens)], r1.routes)
    # cross-slot: B shares A's prompt while A is still running in another slot -> device copy
    a = eng.add_request(Request(random_prompts(rng, [25])[0], _greedy(30), id="A"))
    for _ in range(3):
        eng.step()
    b = eng.add_request(Request(list(a.prompt) + a.gen[:2] + [5, 6, 7], _greedy(6), id="B"))
    copies = eng.stats["prefix_copies"]
    while eng.has_work():
        eng.step()
    assert eng.stats["prefix_copies"] == copies + 1
    assert b.result.reused_prefix_len == len(a.prompt) + 2
    check_greedy_and_logprobs(params, a.result)
    check_greedy_and_logprobs(params, b.result)


def test_seed_determinism_independent_of_batch_slot_and_arrival(params):
    rng = np.random.default_rng(3)
    prompts = random_prompts(rng, [11, 19, 6, 14, 8])
    sp = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=15, seed=100 + i) for i in range(5)]
    alone = Engine(params, CFG, ENGINE_CFG).generate([Request(prompts[0], sp[0])])[0]
    # different batch composition, arrival order and slot (two others first, one arrives later)
    eng = Engine(params, CFG, ENGINE_CFG)
    eng.add_request(Request(prompts[3], sp[3]))
    eng.add_request(Request(prompts[4], sp[4]))
    eng.step(); eng.step()
    s0 = eng.add_request(Request(prompts[0], sp[0]))
    eng.add_request(Request(prompts[1], sp[1]))
    while eng.has_work():
        eng.step()
    assert s0.slot != 0 or True
    np.testing.assert_array_equal(s0.result.tokens, alone.tokens)
    np.testing.assert_allclose(s0.result.logprobs, alone.logprobs, atol=1e-5)
    assert (alone.logprobs <= 0).all() and (alone.logprobs >= alone.raw_logprobs - 1e-5).any()
    # a different seed gives a different continuation
    other = Engine(params, CFG, ENGINE_CFG).generate([Request(prompts[0], SamplingParams(
        temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=15, seed=999))])[0]
    assert not np.array_equal(other.tokens, alone.tokens)


def _byte_table():
    """Synthetic byte-level vocabulary where many tokens hold partial UTF-8 characters:
    'X' + lead bytes of a 3-byte char, its continuation byte, or ASCII letters."""
    table = []
    for i in range(CFG.vocab_size):
        kind = i % 4
        if kind == 0:
            table.append(b"\xe4\xb8")  # first two bytes of U+4E2D '中'
        elif kind == 1:
            table.append(b"\xad")  # its last byte
        else:
            table.append(bytes([97 + i % 26]))
    return table


def test_stop_strings_on_bytes_and_stop_tokens(params):
    table = _byte_table()
    eng = Engine(params, CFG, ENGINE_CFG, tokenizer=table)
    rng = np.random.default_rng(4)
    prompt = random_prompts(rng, [10])[0]
    sp = dict(temperature=1.0, max_new_tokens=60, seed=7)
    base = eng.generate([Request(prompt, SamplingParams(**sp))])[0]
    out = list(base.output_tokens)
    stream = b"".join(table[t] for t in out)
    assert base.text == stream.decode("utf-8", errors="replace")
    # first '中' completed across two tokens: the stop string starts inside a token
    target = "中".encode()
    at = stream.find(target)
    assert at > 0, "the sampled stream should contain a split character"
    ends = np.cumsum([len(table[t]) for t in out])
    k = int(np.searchsorted(ends, at + len(target)))  # token completing the stop
    r = eng.generate([Request(prompt, SamplingParams(**sp, stop_strings=("中",)))])[0]
    assert r.finish_reason == "stop_string" and r.stop == "中"
    assert r.text == stream[:at].decode("utf-8", errors="replace")
    np.testing.assert_array_equal(r.output_tokens, out[: k + 1])
    r_inc = eng.generate([Request(prompt, SamplingParams(**sp, stop_strings=("中",), include_stop_str=True))])[0]
    assert r_inc.text.endswith("中") and len(r_inc.text) == len(r.text) + 1
    # U+FFFD never occurs as bytes: partial characters must not fake it
    r_f = eng.generate([Request(prompt, SamplingParams(**sp, stop_strings=("\ufffd",)))])[0]
    assert r_f.finish_reason == "length" and len(r_f.output_tokens) == 60
    # stop token id: ends at the first occurrence, kept in tokens, not in text
    stop_id = out[5]
    first = out.index(stop_id)
    r_t = eng.generate([Request(prompt, SamplingParams(**sp, stop_token_ids=(stop_id,)))])[0]
    assert r_t.finish_reason == "stop_token" and r_t.stop == stop_id
    np.testing.assert_array_equal(r_t.output_tokens, out[: first + 1])


def test_bad_requests_rejected_others_continue(params):
    eng = Engine(params, CFG, ENGINE_CFG)
    good = Request([1, 2, 3], _greedy(4), id="good")
    bad = [
        (Request([], _greedy(4), id="empty"), "empty prompt"),
        (Request(list(range(1, 200)), _greedy(4), id="long"), "too long"),
        (Request([1, CFG.vocab_size + 3], _greedy(4), id="unk"), "unknown token id"),
        (Request([1, -1], _greedy(4), id="neg"), "unknown token id"),
        (Request([1, 2], SamplingParams(temperature=-1.0), id="temp"), "temperature"),
        (Request([1, 2], SamplingParams(top_p=0.0), id="top_p"), "top_p"),
        (Request([1, 2], SamplingParams(top_k=-2), id="top_k"), "top_k"),
        (Request([1, 2], SamplingParams(max_new_tokens=0), id="max"), "max_new_tokens"),
        (Request([1, 2], SamplingParams(stop_strings=("x",)), id="nostr"), "tokenizer"),
    ]
    res = eng.generate([bad[0][0], good] + [b for b, _ in bad[1:]])
    assert res[1].ok and len(res[1].output_tokens) == 4
    check_greedy_and_logprobs(params, res[1])
    for r, (_, msg) in zip([res[0]] + res[2:], bad):
        assert not r.ok and r.finish_reason == "error" and msg in str(r.error), (r.id, r.error)


def test_stream_submit_and_async(params):
    eng = Engine(params, CFG, ENGINE_CFG)
    rng = np.random.default_rng(5)
    prompts = random_prompts(rng, [7, 12])
    reqs = [Request(p, _greedy(6), id=str(i)) for i, p in enumerate(prompts)]
    events = list(eng.stream(reqs))
    done = {e.request_id: e.result for e in events if e.result is not None}
    toks = {i: [e.token for e in events if e.request_id == i and e.token is not None] for i in "01"}
    for i in "01":
        assert toks[i] == list(done[i].output_tokens)
    eng.start()
    try:
        fut = eng.submit(reqs[0])
        assert list(fut.result(timeout=120).tokens) == list(done["0"].tokens)
        async def two():
            return await asyncio.gather(eng.agenerate(reqs[0]), eng.agenerate(reqs[1]))
        a, b = asyncio.run(two())
        assert list(b.tokens) == list(done["1"].tokens) and list(a.tokens) == list(done["0"].tokens)
    finally:
        eng.shutdown()


def test_cancelled_future_does_not_kill_the_engine_loop(params):
    """A caller cancelling its future (asyncio cancelling `agenerate`) must not stop the scheduler
    thread: before the fix, finishing that request raised InvalidStateError in the loop."""
    eng = Engine(params, CFG, dataclasses.replace(ENGINE_CFG, max_slots=1))  # "next" runs after "gone"
    rng = np.random.default_rng(6)
    p0, p1 = random_prompts(rng, [9, 11])
    eng.start()
    try:
        fut = eng.submit(Request(p0, _greedy(24), id="gone"))
        assert fut.cancel()
        res = eng.submit(Request(p1, _greedy(6), id="next")).result(timeout=60)
        assert len(res.output_tokens) == 6 and eng._thread is not None and eng._thread.is_alive()
    finally:
        eng.shutdown()


def test_submit_and_start_do_not_wait_for_a_running_step(params):
    """While a decode step runs (held here inside `_decode`), `submit`, `start` and
    `update_weights` return at once: an agent harness's event loop must not stall for a step.
    Control: `cancel`, which edits the rows, does wait for the step, so the step really holds the
    engine's lock while it is held here (on the engine before the inbox, `submit` waited too)."""
    import threading
    eng = Engine(params, CFG, ENGINE_CFG)
    rng = np.random.default_rng(7)
    p0, p1 = random_prompts(rng, [9, 13])
    want = eng.generate([Request(p0, _greedy(8), id="a"), Request(p1, _greedy(5), id="b")])
    inside, release = threading.Event(), threading.Event()
    decode = eng._decode

    def held_decode(events):
        inside.set()
        assert release.wait(60)
        decode(events)

    eng._decode = held_decode
    eng.start()
    try:
        fut_a = eng.submit(Request(p0, _greedy(8), id="a"))
        assert inside.wait(60)  # the loop is inside a step that holds the engine lock
        got = {}

        def call(name, fn):
            got[name] = fn()

        threads = {"submit": threading.Thread(target=call, args=("submit", lambda: eng.submit(
                       Request(p1, _greedy(5), id="b")))),
                   "start": threading.Thread(target=call, args=("start", eng.start)),
                   "update": threading.Thread(target=call, args=("update", lambda: eng.update_weights(params, 0))),
                   "cancel": threading.Thread(target=call, args=("cancel", lambda: eng.cancel("nobody")))}
        for t in threads.values():
            t.start()
        for name in ("submit", "start", "update"):
            threads[name].join(30)
            assert not threads[name].is_alive() and name in got, f"{name} waited for the running step"
        threads["cancel"].join(0.5)
        assert threads["cancel"].is_alive() and "cancel" not in got  # control: the step holds the lock
        assert [s.req.id for s in eng.unfinished()] == ["b", "a"]  # inbox first, then the running row
        release.set()
        threads["cancel"].join(30)
        assert got["cancel"] is False
        res_a, res_b = fut_a.result(timeout=120), got["submit"].result(timeout=120)
        assert list(res_a.tokens) == list(want[0].tokens) and list(res_b.tokens) == list(want[1].tokens)
        assert eng.unfinished() == [] and eng.stats["weight_updates"] == 1
    finally:
        release.set()
        eng.shutdown()


def test_config_section_validated_and_builds_engine(params):
    import ml_collections
    from c2jax.config import ConfigError, validate
    from c2jax.sampling.config import engine_from_config, sampling_config_dict

    cfg = ml_collections.ConfigDict({"model": CFG.to_config_dict(),
                                     "sampling": sampling_config_dict(max_slots=2, max_len=64)})
    validate(cfg)
    eng = engine_from_config(cfg, params)
    assert eng.config.max_slots == 2 and eng.run_cfg.moe.precision == CFG.moe.precision
    bad = ml_collections.ConfigDict({"model": CFG.replace(mtp_depth=0).to_config_dict(),
                                     "sampling": sampling_config_dict(max_slots=0, prefill_chunk=24,
                                                                      moe_impl="capacity", spec_decode=True)})
    with pytest.raises(ConfigError) as e:
        validate(bad)
    msg = str(e.value)
    for key in ("sampling.max_slots", "sampling.prefill_chunk", "sampling.moe_impl", "sampling.spec_decode"):
        assert key in msg, msg


def test_batch1_skips_unchosen_experts_exactly(params):
    """max_slots 1: the all-experts kernel uses the split layout and skips experts no token chose."""
    eng = Engine(params, CFG, dataclasses.replace(ENGINE_CFG, max_slots=1))
    assert "gate_up_e" in eng.params["moe"][0]["moe"]["experts"]
    rng = np.random.default_rng(6)
    for r in eng.generate([Request(p, _greedy(10)) for p in random_prompts(rng, [5, 12])]):
        check_greedy_and_logprobs(params, r)
