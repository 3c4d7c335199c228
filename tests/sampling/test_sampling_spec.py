"""MTP speculative decoding: greedy output unchanged, drafts equal the model's MTP forward,
acceptance bookkeeping exercised with oracle drafts (a random model's MTP head rarely guesses
right, so the accept path is also driven by drafts taken from the known greedy continuation)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import apply
from c2jax.sampling import Engine, Request, SamplingParams
from _sampling_common import CFG, ENGINE_CFG, check_greedy_and_logprobs, random_prompts, tiny_params

SPEC = dataclasses.replace(ENGINE_CFG, spec_decode=True)


@pytest.fixture(scope="module")
def params():
    return tiny_params(0, 4.0)


def _reqs(seed=0):
    rng = np.random.default_rng(seed)
    lens, news = [5, 40, 17, 3, 9], [12, 5, 25, 3, 16]
    return [Request(p, SamplingParams(temperature=0.0, max_new_tokens=m), id=str(i))
            for i, (p, m) in enumerate(zip(random_prompts(rng, lens), news))]


@pytest.fixture(scope="module")
def plain(params):
    return Engine(params, CFG, ENGINE_CFG).generate(_reqs())


def test_spec_greedy_unchanged_and_drafts_match_mtp_forward(params, plain):
    eng = Engine(params, CFG, SPEC)
    seen = []  # (request id, position L+1 the draft guesses, draft)
    eng._spec.draft_override = lambda seq, pos: seen.append((seq.req.id, pos, int(eng._spec.draft[seq.slot])))
    res = eng.generate(_reqs())
    for a, b in zip(res, plain):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        check_greedy_and_logprobs(params, a)
    rate = eng.spec_acceptance_rate
    print(f"\nMTP acceptance rate (random tiny model): {rate:.3f} of {eng.stats['spec_proposed']} drafts")
    assert 0.0 <= rate <= 1.0 and eng.stats["spec_proposed"] > 20
    # every MTP draft == argmax of the model's own (uncached) MTP logits at position pos - 2
    by_id = {r.id: r for r in res}
    fwd = jax.jit(lambda p, t: apply(p, t, CFG)["mtp_logits"])
    checked = 0
    for rid, pos, d in seen:
        toks = np.zeros((128,), np.int32)  # right-padded: one compile; causal, so no effect
        toks[: len(by_id[rid].tokens)] = by_id[rid].tokens
        mtp = np.asarray(fwd(params, jnp.asarray(toks)[None]))[0, 0]  # [T, V]
        assert mtp[pos - 2].argmax() == d, (rid, pos)
        checked += 1
    assert checked == len(seen) > 0


def test_spec_accept_path_with_oracle_drafts(params, plain):
    truth = {r.id: r.tokens for r in plain}
    for wrong_every in (0, 2):
        eng = Engine(params, CFG, SPEC)
        calls = [0]

        def oracle(seq, pos):
            calls[0] += 1
            t = truth[seq.req.id]
            if pos >= len(t):
                return None
            if wrong_every and calls[0] % wrong_every == 0:
                return int((t[pos] + 1) % CFG.vocab_size)
            return int(t[pos])

        eng._spec.draft_override = oracle
        res = eng.generate(_reqs())
        for a, b in zip(res, plain):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.routes, b.routes)
            np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-4)
        rate = eng.spec_acceptance_rate
        if wrong_every == 0:
            assert rate > 0.95, rate
            assert eng.stats["decode_steps"] < 0.75 * sum(len(r.output_tokens) for r in res)
        else:
            assert 0.3 < rate < 0.7, rate


def test_spec_with_prefix_reuse_and_sampled_rows(params):
    eng = Engine(params, CFG, SPEC)
    rng = np.random.default_rng(7)
    r1 = eng.generate([Request(random_prompts(rng, [20])[0], SamplingParams(temperature=0.0, max_new_tokens=8))])[0]
    turn2 = list(r1.tokens) + random_prompts(rng, [5])[0]
    mixed = eng.generate([Request(turn2, SamplingParams(temperature=0.0, max_new_tokens=10)),
                          Request(random_prompts(rng, [6])[0], SamplingParams(temperature=1.0, max_new_tokens=10, seed=1))])
    assert mixed[0].reused_prefix_len == len(r1.tokens) - 1
    check_greedy_and_logprobs(params, mixed[0])
    ref = Engine(params, CFG, ENGINE_CFG).generate([Request(list(mixed[1].tokens[:6]), SamplingParams(
        temperature=1.0, max_new_tokens=10, seed=1))])[0]
    np.testing.assert_array_equal(mixed[1].tokens, ref.tokens)  # sampled rows: same draws as without spec
