"""Sharded forward and gradients equal the single-device ones (tiny f32 dropless model, packed
segments, MTP) on the four meshes of the issue; parameter shardings follow the rules."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from _sharding_common import LOSS, packed_batch, rel_fro, tiny_cfg, tiny_params
from c2jax.losses import combined_loss
from c2jax.model.parallel.sharded import sharded_apply_fn
from c2jax.model.parallel.sharding import (MeshConfig, batch_shardings, make_mesh, param_partition_specs,
                                           param_shardings)
from c2jax.train.pretrain import model_apply_fn

MESHES = {
    "fsdp8": MeshConfig(fsdp=8),
    "fsdp2_ep4": MeshConfig(fsdp=2, expert=4),
    "fsdp2_cp4": MeshConfig(fsdp=2, context=4),
    "dp2_ep2_cp2": MeshConfig(data=2, expert=2, context=2),
}
B, S = 8, 32


def _loss_and_out(apply_fn):
    def f(params, batch):
        out = apply_fn(params, batch)
        loss, _ = combined_loss(out, batch, LOSS)
        keep = {k: out[k] for k in ("logits", "mtp_logits", "expert_counts", "routes")}
        return loss, keep
    return jax.value_and_grad(f, has_aux=True)


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_cfg()
    params = tiny_params(cfg)
    batch = packed_batch(cfg, B, S, seed=3)
    (loss, out), grads = jax.jit(_loss_and_out(model_apply_fn(cfg)))(params, batch)
    return cfg, params, batch, (float(loss), jax.device_get(out), jax.device_get(grads))


# the default run keeps the two meshes that exercise CP and EP together with FSDP; all four run
# with -m slow
# fsdp + cp is also covered by the default sharded train-step test (mesh cpu8: fsdp2 x ep2 x cp2)
DEFAULT = ("dp2_ep2_cp2",)


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in MESHES])
def test_sharded_forward_and_grads_match_single_device(setup, name):
    cfg, params, batch, (loss0, out0, g0) = setup
    mesh = make_mesh(MESHES[name])
    psh = param_shardings(cfg, mesh)
    bsh = batch_shardings(batch, mesh)
    f = jax.jit(_loss_and_out(sharded_apply_fn(cfg, mesh)), in_shardings=(psh, bsh), out_shardings=None)
    (loss, out), grads = f(jax.device_put(params, psh), jax.device_put(batch, bsh))
    assert abs(float(loss) - loss0) <= 1e-5 * abs(loss0)
    np.testing.assert_array_equal(np.asarray(out["routes"]), out0["routes"])
    np.testing.assert_array_equal(np.asarray(out["expert_counts"]), out0["expert_counts"])
    assert rel_fro(out["logits"], out0["logits"]) <= 1e-5
    assert rel_fro(out["mtp_logits"], out0["mtp_logits"]) <= 1e-5
    errs = jax.tree_util.tree_map(rel_fro, jax.device_get(grads), g0)
    flat = jax.tree_util.tree_flatten_with_path(errs)[0]
    bad = [(jax.tree_util.keystr(p), e) for p, e in flat if not e <= 1e-5]
    assert not bad, bad


def test_rules_shard_every_large_weight_and_experts_over_expert_axis():
    cfg = tiny_cfg()
    mesh = make_mesh(MeshConfig(data=2, expert=2, context=2))
    specs = param_partition_specs(cfg, mesh)
    ex = specs["moe_layers"]["moe"]["experts"]["gate_proj"]
    assert ex[1] == "expert" and ex[0] is None  # [layers, experts, embed, expert_mlp]
    assert specs["moe_layers"]["moe"]["experts"]["gate_proj"][2] == "context"  # embed over (fsdp, context)
    emb = specs["embed"]["embedding"]
    assert emb[1] == ("expert", "context")  # dense view: FSDP over (fsdp, expert, context), fsdp=1 here
    # every parameter with >= 256 elements is sharded on some axis; 'data' never shards weights
    from c2jax.model.params_spec import ParamSpec, param_specs
    shapes = jax.tree_util.tree_leaves(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
    for sp, ps in zip(shapes, jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
        used = [a for a in ps if a is not None]
        flat = [x for a in used for x in ((a,) if isinstance(a, str) else a)]
        assert "data" not in flat
        if np.prod(sp.shape) >= 256:
            assert flat, (sp, ps)
