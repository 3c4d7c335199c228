"""The sharded model and train state on a mesh: `sharded_apply_fn` (transformer.apply with CP
attention / EP dispatch swapped in), state shardings and placement, the jitted train step, and
`training_plan` (what a train stage needs to run on ``config.mesh``).

Above `sharding` (rules) and the parallel implementations it wires in (`cp_attention`, `ep_moe`),
which both read the rules, so neither imports this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from c2jax.model.parallel import cp_attention, ep_moe
from c2jax.model.parallel.sharding import (TOKEN_AXES, MeshConfig, axis_size, batch_spec, check_batch_divisible,
                                           global_batch, make_mesh, param_shardings, tree_shardings_like_params)
from c2jax.model.transformer import apply


# ---- the sharded model ---------------------------------------------------------------------------

def sharded_apply_fn(cfg, mesh: Mesh, mesh_cfg: Any = None):
    """``fn(params, batch) -> outputs``: `transformer.apply` with the parallel implementations for
    `mesh` swapped in (CP attention when context > 1; EP dispatch when expert > 1, else, when tokens
    are split at all, each device's routed experts on its own tokens, `ep_moe.local_moe`). Same batch
    layout as `c2jax.train.pretrain.model_apply_fn`; jit it with `state_shardings`/`batch_shardings`."""
    mc = MeshConfig() if mesh_cfg is None else MeshConfig.from_config(mesh_cfg)
    token_split = axis_size(mesh, TOKEN_AXES)

    def fn(params, batch):
        seg = batch.get("segment_ids")
        attend = None
        if mesh.shape["context"] > 1:
            attend = cp_attention.make_attend_fn(mesh, seg, block=mc.cp_block)
        experts = None
        if mesh.shape["expert"] > 1:
            experts = ep_moe.make_experts_fn(mesh, quant=mc.dispatch_quant, ragged=mc.ep_ragged)
        elif token_split > 1:
            experts = ep_moe.make_local_experts_fn(mesh)
        return apply(params, batch["tokens"], cfg, segment_ids=seg, positions=batch.get("positions"),
                     attend_fn=attend, experts_fn=experts)

    return fn


def state_shardings(state: Any, cfg, mesh: Mesh) -> Any:
    """Shardings for a `TrainState` (params by the rules, optimizer state like its params, step
    replicated) as a TrainState-shaped pytree, for `jax.jit(in_shardings=..., out_shardings=...)`."""
    psh = param_shardings(cfg, mesh)
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.params)
    osh = tree_shardings_like_params(state.opt_state, psh, shapes, mesh)
    return state.replace(step=NamedSharding(mesh, P()), params=psh, opt_state=osh)


def shard_state(state: Any, cfg, mesh: Mesh) -> Any:
    """Place a (host or single-device) TrainState onto `mesh` with `state_shardings`."""
    return jax.device_put(state, state_shardings(state, cfg, mesh))


def jit_train_step(step_fn, state_sh: Any, batch_sh: Mapping[str, Any], donate: bool = True):
    """`jax.jit` of a `make_train_step` function with state/batch shardings (state donated)."""
    return jax.jit(step_fn, in_shardings=(state_sh, dict(batch_sh)), out_shardings=(state_sh, None),
                   donate_argnums=(0,) if donate else ())


def abstract_state(state_like: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs with shardings (for `Checkpointer.restore_latest` onto another mesh)."""
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                  state_like, shardings)


# ---- wiring into a training stage ----------------------------------------------------------------

@dataclass
class TrainingPlan:
    """Everything a train stage needs to run on a mesh: the sharded forward, the jitted step with
    shardings, state placement and per-process batch assembly (see `training_plan`)."""

    mesh: Mesh
    mesh_cfg: MeshConfig
    cfg: Any

    def apply_fn(self):
        return sharded_apply_fn(self.cfg, self.mesh, self.mesh_cfg)

    def state_shardings(self, state: Any) -> Any:
        return state_shardings(state, self.cfg, self.mesh)

    def place(self, state: Any) -> Any:
        """Put a host / single-device TrainState on the mesh (every process passes the same values)."""
        def put(x, s):
            if isinstance(x, jax.Array):
                if x.sharding.is_equivalent_to(s, x.ndim):
                    return x
                if not x.is_fully_addressable:
                    return jax.device_put(x, s)  # global array: reshard
            return jax.make_array_from_callback(np.shape(x), s, lambda i: np.asarray(x)[i])
        return jax.tree_util.tree_map(put, state, self.state_shardings(state))

    def jit_step(self, step_fn, state: Any, batch_keys: Sequence[str] = ("tokens", "targets", "loss_mask",
                                                                          "segment_ids", "positions")):
        bsh = {k: NamedSharding(self.mesh, batch_spec(2)) for k in batch_keys}
        return jit_train_step(step_fn, self.state_shardings(state), bsh)

    def to_device(self, convert=lambda b: b):
        """Loader batch (this process's rows) -> global arrays on the mesh, after `convert`."""
        def fn(b):
            return global_batch({k: np.asarray(v) for k, v in convert(b).items()}, self.mesh)
        return fn


def training_plan(config: Any, cfg, batch_size: int, seq_len: int) -> Optional[TrainingPlan]:
    """The plan for ``config.mesh``, or None when the config has no mesh section or asks for a
    single device (then the plain single-device path runs). Checks the batch splits."""
    try:
        mcfg = config["mesh"]
    except (KeyError, TypeError, AttributeError):
        return None
    if mcfg is None:
        return None
    mc = MeshConfig.from_config(mcfg)
    if mc.size == 1:
        return None
    mesh = make_mesh(mc)
    check_batch_divisible(batch_size, seq_len, mesh)
    return TrainingPlan(mesh, mc.resolved(mesh.size), cfg)
