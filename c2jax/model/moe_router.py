"""The DeepSeek-V3 MoE router and everything that acts on routing decisions.

* `route`: sigmoid scores, selection with the correction bias (selection only: the bias never
  enters the gate weights), group-limited top-k (keep the `topk_group` of `n_group` expert groups
  whose top-2 biased scores sum highest, then top-k within them), gate weights = the unbiased
  scores of the chosen experts, normalised to sum 1 (`norm_topk_prob`) and times
  `routed_scaling_factor`. Matches HF `DeepseekV3TopkRouter` (its expert order within a token may
  differ; the chosen set is the same; ours is sorted by biased score, descending).
* `replay_routes`: router replay for RL: use recorded experts, gate weights from this router's
  scores (so the router keeps its gradient); optional plausibility check (`replay_margin`).
* `update_router_bias`: the aux-loss-free balancing rule, a pure function of `expert_counts`,
  applied outside the gradient.
* `sequence_balance_loss`: DeepSeek-V3's optional sequence-wise balance loss.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from c2jax.model.config import MoEConfig


def router_scores(p_router: dict, x: jax.Array) -> jax.Array:
    """x [N, D] -> sigmoid scores [N, E] in float32 (router matmul in float32, as HF)."""
    logits = x.astype(jnp.float32) @ p_router["kernel"].astype(jnp.float32)
    return jax.nn.sigmoid(logits)


def _choice_scores(scores: jax.Array, bias: jax.Array, m: MoEConfig) -> jax.Array:
    """Biased scores with experts outside the chosen groups set to -inf. [N, E] -> [N, E]."""
    choice = scores + jax.lax.stop_gradient(bias.astype(jnp.float32))[None]
    if m.n_group > 1 and m.topk_group < m.n_group:
        n, e = choice.shape
        grouped = choice.reshape(n, m.n_group, e // m.n_group)
        top2 = jax.lax.top_k(grouped, min(2, e // m.n_group))[0].sum(-1)  # [N, G]
        _, gidx = jax.lax.top_k(top2, m.topk_group)  # [N, topk_group]
        # [N, G]: the chosen groups, by comparison rather than a scatter at (row, group), which the SPMD
        # partitioner cannot split over sharded rows (it gathered every token's scores to every device)
        gmask = (gidx[:, :, None] == jnp.arange(m.n_group)[None, None, :]).any(1)
        choice = jnp.where(jnp.repeat(gmask, e // m.n_group, axis=1), choice, -jnp.inf)
    return choice


def gate_weights(scores: jax.Array, idx: jax.Array, m: MoEConfig) -> jax.Array:
    """Gate weights [N, k] from unbiased scores [N, E] at experts idx [N, k]."""
    w = jnp.take_along_axis(scores, idx, axis=1)
    if m.norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    return w * m.routed_scaling_factor


def route(scores: jax.Array, bias: jax.Array, m: MoEConfig) -> tuple[jax.Array, jax.Array]:
    """scores [N, E] (f32), bias [E] -> (experts idx [N, k] int32, gate weights [N, k] f32)."""
    choice = _choice_scores(jax.lax.stop_gradient(scores), bias, m)
    _, idx = jax.lax.top_k(choice, m.top_k)
    idx = idx.astype(jnp.int32)
    return idx, gate_weights(scores, idx, m)


def replay_routes(scores: jax.Array, bias: jax.Array, routes: jax.Array, m: MoEConfig
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router replay: experts from `routes` [N, k] (recorded by a sampler), weights from `scores`.

    With ``m.replay_margin = None`` the recorded experts are used as given. With a margin
    ``delta >= 0``, a recorded expert whose biased score is below this router's own
    k-th score minus delta is implausible: it is replaced by this router's best own choice not
    already among the kept recorded experts (so the k experts stay distinct).
    Returns (idx [N, k] int32, weights [N, k] f32, replaced [N, k] bool)."""
    routes = routes.astype(jnp.int32)
    replaced = jnp.zeros(routes.shape, bool)
    if m.replay_margin is not None:
        choice = _choice_scores(jax.lax.stop_gradient(scores), bias, m)
        own_val, own = jax.lax.top_k(choice, m.top_k)  # [N, k] sorted descending
        kth = own_val[:, -1:]
        # the recorded expert's biased score (not group-masked: a recorded expert outside this
        # router's chosen groups is judged by its score like any other)
        biased = jax.lax.stop_gradient(scores) + jax.lax.stop_gradient(bias.astype(jnp.float32))[None]
        rec = jnp.take_along_axis(biased, routes, axis=1)
        keep = rec >= kth - m.replay_margin  # [N, k]
        replaced = ~keep
        # candidates: own experts not among kept recorded experts, in own-score order
        in_kept = ((own[:, :, None] == routes[:, None, :]) & keep[:, None, :]).any(-1)  # [N, k]
        cand = ~in_kept
        cand_rank = jnp.cumsum(cand, axis=1) - 1  # rank among candidates
        slot_rank = jnp.cumsum(replaced, axis=1) - 1  # rank among replaced slots
        # for each replaced slot j, pick the candidate whose rank equals slot_rank[j]
        match = cand[:, None, :] & (cand_rank[:, None, :] == slot_rank[:, :, None])  # [N, k, k]
        fill = jnp.take_along_axis(own, jnp.argmax(match, axis=-1), axis=1)
        routes = jnp.where(replaced, fill, routes).astype(jnp.int32)
    return routes, gate_weights(scores, routes, m), replaced


def expert_counts(idx: jax.Array, valid: jax.Array, n_experts: int) -> jax.Array:
    """Number of (valid token, slot) assignments per expert. idx [N, k], valid [N] -> [E] int32."""
    onehot_w = jnp.broadcast_to(valid[:, None], idx.shape).astype(jnp.int32).reshape(-1)
    return jnp.zeros((n_experts,), jnp.int32).at[idx.reshape(-1)].add(onehot_w)


def update_router_bias(params: dict, counts: Any, rate: float) -> dict:
    """Aux-loss-free load balancing (DeepSeek-V3): bias_e += rate * sign(mean_count - count_e).

    `counts` is `apply(...)['expert_counts']` ([n_moe_layers, E]); if the output also carried
    `mtp_expert_counts` ([mtp_depth, E]) pass a dict ``{'moe_layers': c, 'mtp': c_mtp}``.
    Pure: returns a new params tree, only the router biases differ. Call it outside the gradient
    (e.g. after the optimizer update)."""
    if not isinstance(counts, dict):
        counts = {"moe_layers": counts}
    out = dict(params)
    for key, c in counts.items():
        if c is None or key not in params:
            continue
        c = c.astype(jnp.float32)  # [L, E]
        delta = rate * jnp.sign(c.mean(-1, keepdims=True) - c)
        sub = params[key]["layer"] if key == "mtp" else params[key]
        moe = sub["moe"]
        new_router = dict(moe["router"], bias=(moe["router"]["bias"] + delta.astype(moe["router"]["bias"].dtype)))
        new_sub = dict(sub, moe=dict(moe, router=new_router))
        out[key] = dict(params[key], layer=new_sub) if key == "mtp" else new_sub
    return out


def sequence_balance_loss(scores: jax.Array, idx: jax.Array, valid: jax.Array, m: MoEConfig) -> jax.Array:
    """DeepSeek-V3 sequence-wise balance loss (without its coefficient), averaged over sequences.

    scores [B, S, E] (unbiased sigmoid), idx [B, S, k], valid [B, S] bool ->
    mean_b sum_e f_e P_e with f_e = E/(k T) * #{t: e in topk_t}, P_e = mean_t s_te / sum_j s_tj."""
    e, k = scores.shape[-1], idx.shape[-1]
    v = valid.astype(jnp.float32)
    t = jnp.maximum(v.sum(-1), 1.0)  # [B]
    hits = jax.nn.one_hot(idx, e, dtype=jnp.float32).sum(-2) * v[..., None]  # [B, S, E]
    f = hits.sum(1) * (e / (k * t[:, None]))  # [B, E]
    sn = scores / (scores.sum(-1, keepdims=True) + 1e-20)
    p = (sn * v[..., None]).sum(1) / t[:, None]  # [B, E]
    return jnp.mean(jnp.sum(f * p, -1))

