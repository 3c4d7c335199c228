"""Loss terms for language-model training, picked by name from the config and summed with weights.

Every term is a pure function ``fn(outputs, batch, **cfg) -> (scalar, metrics)``:

* ``outputs`` is the dict returned by ``c2jax.model.apply``: ``logits`` [B, S, V], ``mtp_logits``
  [D, B, S, V] (MTP depth d = index d-1; position i of depth d predicts the token at i + d + 1,
  i.e. ``targets[i + d]``), ``router_scores`` [L, B, S, E] (sigmoid affinities of every MoE layer,
  differentiable), ``routes`` [B, S, L, K] (selected expert ids), ``expert_counts`` [L, E],
  ``balance_loss`` (the model's own coefficient-weighted sequence-wise balance loss, main + MTP).
* ``batch`` is the packed training batch: ``tokens`` [B, S] (model input), ``targets`` [B, S]
  (next token, ``targets[:, i] == tokens[:, i + 1]`` inside a document), ``loss_mask`` [B, S]
  (1 where ``targets`` counts: not padding, not a document's last token, only assistant tokens in
  SFT), ``segment_ids`` [B, S] (document id per token, 0 = padding), ``positions`` [B, S].

The config names the terms and their weights::

    config.train.loss = {"xent": {"weight": 1.0},
                         "z_loss": {"weight": 1e-4},
                         "moe_seq_balance": {"weight": 1e-4},
                         "mtp_distill": {"weight": 0.3}}

`combined_loss` evaluates each named term and returns ``sum(weight * term)`` plus a flat metric
dict (``loss/<term>`` for each term's value, and whatever extra metrics the term reports).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from c2jax.registry import Registry

LossFn = Callable[..., "tuple[jax.Array, dict[str, jax.Array]]"]
LOSSES: Registry[LossFn] = Registry("loss_term")


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x`` over entries where ``mask`` is nonzero (0 when the mask is empty)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(x.astype(jnp.float32) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token negative log-likelihood, in float32. logits [..., V], targets [...] -> [...]."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)  # [...]
    tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return lse - tgt


@LOSSES.register("xent")
def next_token_xent(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy of the main head, averaged over ``loss_mask`` tokens."""
    nll = token_nll(outputs["logits"], batch["targets"])  # [B, S]
    mask = batch["loss_mask"]
    loss = masked_mean(nll, mask)
    return loss, {"tokens": jnp.sum(mask.astype(jnp.float32))}


@LOSSES.register("z_loss")
def z_loss(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """PaLM z-loss: mean of logsumexp(logits)^2, keeps the softmax normaliser near 1."""
    lse = jax.nn.logsumexp(outputs["logits"].astype(jnp.float32), axis=-1)  # [B, S]
    return masked_mean(jnp.square(lse), batch["loss_mask"]), {}


def _valid_tokens(batch: Mapping[str, Any]) -> jax.Array:
    """[B, S] float: 1 for real (non-padding) tokens."""
    if "segment_ids" in batch:
        return (batch["segment_ids"] > 0).astype(jnp.float32)
    return jnp.ones(batch["tokens"].shape, jnp.float32)


@LOSSES.register("moe_seq_balance")
def moe_sequence_balance(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """DeepSeek-V3's complementary sequence-wise balance loss, averaged over MoE layers and rows.

    Per sequence (row) of T real tokens and layer: ``f_e = E / (K T) * #{t: e in top-k(t)}``,
    ``P_e = mean_t s'_{t,e}`` with ``s'`` the affinities normalised over experts; the loss is
    ``sum_e f_e P_e`` (1 for a perfectly balanced router, E/K when one set of experts takes all).
    Uses ``router_scores`` [L, B, S, E] and ``routes`` [B, S, L, K] of the main MoE layers.
    """
    scores = outputs.get("router_scores")
    routes = outputs.get("routes")
    if scores is None or routes is None or scores.shape[0] == 0:
        return jnp.zeros((), jnp.float32), {}
    scores = scores.astype(jnp.float32)  # [L, B, S, E]
    routes = jnp.moveaxis(routes, 2, 0)  # [L, B, S, K]
    E, K = scores.shape[-1], routes.shape[-1]
    valid = _valid_tokens(batch)[None, :, :, None]  # [1, B, S, 1]
    T = jnp.maximum(jnp.sum(valid, axis=2), 1.0)  # [1, B, 1]
    chosen = jnp.sum(jax.nn.one_hot(routes, E, dtype=jnp.float32), axis=-2)  # [L, B, S, E]
    f = E / (K * T) * jnp.sum(jax.lax.stop_gradient(chosen) * valid, axis=2)  # [L, B, E]
    s_norm = scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1e-9)
    p = jnp.sum(s_norm * valid, axis=2) / T  # [L, B, E]
    per_row = jnp.sum(f * p, axis=-1)  # [L, B]
    return jnp.mean(per_row), {"max_load_frac": jnp.max(f) / E * K}


@LOSSES.register("model_balance_loss")
def model_balance_loss(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """The model's own ``balance_loss`` output (``model.moe.seq_aux_loss_coef`` times the
    sequence-wise balance loss averaged over main and MTP MoE layers); weight it 1.0."""
    v = outputs.get("balance_loss")
    return (jnp.zeros((), jnp.float32) if v is None else jnp.asarray(v, jnp.float32)), {}


def mtp_targets_mask(batch: Mapping[str, Any], depth: int) -> jax.Array:
    """[B, S] float: 1 where MTP depth ``depth`` at position i has a valid target (targets[i+depth]
    exists, lies in the same document, and counts in the loss)."""
    seg = batch["segment_ids"] if "segment_ids" in batch else jnp.ones(batch["tokens"].shape, jnp.int32)
    mask = batch["loss_mask"].astype(jnp.float32)
    S = seg.shape[1]
    d = depth
    if d >= S:
        return jnp.zeros(seg.shape, jnp.float32)
    same = (seg[:, d:] == seg[:, :-d]) & (seg[:, :-d] > 0)  # [B, S-d]
    m = same.astype(jnp.float32) * mask[:, d:] * mask[:, :-d]
    return jnp.pad(m, ((0, 0), (0, d)))


def _shift_left(x: jax.Array, d: int) -> jax.Array:
    """x[:, i] <- x[:, i + d] along axis 1, zero-padded at the end."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, d)
    return jnp.pad(x[:, d:], pad)


@LOSSES.register("mtp_distill")
def mtp_self_distillation(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """MTP self-distillation: depth d at position i learns the main head's full distribution at
    position i + d (which predicts the same token), held fixed by stop-gradient.

    Loss = KL(sg(p_main[i+d]) || p_mtp_d[i]) averaged over valid positions and depths; it is exactly
    zero when the MTP logits equal the shifted main logits, so only the MTP layers learn from it.
    """
    mtp = outputs.get("mtp_logits")
    if mtp is None or mtp.shape[0] == 0:
        return jnp.zeros((), jnp.float32), {}
    main_logp = jax.nn.log_softmax(jax.lax.stop_gradient(outputs["logits"]).astype(jnp.float32), -1)
    total = jnp.zeros((), jnp.float32)
    metrics = {}
    for k in range(mtp.shape[0]):
        d = k + 1
        teacher = _shift_left(main_logp, d)  # [B, S, V]
        student = jax.nn.log_softmax(mtp[k].astype(jnp.float32), -1)  # [B, S, V]
        kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)  # [B, S]
        m = mtp_targets_mask(batch, d)
        v = masked_mean(kl, m)
        metrics[f"depth{d}"] = v
        total = total + v
    return total / mtp.shape[0], metrics


@LOSSES.register("mtp_xent")
def mtp_hard_xent(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
    """DeepSeek-V3's original MTP loss: cross-entropy of depth d at i against ``targets[i + d]``."""
    mtp = outputs.get("mtp_logits")
    if mtp is None or mtp.shape[0] == 0:
        return jnp.zeros((), jnp.float32), {}
    total = jnp.zeros((), jnp.float32)
    metrics = {}
    for k in range(mtp.shape[0]):
        d = k + 1
        tgt = _shift_left(batch["targets"], d)
        v = masked_mean(token_nll(mtp[k], tgt), mtp_targets_mask(batch, d))
        metrics[f"depth{d}"] = v
        total = total + v
    return total / mtp.shape[0], metrics


def normalise_loss_config(loss_cfg: Any) -> dict[str, dict[str, Any]]:
    """``{term: {weight, **kwargs}}`` from a ConfigDict/dict; a bare number means the weight."""
    if hasattr(loss_cfg, "to_dict"):
        loss_cfg = loss_cfg.to_dict()
    out: dict[str, dict[str, Any]] = {}
    for name, spec in dict(loss_cfg).items():
        if isinstance(spec, (int, float)):
            spec = {"weight": float(spec)}
        spec = dict(spec)
        spec.setdefault("weight", 1.0)
        out[name] = spec
    return out


def combined_loss(outputs: Mapping[str, Any], batch: Mapping[str, Any], loss_cfg: Any,
                  gates: Mapping[str, jax.Array] | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted sum of the configured loss terms; metrics ``loss/<term>`` and ``<term>/<metric>``.

    ``gates``: optional traced multipliers per term (e.g. 0 before the step MTP training starts).
    """
    total = jnp.zeros((), jnp.float32)
    metrics: dict[str, jax.Array] = {}
    for name, spec in normalise_loss_config(loss_cfg).items():
        spec = dict(spec)
        weight = spec.pop("weight")
        value, extra = LOSSES.get(name)(outputs, batch, **spec)
        metrics[f"loss/{name}"] = value
        for k, v in extra.items():
            metrics[f"{name}/{k}"] = v
        if weight:
            g = 1.0 if gates is None or name not in gates else gates[name]
            total = total + weight * g * value
    metrics["loss/total"] = total
    return total, metrics
