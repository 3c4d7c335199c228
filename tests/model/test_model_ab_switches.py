"""The model's A/B switches (module attributes that `benchmarks/model_step.py` rows
``jax-dropless@VARIANT`` flip at trace time) change how the step is computed, never what: the loss
and every gradient equal the default's. A switch that changed the result would make its timing row
meaningless, so each is checked here against the default on the same weights and tokens."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

SWITCHES = [
    ("c2jax.model.mla", "ATTN_BATCH_CHUNK", 1),
    ("c2jax.model.mla", "ATTN_BATCH_CHUNK", 2),
    ("c2jax.model.mla", "SPLIT_ROPE_SCORES", True),
    ("c2jax.model.mla", "CAUSAL_BLOCK", 64),  # 2 causal query blocks instead of the whole square
    ("c2jax.model.mla", "ATTN_BACKWARD", "autodiff"),  # attention backward by autodiff (default: recompute)
    ("c2jax.model.mla", "ATTN_HEAD_GROUPS", 2),  # the recompute path's heads in 2 independent calls
    ("c2jax.model.mla", "ATTN_HEAD_GROUPS", 4),  # ... one head per call (the tiny preset has 4 heads)
    ("c2jax.model.transformer", "SCAN_UNROLL", True),  # the layer scans unrolled
    ("c2jax.model.transformer", "SCAN_UNROLL", "python"),  # the layer loops as Python code (no scan)
]


@pytest.fixture(scope="module")
def setup():
    from c2jax.model import init, preset

    cfg = preset("tiny").replace(**{"moe.impl": "dropless"})
    params = init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 128), 0, cfg.vocab_size)  # [B, S]
    return cfg, params, tokens, _loss_and_grads(cfg, params, tokens)


def _loss_and_grads(cfg, params, tokens):
    from c2jax.model import apply

    def loss(p):
        logits = apply(p, tokens, cfg)["logits"]  # [B, S, V]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1))

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("module,attr,value", SWITCHES, ids=[f"{a}={v}" for _, a, v in SWITCHES])
def test_switch_keeps_loss_and_gradients(setup, module, attr, value, monkeypatch):
    import importlib

    cfg, params, tokens, (base_loss, base_grads) = setup
    monkeypatch.setattr(importlib.import_module(module), attr, value)
    loss, grads = _loss_and_grads(cfg, params, tokens)
    np.testing.assert_allclose(float(loss), float(base_loss), rtol=1e-6)
    for (path, g), g0 in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(base_grads)):
        scale = float(jnp.max(jnp.abs(g0))) + 1e-12
        assert float(jnp.max(jnp.abs(g - g0))) <= 1e-5 * scale, jax.tree_util.keystr(path)
