"""Reward terms and their weighted sum: R_i = sum_label weight_label * term_label(batch)_i.

Every term maps the padded batch (`c2jax.batching.pad_batch`) to one value per trajectory [N]
and is reported separately in the metrics (``reward/<label>``), so a researcher sees which term
moves. Registered terms (REWARD_TERMS):

* ``term``: a value the grader or a behaviour monitor stored in the trajectory's `reward_terms`
  (``key`` defaults to the label). The task reward from the hidden tests is ``task``; behaviour
  monitors write e.g. ``comment_reasoning`` (chain of thought dumped into code comments),
  ``terminal_only`` (collapsing to the terminal tool), ``unfinished_todos`` (report 3.4); give them
  a weight in the config. A missing key fails at trace time naming it.
* ``length_penalty``: -C_{k,q}(x) with x = sum_f w_f * effort_f over EFFORT_FIELDS (report 3.4),
  C_{k,q}(x) = ((1 + k x)^(1-q) - 1) / (k (1 - q)). Positive config weight = penalty strength.
* ``broken_tool_calls``: -(number of malformed tool calls). Real-time RL found the policy emitting
  broken calls on hard tasks when such samples were discarded; they now count as negatives.
* ``unlikeliness``: -R_i * rank_i / G_i, the "unlikeliness reward" of He, Fried & Welleck (2025,
  "Rewarding the Unlikely: Lifting GRPO Beyond Distribution Sharpening"). rank_i is trajectory i's
  place (0 = least likely) among the G_i usable members of its group, ordered by the sampler's mean
  logprob per policy token; R_i is the term ``of`` (default ``task``). With weight beta the total is
  R_i (1 - beta rank_i / G_i): of two correct samples the likelier one earns less, which counters
  GRPO's bias towards reinforcing what the policy already samples most (the paper: beta = 0.25).

A non-finite term makes that trajectory's total non-finite; the advantage estimator then masks it
and counts it (``adv/nonfinite_rewards``), and ``reward/<label>/nonfinite`` says which term did it.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from c2jax.registry import Registry
from c2jax.trajectory import EFFORT_FIELDS

REWARD_TERMS: Registry = Registry("rl_reward_term")

# Monitor-provided behaviour terms (conventional names in Trajectory.reward_terms).
BEHAVIOUR_TERMS = ("comment_reasoning", "terminal_only", "unfinished_todos")


def length_penalty(x: jax.Array, k: float, q: float) -> jax.Array:
    """C_{k,q}(x) = ((1 + k x)^(1 - q) - 1) / (k (1 - q)), elementwise, for x >= 0, k >= 0, q >= 0.

    Increasing and concave: C(0) = 0, C'(x) = (1 + k x)^(-q). q = 0 is linear (C = x); q = 1 is the
    limit log(1 + k x) / k; q > 1 is bounded above by 1 / (k (q - 1)). Computed as
    expm1((1 - q) log1p(k x)) / (k (1 - q)), accurate for q near 1; k = 0 gives C = x.
    """
    x = jnp.asarray(x, jnp.float32)
    if k == 0 or q == 0:  # linear, exactly
        return x
    a = 1.0 - q
    log1p_kx = jnp.log1p(k * x)
    if abs(a) < 1e-7:
        return log1p_kx / k
    return jnp.expm1(a * log1p_kx) / (k * a)


def effort_measure(effort: Mapping[str, jax.Array], weights: Mapping[str, float]) -> jax.Array:
    """x = sum_f weights[f] * effort[f]; effort holds [N] arrays keyed by EFFORT_FIELDS."""
    unknown = set(weights) - set(EFFORT_FIELDS)
    if unknown:
        raise KeyError(f"length_penalty weights: unknown effort fields {sorted(unknown)}; known: {list(EFFORT_FIELDS)}")
    if not weights:
        raise ValueError("length_penalty needs at least one effort weight")
    return sum(float(w) * effort[f] for f, w in weights.items())


@REWARD_TERMS.register("term")
def term_from_trajectory(batch: Mapping[str, Any], *, key: str) -> jax.Array:
    """The stored reward term `key` of each trajectory ([N], NaN where the trajectory lacked it)."""
    terms = batch["reward_terms"]
    if key not in terms:
        raise KeyError(f"reward term {key!r} is not in batch['reward_terms'] (have {sorted(terms)}); "
                       f"the grader or monitor must write it into Trajectory.reward_terms")
    return jnp.asarray(terms[key], jnp.float32)


@REWARD_TERMS.register("length_penalty")
def length_penalty_term(batch: Mapping[str, Any], *, k: float, q: float, weights: Mapping[str, float]) -> jax.Array:
    """-C_{k,q}(sum_f w_f effort_f) per trajectory [N]."""
    return -length_penalty(effort_measure(batch["effort"], weights), k, q)


@REWARD_TERMS.register("broken_tool_calls")
def broken_tool_calls_term(batch: Mapping[str, Any]) -> jax.Array:
    """-(number of malformed tool calls) per trajectory [N]."""
    return -jnp.asarray(batch["tool_stats"]["malformed"], jnp.float32)


@REWARD_TERMS.register("unlikeliness")
def unlikeliness_term(batch: Mapping[str, Any], *, of: str = "task", logp_key: str = "behaviour_logp") -> jax.Array:
    """-R_i * rank_i / G_i per trajectory [N] (see the module docstring).

    The per-trajectory likelihood is the mean of batch[logp_key] [R, L] over the trajectory's policy
    tokens (loss_mask); ranks count the group's usable members (traj_valid, not infra_failed, at least
    one policy token) strictly less likely, ties broken by trajectory order, as argsort(argsort) does.
    Unusable trajectories get 0 (they are masked out of the loss anyway)."""
    r = term_from_trajectory(batch, key=of)  # [N]
    n = r.shape[0]
    if logp_key not in batch:
        raise KeyError(f"unlikeliness: batch has no {logp_key!r} (pad_batch adds 'behaviour_logp', and 'raw_logp' "
                       f"when every segment has raw logprobs)")
    ti = batch["traj_index"].reshape(-1)  # [R*L]
    seg = jnp.where(ti >= 0, ti, n)  # padding -> overflow segment n
    mask = jnp.asarray(batch["loss_mask"], jnp.float32).reshape(-1)
    logp = jnp.asarray(batch[logp_key], jnp.float32).reshape(-1)
    total = jax.ops.segment_sum(logp * mask, seg, num_segments=n + 1)[:n]  # [N]
    count = jax.ops.segment_sum(mask, seg, num_segments=n + 1)[:n]  # [N]
    mean = total / jnp.maximum(count, 1.0)  # [N]
    usable = (jnp.asarray(batch["traj_valid"]) > 0) & (count > 0) & jnp.isfinite(mean)
    if "infra_failed" in batch:
        usable = usable & (jnp.asarray(batch["infra_failed"]) == 0)
    g = jnp.asarray(batch["group_index"])
    same = (g[:, None] == g[None, :]) & usable[:, None] & usable[None, :]  # [N, N]
    order = jnp.arange(n)
    below = (mean[None, :] < mean[:, None]) | ((mean[None, :] == mean[:, None]) & (order[None, :] < order[:, None]))
    rank = jnp.sum(same & below, axis=1).astype(jnp.float32)  # [N]
    size = jnp.sum(same, axis=1).astype(jnp.float32)  # [N]
    return jnp.where(usable, -r * rank / jnp.maximum(size, 1.0), 0.0)


def term_spec(label: str, cfg: Mapping[str, Any]) -> tuple[str, Any, dict]:
    """Resolve a config entry to (registered fn name, weight, kwargs).

    The fn is cfg["fn"] if given, else the label if it names a registered term, else ``term`` with
    key = label (so ``task=dict(weight=1.0)`` reads Trajectory.reward_terms["task"]).
    """
    cfg = dict(cfg)
    weight = cfg.pop("weight", 1.0)  # checked by the config validator; float() at use
    fn = cfg.pop("fn", None)
    if fn is None:
        fn = label if label in REWARD_TERMS else "term"
    if fn == "term":
        cfg.setdefault("key", label)
    return fn, weight, cfg


def compute_rewards(batch: Mapping[str, Any], terms: Mapping[str, Mapping[str, Any]], valid: jax.Array | None = None):
    """Total reward [N] = sum of weighted terms, and metrics with every term's mean over valid samples."""
    if not terms:
        raise ValueError("rl.rewards: at least one reward term is needed")
    n = batch["traj_valid"].shape[0]
    valid = batch["traj_valid"] if valid is None else valid
    total = jnp.zeros((n,), jnp.float32)
    metrics = {}
    for label, cfg in terms.items():
        fn, weight, kwargs = term_spec(label, cfg)
        value = REWARD_TERMS.get(fn)(batch, **kwargs)  # [N]
        total = total + float(weight) * value
        finite = jnp.isfinite(value) & (valid > 0)
        metrics[f"reward/{label}"] = jnp.sum(jnp.where(finite, value, 0.0)) / jnp.maximum(finite.sum(), 1)
        metrics[f"reward/{label}/nonfinite"] = jnp.sum((valid > 0) & ~jnp.isfinite(value)).astype(jnp.float32)
    finite = jnp.isfinite(total) & (valid > 0)
    metrics["reward/total"] = jnp.sum(jnp.where(finite, total, 0.0)) / jnp.maximum(finite.sum(), 1)
    return total, metrics
