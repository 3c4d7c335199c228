"""The composed RL loss: rewards -> (KL in reward) -> advantages -> policy objective -> aggregation (+ KL in loss).

    loss_fn = make_rl_loss(config.rl)              # pieces picked by name, weights from the config
    loss, metrics = loss_fn(logp, batch, logp_ref=logp_ref)   # jit/grad-compatible

`logp` [B, L] is the learner's log pi(targets[b, t] | context) for the batch from
`c2jax.batching.pad_batch` (the model forward is the trainer's job); `logp_ref` [B, L] is the
reference policy's, needed only when the KL coefficient is > 0; `old_logp` [B, L] is an optional
proximal policy for ``ppo``/``cispo`` (defaults to the behaviour logprobs); `current_version`
(the learner's weight version) adds staleness metrics from the per-token policy versions. The config is read
once, outside jit, so the returned function is pure and static-shaped.

Which sampler logprob is "behaviour": the sampler reports, per token, the logprob under the
distribution it actually sampled from (temperature, top-k/top-p; `behaviour_logp`) and under the
raw model (temperature 1; `raw_logp`). ``behaviour_logprobs="sampling"`` (default) is right when
`logp` is computed at the sampling temperature without truncation (`token_logprobs(..., temperature)`);
``"raw"`` compares the learner's raw logprob with the sampler's raw one, so ratios measure only
staleness and train/inference numerics, whatever the sampling settings.

Masking: tokens of N-axis padding, infrastructure-failed trajectories, trajectories whose total
reward is not finite and, only if ``overlong_mask=True`` (off by default, as in Composer 2),
truncated trajectories are excluded from the loss (and counted in the metrics); tokens off the loss
mask (prompts, tool outputs, padding) never reach the gradient, even if their logprob is NaN.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from c2jax.config import to_plain
from c2jax.rl.advantages import ADVANTAGES
from c2jax.rl.aggregation import AGGREGATIONS
from c2jax.rl.kl import KL_PLACEMENTS, kl_loss_per_token, kl_metrics, kl_reward_penalty
from c2jax.rl.objectives import POLICY_LOSSES
from c2jax.rl.rewards import compute_rewards

# Defaults follow the Composer 2 report: GRPO mean baseline without std division, plain policy
# gradient, constant normaliser (Dr. GRPO), k1 KL (coefficient not disclosed; 0 = off) in the reward.
DEFAULT_RL_CONFIG: dict[str, Any] = dict(
    group_size=8,  # rollouts per prompt (used by the sampler; the loss handles any group size >= 2)
    behaviour_logprobs="sampling",  # which sampler logprob the ratios use: "sampling" or "raw" (see below)
    overlong_mask=False,  # DAPO-style masking of truncated rollouts; the report found no benefit
    advantage=dict(name="grpo", std_normalize=False, scale=1.0, positive_weight=1.0, k=1),
    objective=dict(name="pg", tis_cap=None),
    aggregation=dict(name="constant", constant=None),
    kl=dict(coef=0.0, estimator="k1", placement="reward", log_ratio_clip=20.0),
    rewards=dict(task=dict(weight=1.0)),
    # which policy tokens carry the policy-gradient term: "none" = all of them; "top_entropy" = the
    # `fraction` of the batch's policy tokens with the highest policy entropy (Wang et al. 2025, "Beyond
    # the 80/20 rule": the forking tokens carry RL's signal; the rest add noise). KL terms keep all tokens.
    token_filter=dict(name="none", fraction=0.2),
)
TOKEN_FILTERS = ("none", "top_entropy")


def top_fraction_mask(score: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
    """[B, L] 1.0 on the ceil(fraction * n) tokens under `mask` (n of them) with the highest `score`
    (ties at the threshold all kept), 0 elsewhere."""
    live = mask > 0
    flat = jnp.where(live, score, -jnp.inf).reshape(-1)
    n = jnp.sum(live)
    k = jnp.clip(jnp.ceil(fraction * n).astype(jnp.int32), 1, flat.shape[0])
    thr = jnp.take(-jnp.sort(-flat), k - 1)  # the k-th highest live score
    return (live & (score >= thr)).astype(mask.dtype)


def token_entropy(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Entropy (nats) of softmax(logits / temperature) in float32: [..., V] -> [...]."""
    z = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def resolve_rl_config(cfg: Any = None) -> dict[str, Any]:
    """DEFAULT_RL_CONFIG updated (one level deep per section) with `cfg`."""
    out = copy.deepcopy(DEFAULT_RL_CONFIG)
    for k, v in (to_plain(cfg) or {}).items():
        if k == "rewards":
            out[k] = dict(v)  # the reward terms are replaced as a whole, never merged
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def rl_config_dict(**overrides: Any):
    """DEFAULT_RL_CONFIG (with `overrides`) as an `ml_collections.ConfigDict` for experiment configs.

    Fields that default to None (tis_cap, constant) accept any value from the command line
    (`--config.rl.objective.tis_cap=2.0`); options a piece adds (e.g. ppo's clip_low/clip_high) must
    be present in the config file before a locked config can override them.
    """
    import ml_collections

    return ml_collections.ConfigDict(resolve_rl_config(overrides))


def _gather(per_traj: jax.Array, traj_index: jax.Array) -> jax.Array:
    """[N] -> [B, L]: the value of each token's trajectory, 0 at padding (traj_index = -1)."""
    return jnp.where(traj_index >= 0, per_traj[jnp.clip(traj_index, 0)], 0.0)


def make_rl_loss(cfg: Any = None, *, row_capacity: int | None = None) -> Callable[..., tuple[jax.Array, dict]]:
    """Build `loss_fn(logp, batch, logp_ref=None, old_logp=None, current_version=None) -> (scalar, metrics)`.

    `cfg` is the `rl` config section (ConfigDict or dict; missing keys take DEFAULT_RL_CONFIG).
    `row_capacity`: the positions per row that the ``constant`` aggregation's default normaliser
    C = B * L counts (None: the batch's own row length L). The RL learner passes ``rl.max_len``, so a
    batch whose rows are fitted to its trajectories (``rl.learner_row_multiple``) keeps the normaliser
    of full-length rows: the same loss, whatever length the rows were cut to.
    Unknown names raise here, before any tracing; shape and missing-key errors raise at trace time.
    """
    c = resolve_rl_config(cfg)
    adv_cfg = dict(c["advantage"])
    adv_fn = ADVANTAGES.get(adv_cfg.pop("name"))
    obj_cfg = dict(c["objective"])
    obj_fn = POLICY_LOSSES.get(obj_cfg.pop("name"))
    agg_cfg = dict(c["aggregation"])
    agg_name = agg_cfg.pop("name")
    agg_fn = AGGREGATIONS.get(agg_name)
    if row_capacity is not None and (isinstance(row_capacity, bool) or int(row_capacity) < 1):
        raise ValueError(f"row_capacity must be a positive int or None, got {row_capacity!r}")
    kl_cfg = dict(c["kl"])
    coef = float(kl_cfg.get("coef", 0.0))
    kind = kl_cfg.get("estimator", "k1")
    placement = kl_cfg.get("placement", "reward")
    clip = kl_cfg.get("log_ratio_clip", None)
    if placement not in KL_PLACEMENTS:
        raise ValueError(f"rl.kl.placement must be one of {KL_PLACEMENTS}, got {placement!r}")
    reward_cfg = c["rewards"]
    overlong_mask = bool(c.get("overlong_mask", False))
    token_filter = dict(c.get("token_filter") or {"name": "none"})
    filter_name = token_filter.get("name", "none")
    if filter_name not in TOKEN_FILTERS:
        raise ValueError(f"rl.token_filter.name must be one of {TOKEN_FILTERS}, got {filter_name!r}")
    tf_fraction = float(token_filter.get("fraction", 0.2))
    if filter_name != "none" and not 0.0 < tf_fraction <= 1.0:
        raise ValueError(f"rl.token_filter.fraction must be in (0, 1], got {tf_fraction}")
    beh_key = {"sampling": "behaviour_logp", "raw": "raw_logp"}.get(c.get("behaviour_logprobs", "sampling"))
    if beh_key is None:
        raise ValueError(f"rl.behaviour_logprobs must be 'sampling' or 'raw', got {c.get('behaviour_logprobs')!r}")

    def loss_fn(logp: jax.Array, batch: Mapping[str, Any], logp_ref: jax.Array | None = None,
                old_logp: jax.Array | None = None, current_version: jax.Array | int | None = None
                ) -> tuple[jax.Array, dict]:
        if logp.shape != batch["loss_mask"].shape:
            raise ValueError(f"logp shape {logp.shape} != batch['loss_mask'] shape {batch['loss_mask'].shape}")
        if coef > 0 and logp_ref is None:
            raise ValueError("rl.kl.coef > 0 needs logp_ref (the reference policy's logprobs)")
        if beh_key not in batch:
            raise KeyError(f"rl.behaviour_logprobs needs batch[{beh_key!r}]; pad_batch adds 'raw_logp' only "
                           f"when every segment has raw_logprobs")
        behaviour_logp = batch[beh_key]  # [B, L]
        ti = batch["traj_index"]  # [B, L]
        n = batch["traj_valid"].shape[0]
        valid = batch["traj_valid"] * (1.0 - batch["infra_failed"])  # [N]
        truncated = batch.get("truncated")
        if overlong_mask and truncated is not None:
            valid = valid * (1.0 - truncated)
        rewards, metrics = compute_rewards(batch, reward_cfg, valid)  # [N]
        base_mask = batch["loss_mask"] * _gather(valid, ti)  # [B, L]
        if coef > 0 and placement == "reward":
            pen = kl_reward_penalty(logp, logp_ref, base_mask, ti, n, kind=kind, coef=coef, log_ratio_clip=clip)
            rewards = rewards - pen
            metrics["kl/reward_penalty"] = jnp.sum(pen * valid) / jnp.maximum(valid.sum(), 1.0)
        adv, am = adv_fn(rewards, batch["group_index"], valid, **adv_cfg)  # [N]
        if "group_weight" in batch:  # rl.task_weights: each group's advantages times its task's weight
            adv = adv * batch["group_weight"]  # [N]
            am["adv/group_weight_mean"] = jnp.sum(batch["group_weight"] * valid) / jnp.maximum(valid.sum(), 1.0)
        metrics.update(am)
        usable = valid * jnp.isfinite(rewards)
        mask = batch["loss_mask"] * _gather(usable, ti)  # [B, L]
        adv_tok = _gather(adv, ti)  # [B, L]
        per_tok, om = obj_fn(logp, adv_tok, mask, behaviour_logp, old_logp=old_logp, **obj_cfg)
        metrics.update(om)
        agg_kw = dict(agg_cfg)
        if agg_name == "constant" and agg_kw.get("constant") is None and row_capacity is not None:
            agg_kw["constant"] = float(mask.shape[0] * int(row_capacity))  # B x full row, static
        pg_mask = mask
        if filter_name == "top_entropy":
            if "token_entropy" not in batch:
                raise KeyError("rl.token_filter 'top_entropy' needs batch['token_entropy'] [B, L] (the RL "
                               "learner adds the policy's entropy at each position)")
            pg_mask = mask * top_fraction_mask(jax.lax.stop_gradient(batch["token_entropy"]), mask, tf_fraction)
            metrics["token_filter/kept_fraction"] = pg_mask.sum() / jnp.maximum(mask.sum(), 1.0)
        pg = agg_fn(per_tok, pg_mask, ti, n, **agg_kw)
        loss = pg
        metrics["loss/pg"] = pg
        if coef > 0 and placement == "loss":
            kl_term = coef * agg_fn(kl_loss_per_token(logp, logp_ref, mask, kind=kind, log_ratio_clip=clip),
                                    mask, ti, n, **agg_kw)
            loss = loss + kl_term
            metrics["loss/kl"] = kl_term
        if logp_ref is not None:
            metrics.update(kl_metrics(logp, logp_ref, mask))
        ntok = jnp.maximum(mask.sum(), 1.0)
        diff = jnp.where(mask > 0, jax.lax.stop_gradient(logp) - behaviour_logp, 0.0)
        metrics["mismatch/abs_logp_diff"] = jnp.sum(jnp.abs(diff)) / ntok
        metrics["batch/policy_tokens"] = mask.sum()
        if current_version is not None and "versions" in batch:
            lag = jnp.where(mask > 0, current_version - batch["versions"], 0)  # [B, L] weight updates behind
            metrics["staleness/mean"] = jnp.sum(lag) / ntok
            metrics["staleness/max"] = jnp.max(lag).astype(jnp.float32)
        metrics["batch/infra_failed"] = jnp.sum(batch["infra_failed"] * batch["traj_valid"])
        if truncated is not None:
            metrics["batch/truncated"] = jnp.sum(truncated * batch["traj_valid"])
        metrics["batch/trajectories"] = jnp.sum(usable)
        metrics["loss/total"] = loss
        return loss, metrics

    return loss_fn


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature)[target] in float32: [..., V], [...] -> [...]."""
    z = logits.astype(jnp.float32) / temperature
    tgt = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return tgt - jax.nn.logsumexp(z, axis=-1)


def rl_loss_from_outputs(cfg: Any = None, *, temperature: float = 1.0) -> Callable[..., tuple[jax.Array, dict]]:
    """The RL loss in the `c2jax.losses` convention `fn(outputs, batch) -> (scalar, metrics)`.

    logp comes from outputs["logits"] [B, L, V] and batch["targets"]; optional batch["logp_ref"]
    and batch["old_logp"] [B, L] are the reference and proximal logprobs (precomputed, no gradient).
    """
    loss_fn = make_rl_loss(cfg)

    def fn(outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[jax.Array, dict]:
        logp = token_logprobs(outputs["logits"], batch["targets"], temperature)  # [B, L]
        return loss_fn(logp, batch, batch.get("logp_ref"), batch.get("old_logp"))

    return fn
