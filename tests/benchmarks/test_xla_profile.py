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
    assert c([("mla.py", "_attend_heads"), ("mla.py", "attend_expanded")]) == "attention scores+softmax"
    assert c([("moe_tile_scan.py", "_forward.<locals>.body"), ("moe_impls.py", "_tiled_swiglu")]) == "MoE routed experts"


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



@pytest.mark.parametrize("backward", ["recompute", "autodiff"])
def test_attention_score_and_value_matmuls_count_as_scores(backward):
    """Every matmul of `mla.attend_expanded` (fwd+bwd: the kv_b up-projection, q.k and p.v in
    `_attend_heads` or in `attention_recompute`'s custom VJP) lands in "attention scores+softmax". A helper renamed in mla.py once moved q.k
    and p.v into the projections silently, and the profile then showed those at a fifth of peak."""
    from c2jax.model import mla

    cfg = preset("tiny")
    a, b, s, h = cfg.attention, 2, 256, cfg.num_heads
    ks = jax.random.split(jax.random.key(0), 5)
    args = (jax.random.normal(ks[0], (a.kv_lora_rank, h, a.qk_nope_head_dim + a.v_head_dim)),
            jax.random.normal(ks[1], (b, s, h, a.qk_nope_head_dim)), jax.random.normal(ks[2], (b, s, h, a.qk_rope_head_dim)),
            jax.random.normal(ks[3], (b, s, a.kv_lora_rank)), jax.random.normal(ks[4], (b, s, a.qk_rope_head_dim)))
    mask = jnp.tril(jnp.ones((s, s), bool))[None]

    def f(w, qn, qr, c, kr):
        return jnp.sum(mla.attend_expanded({"kv_b_proj": {"kernel": w}}, qn, qr, c, kr, mask, cfg, causal_blocks=2,
                                           backward=backward) ** 2)

    ins = xla_profile.parse_hlo(jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4))).lower(*args).compile().as_text())
    mm = [i for i in ins.values() if i["kind"] == "matmul"]
    home = ("mla.py", "_attend_heads") if backward == "autodiff" else ("attention_recompute.py", None)
    own = lambda fr: fr[0] == home[0] and (home[1] is None or fr[1] == home[1])
    assert sum(any(own(fr) for fr in i["stack"]) for i in mm) >= 4, mm  # q.k, p.v fwd+bwd
    assert {i["component"] for i in mm} == {"attention scores+softmax"}, {(i["shape"], i["component"]) for i in mm}
