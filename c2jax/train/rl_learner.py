"""The RL learner: log-probabilities with router replay, the composed RL loss, one Adam update.

    fns = make_learner(model_cfg, rl_cfg)            # rl_cfg: the resolved ``rl`` section
    logp, aux = fns.logp(params, batch, replay=True) # [B, L] f32 logprobs of batch['targets']
    state, metrics = fns.update(state, batch, logp_ref, version)

`batch` is `c2jax.batching.pad_batch`'s dict (numpy or jnp arrays). The forward uses the
learner's MoE implementation (``rl.learner_moe_impl``, dropless: the learner never drops a token)
and, with ``rl.router_replay``, the routes the sampler recorded (``batch['routes']``); the
plausibility filter ``rl.replay_margin`` goes into the model config's ``moe.replay_margin``.
`update` is `jax.jit`-compiled once per padded batch shape; its loss is exactly
`c2jax.rl.loss.make_rl_loss(rl_cfg)` on those logprobs, its optimizer full-parameter Adam(W) from
`c2jax.train.optim.make_optimizer` (``rl.optimizer.name``: adamw | muon) (router correction biases frozen, as in pretraining).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from c2jax.rl.loss import make_rl_loss, token_entropy, token_logprobs
from c2jax.train.state import TrainState

# pad_batch keys the learner does not need on device (dropped before jit).
_HOST_ONLY = ("num_segments",)

# Where the learner computes the LM head and the log-softmax: "loss_positions" (the default since
# 2026-12-07) only at the positions a loss term or a diagnostic reads (loss_mask > 0: the policy's
# tokens, about a third of a quickstart batch's positions), gathered to a bucketed count
# (`logprob_positions`); "all" at every position (before; `benchmarks/rl_learner.py`'s baseline).
# Every logprob the loss, the KL metrics and the mismatch diagnostics read is the same either way
# (tests/train/test_rl_learner_positions.py); positions outside the set get logprob 0, which every
# consumer masks out.
LOGITS_AT = "loss_positions"
LOGIT_BUCKETS = 8  # the gathered count is a multiple of (rows x positions) / LOGIT_BUCKETS


def logprob_positions(loss_mask: Any, buckets: int = LOGIT_BUCKETS) -> np.ndarray | None:
    """Flat indices [N] into ``loss_mask.reshape(-1)`` ([B, L]) at which the learner computes
    logprobs: every position with loss_mask > 0, then the first positions without it as filler, up
    to N = the smallest multiple of B*L/buckets that holds them (few distinct jit shapes), sorted.
    The indices are distinct, so the scatter back to [B, L] is deterministic. None when N would be
    every position (nothing to save: the caller takes the full-logits path)."""
    m = np.asarray(loss_mask).reshape(-1) > 0
    total = m.size
    step = max(1, -(-total // int(buckets)))
    n = max(step, -(-int(m.sum()) // step) * step)
    if n >= total:
        return None
    picked = np.flatnonzero(m)
    filler = np.flatnonzero(~m)[: n - picked.size]
    return np.sort(np.concatenate([picked, filler])).astype(np.int32)


def learner_model_config(cfg: Any, rl: Mapping[str, Any]) -> Any:
    """The model config the learner runs: dropless MoE impl, replay margin, no MTP forward."""
    return cfg.replace(**{"moe.impl": rl["learner_moe_impl"], "moe.replay_margin": rl["replay_margin"],
                          "mtp_depth": 0})


def device_batch(batch: Mapping[str, Any]) -> dict:
    """The jit inputs of a pad_batch dict (nested dicts kept, host-only keys dropped)."""
    return {k: v for k, v in batch.items() if k not in _HOST_ONLY}


@dataclasses.dataclass
class Learner:
    logp: Callable[..., tuple[jax.Array, dict]]
    update: Callable[..., tuple[TrainState, dict]]
    # (state, batch, logp_ref, version) -> (state, metrics, (logp, routes)): `update` that also returns
    # the logprobs [B, L] and routes its forward computed on the parameters *before* the update, so the
    # step's diagnostics need no forward of their own
    update_with_logp: Callable[..., tuple[TrainState, dict, tuple[jax.Array, jax.Array]]]
    grads: Callable[..., tuple[Any, dict]]  # (params, batch, logp_ref, version) -> (grads, metrics)
    loss_fn: Callable[..., tuple[jax.Array, dict]]
    cfg: Any
    tx: optax.GradientTransformation


def make_optimizer_for(params: Any, cfg: Any, rl: Mapping[str, Any]) -> optax.GradientTransformation:
    from c2jax.model.params_spec import logical_axes
    from c2jax.train import optim

    sched = optim.make_schedule({"name": "constant", "peak_lr": float(rl["learning_rate"]),
                                 "warmup_steps": int(rl["warmup_steps"])}, int(rl["steps"]))
    opt = {"name": "adamw", **dict(rl["optimizer"])}
    return optim.make_optimizer(opt, sched, params, trainable=rl_trainable_mask(cfg, rl), axes=logical_axes(cfg))


def rl_trainable_mask(cfg: Any, rl: Mapping[str, Any]) -> Any:
    """`trainable_mask(cfg)` (the router's selection bias frozen) with every parameter covered by an
    ``rl.frozen`` entry (a glob over '/'-joined paths or a group / path prefix, e.g. ``lm_head`` or
    ``*/attn/*``) frozen too. An entry that covers no parameter raises."""
    from c2jax.model.params_spec import trainable_mask
    from c2jax.rl.stage_config import frozen_match, path_name

    frozen = tuple(rl.get("frozen", ()) or ())
    mask = trainable_mask(cfg)
    if not frozen:
        return mask
    hit = {p: False for p in frozen}

    def one(path, trainable):
        covered = [p for p in frozen if frozen_match(p, path_name(path))]
        for p in covered:
            hit[p] = True
        return bool(trainable) and not covered

    out = jax.tree_util.tree_map_with_path(one, mask)
    missing = [p for p, h in hit.items() if not h]
    if missing:
        raise ValueError(f"rl.frozen: {missing} match no parameter of this model")
    return out


def make_learner(model_cfg: Any, rl: Mapping[str, Any], params: Any) -> Learner:
    """Build the learner's jitted functions for the resolved ``rl`` section `rl`."""
    from c2jax.model.transformer import apply, lm_head_logits

    cfg = learner_model_config(model_cfg, rl)
    temperature = float(rl["temperature"])
    # The normaliser counts rows of rl.max_len positions even when a step's rows are fitted shorter
    # (rl.learner_row_multiple): fitting changes the compute, not the loss.
    loss_fn = make_rl_loss(rl, row_capacity=int(rl["max_len"]) if "max_len" in rl else None)
    replay_default = bool(rl["router_replay"])
    tx = make_optimizer_for(params, cfg, rl)

    def forward(params, batch, replay: bool):
        routes = batch.get("routes") if replay else None
        out = apply(params, batch["tokens"], cfg, segment_ids=batch["segment_ids"], positions=batch["positions"],
                    routes=routes)
        idx = batch.get("lp_index")  # [N] flat positions (logprob_positions) or absent: all positions
        if idx is None:
            return token_logprobs(out["logits"], batch["targets"], temperature), out  # [B, L]
        b, l = batch["targets"].shape
        h = out["hidden"].reshape(b * l, -1)[idx]  # [N, D]
        lp = token_logprobs(lm_head_logits(params, h), batch["targets"].reshape(-1)[idx], temperature)  # [N]
        return jnp.zeros((b * l,), jnp.float32).at[idx].set(lp, unique_indices=True).reshape(b, l), out

    @jax.jit
    def _logp_replay(params, batch):
        logp, out = forward(params, batch, True)
        return logp, {"routes": out["routes"], "replaced_fraction": out["replaced_fraction"]}

    @jax.jit
    def _logp_free(params, batch):
        logp, out = forward(params, batch, False)
        return logp, {"routes": out["routes"], "replaced_fraction": out["replaced_fraction"]}

    with_entropy = dict(rl.get("token_filter") or {}).get("name", "none") != "none"

    def prepared(batch):
        """device_batch plus ``lp_index`` (LOGITS_AT; not with the entropy token filter, which reads
        every position's full distribution)."""
        b = device_batch(batch)
        if LOGITS_AT == "loss_positions" and not with_entropy and "lp_index" not in b:
            idx = logprob_positions(b["loss_mask"])
            if idx is not None:
                b["lp_index"] = idx
        return b

    def logp(params, batch, replay: bool | None = None):
        replay = replay_default if replay is None else replay
        batch = prepared(batch)
        if replay and "routes" not in batch:
            raise ValueError("router replay needs batch['routes'] (the sampler's routes); pad_batch adds them "
                             "only when every trajectory recorded routes")
        return (_logp_replay if replay else _logp_free)(params, batch)

    def objective(params, batch, logp_ref, version):
        lp, out = forward(params, batch, replay_default)
        if with_entropy:  # the token filter ranks policy tokens by the policy's entropy (no gradient)
            batch = {**batch, "token_entropy": jax.lax.stop_gradient(token_entropy(out["logits"], temperature))}
        loss, metrics = loss_fn(lp, batch, logp_ref=logp_ref, current_version=version)
        return loss, (metrics, (jax.lax.stop_gradient(lp), out["routes"]))

    grad_fn = jax.value_and_grad(objective, has_aux=True)

    def _update_impl(state: TrainState, batch, logp_ref, version):
        (loss, (metrics, seen)), grads = grad_fn(state.params, batch, logp_ref, version)
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["loss"] = loss
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["update_norm"] = optax.global_norm(updates)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics, seen

    _update = jax.jit(lambda state, batch, logp_ref, version: _update_impl(state, batch, logp_ref, version)[:2])
    _update_seen = jax.jit(_update_impl)

    def update(state: TrainState, batch, logp_ref=None, version: int = 0):
        b = prepared(batch)
        ref = None if logp_ref is None else jnp.asarray(logp_ref)
        return _update(state, b, ref, jnp.asarray(version, jnp.int32))

    def update_with_logp(state: TrainState, batch, logp_ref=None, version: int = 0):
        b = prepared(batch)
        if replay_default and "routes" not in b:
            raise ValueError("router replay needs batch['routes'] (the sampler's routes)")
        ref = None if logp_ref is None else jnp.asarray(logp_ref)
        return _update_seen(state, b, ref, jnp.asarray(version, jnp.int32))

    @jax.jit
    def _grads(params, batch, logp_ref, version):
        (_, (metrics, _seen)), g = grad_fn(params, batch, logp_ref, version)
        return g, metrics

    def grads(params, batch, logp_ref=None, version: int = 0):
        ref = None if logp_ref is None else jnp.asarray(logp_ref)
        return _grads(params, prepared(batch), ref, jnp.asarray(version, jnp.int32))

    return Learner(logp=logp, update=update, update_with_logp=update_with_logp, grads=grads, loss_fn=loss_fn, cfg=cfg, tx=tx)


def mismatch_stats(logp: np.ndarray, sampler_logp: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """|log pi_learner - log pi_sampler| over policy tokens: mean and p99."""
    m = np.asarray(mask) > 0
    d = np.abs(np.asarray(logp, np.float64) - np.asarray(sampler_logp, np.float64))[m]
    d = d[np.isfinite(d)]
    if d.size == 0:
        return {"mean": 0.0, "p99": 0.0}
    return {"mean": float(d.mean()), "p99": float(np.quantile(d, 0.99))}


def route_flip_rate(learner_routes: np.ndarray, sampler_routes: np.ndarray, mask: np.ndarray) -> float:
    """Share of (token, MoE layer) pairs where the learner's own top-k expert SET differs from the
    sampler's, over positions with a real input token ([B, L, nL, K] each; mask [B, L])."""
    a = np.sort(np.asarray(learner_routes), -1)
    b = np.sort(np.asarray(sampler_routes), -1)
    m = np.asarray(mask) > 0
    if not m.any() or a.shape[2] == 0:
        return 0.0
    differ = (a != b).any(-1)  # [B, L, nL]
    return float(differ[m].mean())
