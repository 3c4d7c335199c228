"""Shared model fixtures for tests/serve/test_serve_*.py (not collected: no test_ prefix).

The tiny preset (random init) turned into a bigram machine so that greedy decoding is fully
predictable: every layer's output projections are zeroed (the residual stream is the token
embedding), the embeddings of the "previous" tokens are orthogonal basis vectors and the LM head
maps each to its successor.
* `bigram_params(cfg, fmt)`: from the assistant header it emits ``Let me check`` and one call
  ``functions.read_lints:0`` with ``{}`` arguments, then ``<|im_end|>`` (`chain_ids`).
* `loop_params(cfg, fmt)`: from the assistant header it alternates two text tokens forever (never
  a stop token), for requests that must still be generating when their client leaves.
"""
from __future__ import annotations

import numpy as np

CONTENT = "Let me check"  # text before the call: exercises streamed content deltas


def chain_ids(fmt) -> list[int]:
    tok = fmt.tok
    return [*tok.encode(CONTENT), fmt.calls_begin, fmt.call_begin, *tok.encode("functions.read_lints:0"), fmt.call_arg,
            *tok.encode("{}"), fmt.call_end, fmt.calls_end, fmt.im_end]


def _successor_params(cfg, prev: list[int], out: list[int], seed: int = 0):
    import jax

    from c2jax.model import init

    p = jax.tree.map(np.asarray, init(cfg, jax.random.key(seed)))
    p = jax.tree.map(np.array, p)  # writable copies
    for grp in ("dense_layers", "moe_layers"):
        p[grp]["attn"]["o_proj"]["kernel"][:] = 0
    p["dense_layers"]["mlp"]["down_proj"]["kernel"][:] = 0
    p["moe_layers"]["moe"]["experts"]["down_proj"][:] = 0
    p["moe_layers"]["moe"]["shared"]["down_proj"]["kernel"][:] = 0
    assert len(set(prev)) == len(prev), "previous tokens must be distinct for a bigram machine"
    D = cfg.hidden_size
    emb, head = p["embed"]["embedding"], p["lm_head"]["kernel"]
    head[:] = 0
    for i, (a, b) in enumerate(zip(prev, out)):
        emb[a] = 0
        emb[a, i] = 1.0
        head[i, b] = 50.0 / np.sqrt(D)  # rms-normed one-hot has norm sqrt(D): logit 50
    return p


def bigram_params(cfg, fmt, seed: int = 0):
    out = chain_ids(fmt)
    return _successor_params(cfg, [fmt.im_middle] + out[:-1], out, seed)


def loop_params(cfg, fmt, seed: int = 0):
    a, b = fmt.tok.encode("x")[0], fmt.tok.encode("y")[0]
    return _successor_params(cfg, [fmt.im_middle, a, b], [a, b, a], seed)
