"""Shared fixtures for the sampling tests: the tiny model, one engine shape (so compiled steps are
reused across tests) and a teacher-forced reference forward (the trainer's dropless f32 path)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import apply, init, preset
from c2jax.sampling import EngineConfig

CFG = preset("tiny").replace(**{"moe.impl": "dropless"})
ENGINE_CFG = EngineConfig(max_slots=4, max_len=128, prefill_chunk=32)


@functools.lru_cache(maxsize=4)
def tiny_params(seed: int = 0, scale: float = 1.0):
    """Tiny-preset parameters; `scale` > 1 sharpens the (otherwise nearly flat) random model so
    sampled continuations are varied but not uniform."""
    p = init(CFG, jax.random.key(seed))
    if scale != 1.0:
        p = jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, p)
    return p


@functools.lru_cache(maxsize=8)
def _fwd(cfg):
    return jax.jit(lambda p, t, r: apply(p, t, cfg, routes=r)), jax.jit(lambda p, t: apply(p, t, cfg))


def forward(params, tokens, routes=None, cfg=CFG, pad_to: int = 128) -> dict:
    """Teacher-forced full forward of one sequence -> dict of numpy arrays (batch axis dropped).

    The sequence is right-padded to `pad_to` (causal attention: padding does not change earlier
    positions) so one compile serves every length."""
    with_r, without = _fwd(cfg)
    n = len(tokens)
    L = max(pad_to, n)
    t = np.zeros((1, L), np.int32)
    t[0, :n] = tokens
    if routes is None:
        out = without(params, jnp.asarray(t))
    else:
        r = np.zeros((1, L) + np.asarray(routes).shape[1:], np.int32)
        r[0, :n] = routes
        r[0, n:] = np.arange(r.shape[-1])
        out = with_r(params, jnp.asarray(t), jnp.asarray(r))
    return {"logits": np.asarray(out["logits"][0, :n]), "routes": np.asarray(out["routes"][0, :n])}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def check_greedy_and_logprobs(params, res, atol: float = 1e-4) -> None:
    """Greedy tokens == argmax of the full forward; raw logprobs == its log-softmax (atol)."""
    assert res.ok, res.error
    out = forward(params, res.tokens)
    P, n = res.prompt_len, len(res.tokens)
    lg = out["logits"][P - 1:n - 1]
    gen = res.tokens[P:]
    np.testing.assert_array_equal(lg.argmax(-1), gen, err_msg=f"request {res.id}")
    ref = log_softmax(lg)[np.arange(len(gen)), gen]
    np.testing.assert_allclose(res.raw_logprobs, ref, atol=atol, rtol=0)
    np.testing.assert_array_equal(res.routes, out["routes"])


def random_prompts(rng, lengths, vocab=CFG.vocab_size):
    return [list(map(int, rng.integers(0, vocab, size=n))) for n in lengths]
