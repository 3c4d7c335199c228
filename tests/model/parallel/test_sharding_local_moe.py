"""Data parallelism without an expert axis: each device computes the routed experts of its own tokens.

Left to the partitioner, dropless routing's sort over a sharded token axis gathered every token to every
device, so on a data-parallel mesh each device computed the whole batch's experts (benchmarks/
host_devices.py: 2.16 s against 1.71 s on two host devices). `sharded_apply_fn` now routes the experts
through `ep_moe.local_moe` when ``mesh.expert == 1``. These tests check the compiled program (no
collective carries every token's hidden state; positive control: plain `transformer.apply` under the
same shardings does gather them) and that the result is the single-device one. Routing's [tokens, E]
scores and top-k are still gathered by the partitioner (its top_k is not split over tokens): E / D of the
hidden states' bytes, and routing's compute is tiny beside the experts'."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from _sharding_common import rel_fro, tiny_cfg, tiny_params
from c2jax.model.parallel import ep_moe
from c2jax.model.parallel.sharded import sharded_apply_fn
from c2jax.model.parallel.sharding import MeshConfig, batch_shardings, make_mesh, param_shardings
from c2jax.model.transformer import apply

B, S = 8, 40  # 320 tokens: a size no weight dimension of the tiny preset has
COLLECTIVE = re.compile(r"= (\S+) (all-gather|all-to-all|collective-permute|all-reduce)(?:-start)?\(")


def _loss(forward):
    def f(params, tokens):  # tokens [B, S] -> mean logit (any scalar of the whole forward)
        return forward(params, tokens)["logits"].mean()
    return jax.value_and_grad(f)


def _compiled(forward, cfg, params, mesh):
    psh = param_shardings(cfg, mesh)
    tsh = batch_shardings({"tokens": np.zeros((B, S), np.int32)}, mesh)["tokens"]
    return jax.jit(_loss(forward), in_shardings=(psh, tsh)).lower(params, np.zeros((B, S), np.int32)).compile()


def _global_token_collectives(compiled, widths: set) -> list[str]:
    """Shapes of the collectives whose result has an axis of all B*S tokens and one of `widths`."""
    out = []
    for line in compiled.as_text().splitlines():
        m = COLLECTIVE.search(line)
        dims = [int(d) for d in re.findall(r"\d+", m.group(1).split("{")[0])] if m else []
        if B * S in dims and widths & set(dims):
            out.append(f"{m.group(2)} {m.group(1)}")
    return out


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_cfg()
    return cfg, tiny_params(cfg)


@pytest.mark.parametrize("mesh_cfg", [MeshConfig(data=8),
                                      pytest.param(MeshConfig(data=2, fsdp=4), marks=pytest.mark.slow)],
                         ids=["data8", "dp2_fsdp4"])
def test_no_collective_carries_every_tokens_hidden_state_and_plain_apply_would(setup, mesh_cfg):
    cfg, params = setup
    mesh = make_mesh(mesh_cfg)
    sharded = sharded_apply_fn(cfg, mesh)
    fixed = _compiled(lambda p, t: sharded(p, {"tokens": t}), cfg, params, mesh)
    # hidden states whole, or split over fsdp (the partitioner's choice when FSDP shards the weights)
    widths = {cfg.hidden_size, cfg.hidden_size // mesh.shape["fsdp"]}
    assert _global_token_collectives(fixed, widths) == []
    plain = _compiled(lambda p, t: apply(p, t, cfg), cfg, params, mesh)  # positive control
    assert _global_token_collectives(plain, widths), "no hidden-state gather left to remove"


def test_local_moe_equals_the_impl_on_the_whole_batch(setup):
    """Routed-expert outputs and gradients of `local_moe` on a data x fsdp mesh equal the dropless impl's
    on one device (the model-level check is tests/model/parallel/test_sharding_model.py)."""
    from c2jax.model.moe_impls import MOE_IMPLS
    from c2jax.model.moe_router import route, router_scores

    cfg, params = setup
    m = cfg.moe
    p = jax.tree.map(lambda a: a[0], params["moe_layers"]["moe"])  # the first MoE layer
    x = jax.random.normal(jax.random.key(1), (B * S, cfg.hidden_size))
    idx, w = route(router_scores(p["router"], x), p["router"]["bias"], m)
    mesh = make_mesh(MeshConfig(data=4, fsdp=2))

    def total(fn, experts, x):
        y, dropped = fn(experts, x, idx, w, m)
        return (y * y).sum(), (y, dropped)

    (_, (y0, d0)), g0 = jax.jit(jax.value_and_grad(lambda e, x: total(MOE_IMPLS.get(m.impl), e, x), (0, 1),
                                                   has_aux=True))(p["experts"], x)
    local = ep_moe.make_local_experts_fn(mesh)
    (_, (y1, d1)), g1 = jax.jit(jax.value_and_grad(lambda e, x: total(local, e, x), (0, 1), has_aux=True))(
        p["experts"], x)
    assert rel_fro(y1, y0) <= 1e-6 and float(d1) == float(d0) == 0.0
    errs = jax.tree.leaves(jax.tree.map(rel_fro, jax.device_get(g1), jax.device_get(g0)))
    assert max(errs) <= 1e-5, errs


def test_local_moe_refuses_an_expert_axis(setup):
    cfg, params = setup
    mesh = make_mesh(MeshConfig(data=4, expert=2))
    p = jax.tree.map(lambda a: a[0], params["moe_layers"]["moe"]["experts"])
    x = np.zeros((B * S, cfg.hidden_size), np.float32)
    idx, w = np.zeros((B * S, cfg.moe.top_k), np.int32), np.ones((B * S, cfg.moe.top_k), np.float32)
    with pytest.raises(ValueError, match="use ep_moe"):
        ep_moe.local_moe(mesh, p, x, idx, w, cfg.moe)


def test_a_capacity_impl_gets_a_capacity_per_device(setup):
    """The documented semantics for an impl that drops: each device applies the capacity to its own tokens
    (as GShard's groups do), and the dropped fraction is the devices' mean; checked against the impl run
    on each device's rows by hand."""
    import dataclasses

    from c2jax.model.moe_impls import MOE_IMPLS
    from c2jax.model.moe_router import route, router_scores

    cfg, params = setup
    m = dataclasses.replace(cfg.moe, impl="capacity", capacity_factor=0.5)  # low: some assignments drop
    p = jax.tree.map(lambda a: a[0], params["moe_layers"]["moe"])
    x = jax.random.normal(jax.random.key(2), (B * S, cfg.hidden_size))
    idx, w = route(router_scores(p["router"], x), p["router"]["bias"], m)
    mesh = make_mesh(MeshConfig(data=4, fsdp=2))  # tokens split over data x fsdp = 8 devices
    y, dropped = jax.jit(lambda e, x: ep_moe.local_moe(mesh, e, x, idx, w, m))(p["experts"], x)
    parts = [MOE_IMPLS.get("capacity")(p["experts"], xs, i, ws, m)
             for xs, i, ws in zip(np.split(np.asarray(x), 8), np.split(np.asarray(idx), 8), np.split(np.asarray(w), 8))]
    assert rel_fro(y, np.concatenate([np.asarray(a) for a, _ in parts])) <= 1e-6
    assert float(dropped) == pytest.approx(np.mean([float(d) for _, d in parts]), abs=1e-7)
    assert float(dropped) > 0  # the case the semantics are about
