"""Train state: the pytree a train step maps to the next one (and what a checkpoint stores).

`TrainState` is a `flax.struct` dataclass so it is a pytree (jit/pjit/sharding see its leaves)
while the optimizer (`tx`) rides along as static metadata. ``step`` counts optimizer updates since
the start of the stage; it drives the learning-rate schedule and the data loader position.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
    step: jax.Array  # [] int32
    params: Any
    opt_state: Any
    tx: optax.GradientTransformation = struct.field(pytree_node=False)

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation, step: int = 0) -> "TrainState":
        return cls(step=jnp.asarray(step, jnp.int32), params=params, opt_state=tx.init(params), tx=tx)

    def to_tree(self) -> dict:
        """The checkpointable part (no optimizer object)."""
        return {"step": self.step, "params": self.params, "opt_state": self.opt_state}

    def replace_tree(self, tree: dict) -> "TrainState":
        return self.replace(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])


def param_count(params: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
