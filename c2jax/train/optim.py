"""Learning-rate schedules and optimizers for continued pretraining, picked by name from the config.

``config.train.schedule``: ``{name: 'wsd' | 'cosine' | 'constant', peak_lr, warmup_steps, ...}``

* ``wsd`` (warmup-stable-decay): linear warmup to ``peak_lr``, flat, then a decay over the last
  ``decay_frac`` of ``total_steps`` down to ``min_lr_ratio * peak_lr`` (``decay_shape`` linear,
  cosine or sqrt). A stage that stops at the end of the stable phase can be continued later.
* ``cosine`` (re-warmed cosine): linear warmup from ``init_lr_ratio * peak_lr`` to ``peak_lr``,
  then cosine to ``min_lr_ratio * peak_lr`` at ``total_steps``; used when a stage starts from an
  already-decayed checkpoint (continued pretraining re-warms the learning rate).

``config.train.optimizer``: ``{name: 'adamw' | 'muon', b1, b2, eps, weight_decay, clip_norm}``.
Parameters not trained by gradient (the router's selection bias; ``trainable_mask`` False) get a
zero update and no optimizer state (``optax.masked``). Weight decay applies to matrices only (not
norm scales). With ``muon``, matrix parameters (excluding the embedding and LM head) use
``optax.contrib.muon`` with dimension numbers derived from the logical axes; the rest use AdamW.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from c2jax.registry import Registry

SCHEDULES: Registry[Callable[..., optax.Schedule]] = Registry("lr_schedule")
OPTIMIZERS: Registry[Callable[..., optax.GradientTransformation]] = Registry("optimizer")

# Logical axes along which a stacked parameter holds independent matrices (vmapped by Muon).
BATCH_AXES = ("layers", "mtp_layers", "experts")
# Parameters that stay on AdamW under Muon (as in Moonlight / Kimi K2): embedding and LM head.
NON_MUON_TOP = ("embed", "lm_head")


@SCHEDULES.register("constant")
def constant_schedule(peak_lr: float, total_steps: int, warmup_steps: int = 0, **_: Any) -> optax.Schedule:
    if warmup_steps <= 0:
        return optax.constant_schedule(peak_lr)
    return optax.warmup_constant_schedule(0.0, peak_lr, warmup_steps) if hasattr(
        optax, "warmup_constant_schedule") else optax.join_schedules(
        [optax.linear_schedule(0.0, peak_lr, warmup_steps), optax.constant_schedule(peak_lr)], [warmup_steps])


@SCHEDULES.register("wsd")
def wsd_schedule(peak_lr: float, total_steps: int, warmup_steps: int = 0, decay_frac: float = 0.2,
                 min_lr_ratio: float = 0.0, decay_shape: str = "linear", **_: Any) -> optax.Schedule:
    """Warmup-stable-decay: warmup, flat at peak, decay over the last ``decay_frac`` of the steps."""
    total = max(int(total_steps), 1)
    warm = int(warmup_steps)
    decay_steps = max(int(round(decay_frac * total)), 1 if decay_frac > 0 else 0)
    decay_start = max(total - decay_steps, warm)
    lo = peak_lr * min_lr_ratio

    def sched(step):
        s = jnp.asarray(step, jnp.float32)
        w = jnp.where(warm > 0, jnp.minimum((s + 1.0) / max(warm, 1), 1.0), 1.0)
        frac = jnp.clip((s - decay_start) / max(total - decay_start, 1), 0.0, 1.0)
        if decay_shape == "linear":
            mult = 1.0 - frac
        elif decay_shape == "cosine":
            mult = 0.5 * (1.0 + jnp.cos(math.pi * frac))
        elif decay_shape == "sqrt":
            mult = 1.0 - jnp.sqrt(frac)
        else:
            raise ValueError(f"decay_shape must be linear, cosine or sqrt, got {decay_shape!r}")
        return w * (lo + (peak_lr - lo) * mult)

    return sched


@SCHEDULES.register("cosine")
def rewarmed_cosine_schedule(peak_lr: float, total_steps: int, warmup_steps: int = 0,
                             min_lr_ratio: float = 0.1, init_lr_ratio: float = 0.0, **_: Any) -> optax.Schedule:
    """Re-warmed cosine: warm up from ``init_lr_ratio*peak`` to ``peak``, cosine to ``min_lr_ratio*peak``."""
    total = max(int(total_steps), 1)
    warm = int(warmup_steps)
    lo, init = peak_lr * min_lr_ratio, peak_lr * init_lr_ratio

    def sched(step):
        s = jnp.asarray(step, jnp.float32)
        up = init + (peak_lr - init) * jnp.minimum((s + 1.0) / max(warm, 1), 1.0)
        frac = jnp.clip((s - warm) / max(total - warm, 1), 0.0, 1.0)
        down = lo + (peak_lr - lo) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        return jnp.where(s < warm, up, down)

    return sched


def make_schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    name = d.pop("name", "wsd")
    return SCHEDULES.get(name)(total_steps=total_steps, **d)


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


def decay_mask(params: Any) -> Any:
    """True for matrices (ndim >= 2 after the stacking axes are ignored): norms are not decayed."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def muon_dimension_numbers(params: Any | None, axes: Any | None = None) -> Any:
    """Tree of `MuonDimensionNumbers` (matrix params) / None (AdamW params).

    With a logical-axes tree (``c2jax.model.params_spec.logical_axes``): axes in BATCH_AXES are
    independent matrices; a leading ``heads`` axis groups with the next axis as the reduction dims
    (o_proj [heads, v_head, embed]); otherwise the first non-batch axis is the reduction dim and the
    rest are outputs (kernels are stored input-major). Without axes, plain 2-D leaves use Muon.
    With ``params=None`` returns the function of a params tree (what `optax.masked` needs).
    """
    from optax.contrib import MuonDimensionNumbers as MDN

    def for_leaf(path, p, ax=None):
        names = _path_names(path)
        if names and names[0] in NON_MUON_TOP:
            return None
        if ax is None:
            return MDN(0, 1) if p.ndim == 2 else None
        core = [i for i, a in enumerate(ax) if a not in BATCH_AXES]
        if len(core) < 2:
            return None
        if ax[core[0]] == "heads" and len(core) >= 3:
            red, out = core[:2], core[2:]
        else:
            red, out = core[:1], core[1:]
        return MDN(tuple(red) if len(red) > 1 else red[0], tuple(out) if len(out) > 1 else out[0])

    axes_by_path: dict = {}
    if axes is not None:
        for path, ax in jax.tree_util.tree_flatten_with_path(
                axes, is_leaf=lambda x: isinstance(x, tuple))[0]:
            axes_by_path[_path_names(path)] = ax

    def fn(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, p: for_leaf(path, p, axes_by_path.get(_path_names(path))), tree)

    return fn if params is None else fn(params)


@OPTIMIZERS.register("adamw")
def adamw(schedule: optax.Schedule, params: Any, *, b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
          weight_decay: float = 0.1, axes: Any = None, **_: Any) -> optax.GradientTransformation:
    return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)


@OPTIMIZERS.register("muon")
def muon(schedule: optax.Schedule, params: Any, *, b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
         weight_decay: float = 0.1, beta: float = 0.95, ns_steps: int = 5, axes: Any = None,
         adam_lr_ratio: float = 1.0, **_: Any) -> optax.GradientTransformation:
    dims = muon_dimension_numbers(None, axes)
    return optax.contrib.muon(
        schedule, beta=beta, ns_steps=ns_steps, weight_decay=weight_decay, weight_decay_mask=decay_mask,
        adam_b1=b1, adam_b2=b2, adam_weight_decay=weight_decay,
        adam_learning_rate=(lambda s: adam_lr_ratio * schedule(s)) if adam_lr_ratio != 1.0 else None,
        muon_weight_dimension_numbers=dims, consistent_rms=0.2)


def make_optimizer(opt_cfg: Any, schedule: optax.Schedule, params: Any, *,
                   trainable: Optional[Any] = None, axes: Any = None) -> optax.GradientTransformation:
    """Gradient clipping + the named optimizer on trainable leaves; frozen leaves get zero updates.

    ``trainable``: bool tree (``params_spec.trainable_mask``); None = everything trainable.
    """
    d = opt_cfg.to_dict() if hasattr(opt_cfg, "to_dict") else dict(opt_cfg)
    name = d.pop("name", "adamw")
    clip = d.pop("clip_norm", 1.0)
    if trainable is None:
        trainable = jax.tree_util.tree_map(lambda _: True, params)
    frozen = jax.tree_util.tree_map(lambda t: not t, trainable)
    inner = OPTIMIZERS.get(name)(schedule, params, axes=axes, **d)
    parts = [optax.masked(optax.set_to_zero(), frozen)]  # frozen grads are zero before clipping
    if clip and clip > 0:
        parts.append(optax.clip_by_global_norm(clip))
    parts.append(optax.masked(inner, trainable))
    return optax.chain(*parts)
