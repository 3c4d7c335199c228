"""benchmarks/xla_profile.py: the call stacks read from the HLO text follow the real Python call
chain, every matmul of the model step is attributed to a model component that perf.forward_flops
counts, and a profile counts a loop body once (control-flow thunks are not added on top)."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest
from _paths import REPO_ROOT  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

import xla_profile  # noqa: E402
from c2jax.model import init, preset  # noqa: E402
from c2jax.model.transformer import apply  # noqa: E402


def _inner(x):
    return jnp.sin(x) @ x  # [4, 4]


def _middle(x):
    return _inner(x) * 2


def _outer(x):
    return _middle(x).sum() + jnp.cos(x).sum()


def test_call_stack_of_a_dot_is_the_python_call_chain():
    ins = xla_profile.parse_hlo(jax.jit(_outer).lower(jnp.ones((4, 4))).compile().as_text())
    dots = [i for i in ins.values() if i["kind"] == "matmul" and i["stack"]]
    assert dots
    for d in dots:
        assert [fn for _, fn in d["stack"][:3]] == ["_inner", "_middle", "_outer"], d["stack"]
        assert d["stack"][0][0] == "test_xla_profile.py"


def test_component_rules():
    c = xla_profile.component
    assert c([("norms.py", "rms_norm"), ("mla.py", "queries"), ("mla.py", "mla")]) == "norms"
    assert c([("norms.py", "dense"), ("mla.py", "queries")]) == "attention proj+RoPE"
    assert c([("norms.py", "dense"), ("norms.py", "swiglu_mlp"), ("moe.py", "moe_block")]) == "MoE shared experts"
    assert c([("norms.py", "dense"), ("norms.py", "swiglu_mlp"), ("transformer.py", "transformer_block")]) == "dense MLP"
    assert c([("mla.py", "attend_expanded.<locals>.<genexpr>")]) == "attention scores+softmax"
    assert c([("norms.py", "dense"), ("transformer.py", "apply")]) == "embed+LM head"
    assert c([("transformer.py", "apply")], "gather") == "embed+LM head"
    assert c([("transformer.py", "apply")], "transpose/copy") == "layer loop+apply glue"
    assert c([("model_step.py", "loss")]) == "loss/other"


@pytest.fixture(scope="module")
def tiny_step():
    cfg = preset("tiny").replace(mtp_depth=0, **{"moe.impl": "dropless"})
    params = init(cfg, jax.random.key(0))
    tokens = jnp.zeros((1, 32), jnp.int32)

    def loss(p, t):
        return jnp.mean(jax.nn.logsumexp(apply(p, t, cfg)["logits"], -1))

    return jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile(), (params, tokens)


def test_every_model_matmul_lands_in_a_flop_counted_component(tiny_step):
    ins = xla_profile.parse_hlo(tiny_step[0].as_text())
    mm = {i["component"] for i in ins.values() if i["kind"] == "matmul" and not i["fused"]}  # matmul thunks
    assert mm <= set(xla_profile.FLOP_COMPONENTS.values()) | {"loss/other"}, mm
    assert set(xla_profile.FLOP_COMPONENTS.values()) <= mm  # tiny has a dense layer and MoE layers


def test_profile_counts_each_thunk_once(tiny_step):
    fn, args = tiny_step
    prof = xla_profile.profile_compiled(fn, args, calls=2)
    assert sum(s for s, *_ in prof["by_component"]) == pytest.approx(1.0)
    assert sum(s for s, *_ in prof["by_kind"]) == pytest.approx(1.0)
    assert not any(name.startswith(("while", "conditional", "call.")) for _, _, name, *_ in prof["top"])
    assert {w for *_, w in prof["by_component"]} <= set(xla_profile.WORK.values())
