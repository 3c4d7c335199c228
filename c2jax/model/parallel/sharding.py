"""Scale-out: the device mesh and the logical-axis sharding rules (the sharded model: `sharded`).

The mesh has four named axes, outermost first (a multi-host job puts `data` across hosts):

    data     pure data parallelism: weights replicated (the outer level of hybrid FSDP)
    fsdp     data parallelism with weights and optimizer state sharded (ZeRO-3 style)
    expert   expert parallelism: routed experts sharded over it; for everything else it is one
             more FSDP/data axis (the "expert view" is carved from data x context capacity, as in
             Composer 2.5: EP is decoupled from any tensor parallelism)
    context  context parallelism: the sequence is split over it (CP attention gathers MLA latents);
             it is folded into FSDP, so CP ranks also shard the weights

Two views of the same devices:
* dense view (attention, dense MLP, shared experts, embeddings, norms): every weight is sharded
  on one dimension over ``DENSE_FSDP_AXES`` = (fsdp, expert, context) and all-gathered at use;
* expert view (routed experts [E, D, F]): the E dimension over ``expert``, the embed dimension over
  (fsdp, context).
Activations (`ACTIVATION_RULES`): batch over ``BATCH_AXES`` = (data, fsdp, expert), sequence over
``context``, the MoE token axis over all four.

`mesh_rules` maps each logical axis name of `params_spec.LOGICAL_AXES` to candidate mesh axes;
`resolve_spec` picks, per parameter, the mesh axes that are free and divide the dimension (so any
model shape works on any mesh; an undividable dimension stays replicated). Optimizer-state leaves
take the sharding of the parameter they mirror (matched by path and shape).

Config (``config.mesh``, validated by `validate_mesh`): ``{preset?, data, fsdp, expert, context}``
(one of them may be -1 = all remaining devices), plus ``dispatch_quant`` (None or a
`kernels_pallas` format name: tokens quantised before the EP all_to_all), ``cp_block`` (query/KV
block of the CP attention, 0 = half a chunk) and ``ep_ragged`` ('auto' | 'never': use
`ragged_all_to_all` on GPU). Presets: `MESH_PRESETS`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from c2jax.config import Checker, ConfigError, register_validator

MESH_AXES = ("data", "fsdp", "expert", "context")
BATCH_AXES = ("data", "fsdp", "expert")
DENSE_FSDP_AXES = ("fsdp", "expert", "context")
EXPERT_FSDP_AXES = ("fsdp", "context")
TOKEN_AXES = BATCH_AXES + ("context",)  # every axis that splits tokens (flattened B*S order)

# Quantisation formats a token dispatch may use (names of kernels_pallas.formats.FORMATS).
DISPATCH_QUANT_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "fp8_blockwise", "mxfp4", "nvfp4")


@dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes and the parallel-implementation options (hashable, jit-static)."""

    data: int = 1
    fsdp: int = 1
    expert: int = 1
    context: int = 1
    dispatch_quant: Optional[str] = None
    cp_block: int = 0
    ep_ragged: str = "auto"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, a) for a in MESH_AXES)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def resolved(self, n_devices: int) -> "MeshConfig":
        """Replace a -1 axis by the remaining device count; check the product equals n_devices."""
        sizes = dict(zip(MESH_AXES, self.shape))
        free = [a for a, s in sizes.items() if s == -1]
        if len(free) > 1:
            raise ConfigError([("mesh", f"at most one axis may be -1, got {free}")])
        known = math.prod(s for s in sizes.values() if s != -1)
        if free:
            if n_devices % known:
                raise ConfigError([(f"mesh.{free[0]}", f"{n_devices} devices are not divisible by the other "
                                                      f"axes' product {known}")])
            sizes[free[0]] = n_devices // known
        if math.prod(sizes.values()) != n_devices:
            raise ConfigError([("mesh", f"axes {sizes} use {math.prod(sizes.values())} devices, "
                                        f"but {n_devices} are available")])
        return dataclasses.replace(self, **sizes)

    @classmethod
    def from_config(cls, c: Any) -> "MeshConfig":
        """From ``config.mesh`` (ConfigDict/dict, optionally with ``preset``) or a MeshConfig."""
        if isinstance(c, MeshConfig):
            return c
        d = dict(c.to_dict() if hasattr(c, "to_dict") else (c or {}))
        check = Checker("mesh")
        validate_mesh(check, d, None)
        if check.problems:
            raise ConfigError(check.problems)
        base = MESH_PRESETS[d.pop("preset")] if d.get("preset") else MeshConfig()
        return dataclasses.replace(base, **d)


MESH_PRESETS: dict[str, MeshConfig] = {
    # one device (laptop / CPU smoke run): no collectives at all
    "single": MeshConfig(),
    # 8 simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8): every kind of
    # parallelism at once, for tests and benchmarks/scaling.py
    "cpu8": MeshConfig(fsdp=2, expert=2, context=2),
    # one 8-GPU node: EP=8 over the node (dense weights FSDP over the same 8 devices)
    "gpu_node": MeshConfig(expert=8, ep_ragged="auto"),
    # one 8-GPU node, long context: EP=4 x CP=2 (Composer 2 pretraining used CP=2)
    "gpu_node_long": MeshConfig(expert=4, context=2),
}


def mesh_config_dict(preset: str = "single", **overrides: Any):
    """A ``config.mesh`` ConfigDict for an experiment file: a preset plus overrides."""
    import ml_collections

    if preset not in MESH_PRESETS:
        raise ConfigError([("mesh.preset", f"must be one of {sorted(MESH_PRESETS)}, got {preset!r}")])
    d = dataclasses.asdict(dataclasses.replace(MESH_PRESETS[preset], **overrides))
    return ml_collections.ConfigDict(d, type_safe=False)


@register_validator("mesh")
def validate_mesh(check: Checker, m: Any, full: Any) -> None:
    """``config.mesh``: axis sizes (>= 1, or -1 once), preset, parallel options; with a model
    section, `expert` must divide the number of routed experts."""
    if hasattr(m, "to_dict"):
        m = m.to_dict()
    if dataclasses.is_dataclass(m):
        m = dataclasses.asdict(m)
    if not isinstance(m, Mapping):
        check.error("preset", f"config.mesh must be a mapping of mesh axes, got {type(m).__name__}")
        return
    known = {f.name for f in dataclasses.fields(MeshConfig)} | {"preset"}
    for k in m:
        if k not in known:
            check.error(k, f"unknown key; known: {sorted(known)}")
    if m.get("preset") is not None and m["preset"] not in MESH_PRESETS:
        check.error("preset", f"must be one of {sorted(MESH_PRESETS)}, got {m['preset']!r}")
    base = MESH_PRESETS.get(m.get("preset") or "single", MeshConfig())
    sizes = {}
    for a in MESH_AXES:
        v = m.get(a, getattr(base, a))
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
            check.error(a, f"must be an integer >= 1 (or -1 = remaining devices), got {v!r}")
        else:
            sizes[a] = v
    minus = [a for a, v in sizes.items() if v == -1]
    for a in minus[1:]:
        check.error(a, f"at most one axis may be -1 (= remaining devices), got -1 for {minus}")
    dq = m.get("dispatch_quant")
    if dq is not None and dq not in DISPATCH_QUANT_FORMATS:
        check.error("dispatch_quant", f"must be None or one of {list(DISPATCH_QUANT_FORMATS)}, got {dq!r}")
    if "cp_block" in m:
        check.int_range(m, "cp_block", 0)
    if "ep_ragged" in m:
        check.choice(m, "ep_ragged", ("auto", "never"))
    model = None
    if full is not None:
        try:
            model = full["model"]
        except (KeyError, TypeError, AttributeError):
            model = None
    if model is not None and sizes.get("expert", 1) > 1:
        try:
            n_exp = model["moe"]["n_routed_experts"]
        except (KeyError, TypeError):
            n_exp = None
        if isinstance(n_exp, int) and n_exp % sizes["expert"]:
            check.error("expert", f"must divide model.moe.n_routed_experts={n_exp}, got {sizes['expert']}")


# ---- the mesh ------------------------------------------------------------------------------------

def make_mesh(mesh_cfg: Any, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A `Mesh` with axes `MESH_AXES` (GSPMD 'auto' axis types) over `devices` (default: all)."""
    mc = MeshConfig.from_config(mesh_cfg)
    devices = list(jax.devices() if devices is None else devices)
    mc = mc.resolved(len(devices))
    return jax.make_mesh(mc.shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def axis_size(mesh: Mesh, axes: Any) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)


# ---- logical-axis rules --------------------------------------------------------------------------

def mesh_rules() -> dict[str, tuple[str, ...]]:
    """Logical axis -> candidate mesh axes. 'experts' is resolved first (expert view); then the
    first dimension in `FSDP_PREFERENCE` that divides takes the FSDP axes still free."""
    return {"experts": ("expert",)}


# Which logical dimension of a weight takes the FSDP axes (first one that divides wins).
FSDP_PREFERENCE = ("embed", "mlp", "shared_mlp", "expert_mlp", "q_lora", "kv_lora", "kv_a", "heads",
                   "vocab", "embed2", "qk_head", "kv_head", "v_head")
NEVER_SHARDED = ("layers", "mtp_layers")


def resolve_spec(shape: Sequence[int], axes: Sequence[str], mesh: Mesh) -> P:
    """PartitionSpec of one parameter with logical `axes` on `mesh` (see module docstring)."""
    out: list[Any] = [None] * len(shape)
    used: set[str] = set()
    rules = mesh_rules()
    for i, name in enumerate(axes):  # expert view first
        cands = [a for a in rules.get(name, ()) if mesh.shape.get(a, 1) > 1]
        if cands and shape[i] % axis_size(mesh, cands) == 0:
            out[i] = cands[0] if len(cands) == 1 else tuple(cands)
            used.update(cands)
    fsdp = EXPERT_FSDP_AXES if "experts" in axes else DENSE_FSDP_AXES
    cands = [a for a in fsdp if a not in used and mesh.shape.get(a, 1) > 1]
    for name in FSDP_PREFERENCE:
        if not cands or name not in axes:
            continue
        i = list(axes).index(name)
        if out[i] is not None:
            continue
        take = list(cands)
        while take and shape[i] % axis_size(mesh, take):
            take.pop()  # drop the innermost axis until the dimension divides
        if take:
            out[i] = take[0] if len(take) == 1 else tuple(take)
            break
    return P(*out)


def param_partition_specs(cfg, mesh: Mesh) -> dict:
    """Tree of PartitionSpecs matching `params_spec.param_specs(cfg)`."""
    from c2jax.model.params_spec import map_specs, param_specs

    return map_specs(lambda s: resolve_spec(s.shape, s.axes, mesh), param_specs(cfg))


def param_shardings(cfg, mesh: Mesh) -> dict:
    return jax.tree_util.tree_map(lambda p: NamedSharding(mesh, p), param_partition_specs(cfg, mesh),
                                  is_leaf=lambda x: isinstance(x, P))


def _keys(path) -> tuple:
    out = []
    for k in path:
        out.append(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))))
    return tuple(out)


def tree_shardings_like_params(tree: Any, params_shardings: Any, params_shapes: Any, mesh: Mesh) -> Any:
    """Shardings for an arbitrary tree (optimizer state): a leaf whose path ends with a
    parameter's path and has its shape gets that parameter's sharding; other leaves replicate."""
    by_path: dict[tuple, tuple] = {}
    for (path, sh), (_, shp) in zip(jax.tree_util.tree_flatten_with_path(params_shardings)[0],
                                     jax.tree_util.tree_flatten_with_path(params_shapes)[0]):
        by_path[_keys(path)] = (tuple(shp.shape), sh)
    repl = NamedSharding(mesh, P())

    def pick(path, leaf):
        keys = _keys(path)
        shape = tuple(getattr(leaf, "shape", ()))
        for n in range(len(keys)):
            hit = by_path.get(keys[n:])
            if hit is not None and hit[0] == shape:
                return hit[1]
        return repl

    return jax.tree_util.tree_map_with_path(pick, tree)


# Logical activation axes -> mesh axes (None = replicated). Activations keep weights' feature
# dimensions whole: the mesh has no tensor-parallel axis (EP is decoupled from TP).
ACTIVATION_RULES: dict[str, Any] = {
    "batch": BATCH_AXES,      # rows of the global batch
    "seq": "context",         # sequence positions (CP)
    "tokens": TOKEN_AXES,     # flattened batch x sequence (the MoE's token axis)
    "expert_rank": "expert",  # the EP dispatch buffer's destination axis
    "embed": None, "heads": None, "head_dim": None, "kv_lora": None, "vocab": None, "top_k": None,
}


def activation_spec(*logical: Optional[str]) -> P:
    """PartitionSpec of an activation from its logical axis names, e.g. ('batch', 'seq', 'embed')."""
    return P(*[None if n is None else ACTIVATION_RULES[n] for n in logical])


def batch_spec(ndim: int) -> P:
    """[B] -> batch axes; [B, S, ...] -> batch axes x context."""
    if ndim == 1:
        return activation_spec("batch")
    return activation_spec("batch", "seq", *([None] * (ndim - 2)))


def batch_shardings(batch: Mapping[str, Any], mesh: Mesh) -> dict:
    return {k: NamedSharding(mesh, batch_spec(np.ndim(v) if not hasattr(v, "ndim") else v.ndim))
            for k, v in batch.items()}


def check_batch_divisible(batch_size: int, seq_len: int, mesh: Mesh) -> None:
    """Clear error when the global batch does not split over the mesh."""
    nb, nc = axis_size(mesh, BATCH_AXES), mesh.shape["context"]
    probs = []
    if batch_size % nb:
        probs.append(("batch_size", f"{batch_size} rows do not split over data x fsdp x expert = {nb}"))
    if nc > 1 and seq_len % (2 * nc):
        probs.append(("seq_len", f"{seq_len} is not divisible by 2 x context = {2 * nc} (CP chunks)"))
    if probs:
        raise ConfigError(probs)


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
    """Per-process rows (the loader's `process_index` slice) -> global jax.Arrays on `mesh`.

    Process p holds rows [p*B/P, (p+1)*B/P) of the global batch, which must be the rows its
    devices own under `batch_spec` (true for `make_mesh`: `data` is outermost, hosts own
    contiguous device blocks)."""
    out = {}
    for k, v in local.items():
        v = np.asarray(v)
        out[k] = jax.make_array_from_process_local_data(NamedSharding(mesh, batch_spec(v.ndim)), v)
    return out
