"""One synchronous RL step, as a function the asynchronous services reuse (not fork):

    out = rl_step(ctx, state, tasks, step=s, version=v, engine_version=e)
    out.state, out.version, out.engine_version, out.metrics, out.samples

1. rollouts: ``group_size`` graded episodes per task (harness + engine policy + sandbox pool,
   `c2jax.train.rl_rollouts`), sampling seeds derived from (seed, step, task, sample, turn);
2. `pad_batch` (groups intact; masked samples stay in the batch with ``infra_failed`` so they
   count and contribute nothing);
3. reference logprobs (frozen initial policy) and diagnostics: learner vs sampler logprob mismatch
   with and without router replay, route-flip rate;
4. the learner update (`c2jax.train.rl_learner`): ``make_rl_loss`` + full-parameter Adam;
5. weight publish: ``engine.update_weights(params, version + 1)`` whenever the engine would
   otherwise lag the learner by more than ``rl.max_staleness`` versions at the next update
   (0 = every step: fully on-policy). Samples are checked against the bound and the staleness
   histogram is reported.

The pieces are public so the asynchronous services (`c2jax.train.async_rl`) reuse them instead of
forking: `collect` (rollouts), `mark_stale` (the staleness safety net), `learn` (steps 2-4) and
`publish` (step 5); `rl_step` is exactly their synchronous composition.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from c2jax.train.rl_learner import Learner, mismatch_stats, route_flip_rate
from c2jax.train.rl_rollouts import Sample, collect, sample_stats
from c2jax.train.state import TrainState
from c2jax.batching import fit_row_length, pad_batch


@dataclasses.dataclass
class RLContext:
    """What a step needs besides the train state (built once by the stage)."""

    rl: dict  # resolved ``rl`` section (loss + stage keys)
    learner: Learner
    engine: Any  # c2jax.sampling.Engine
    policy: Any  # c2jax.agent.policies.EnginePolicy
    harness: Any  # c2jax.agent.harness.Harness
    pool: Any = None  # c2jax.envs.SandboxPool or None
    ref_params: Any = None  # frozen reference policy (None: no KL metrics/term)
    seed: int = 0
    grade_fn: Any = None
    reward_names: tuple = ("task", "reward", "resolved", "f2p_fraction", "p2p_regressions")
    weight_sync: Any = None  # c2jax.sync.WeightSync (rl.weight_sync 'delta'); None = engine.update_weights
    task_weights: dict | None = None  # {task id: weight} (rl.task_weights); None: every task weighs 1


@dataclasses.dataclass
class StepOutput:
    state: TrainState
    version: int
    engine_version: int
    metrics: dict
    samples: list


def _rows_bucket(n: int) -> int:
    """Learner rows padded to a multiple of 4 (few distinct jit shapes)."""
    return max(4, -(-n // 4) * 4)


def learner_row_len(trajs: Sequence[Any], rl: dict) -> int:
    """Positions per learner row for this step's trajectories: ``rl.max_len``, or with
    ``rl.learner_row_multiple`` = m > 0 the multiple of m (<= max_len) that holds them in the fewest
    padded positions (`fit_row_length`). Rollouts of ~550 tokens fill 1024-token rows to ~55%; rows of
    640 hold the same trajectories with the same loss (padding is masked) at ~40% less learner compute
    (the attention scores shrink with the square of the row). Each distinct (rows, length) compiles
    once; a larger m means fewer shapes."""
    max_len = int(rl["max_len"])
    m = int(rl.get("learner_row_multiple", 0) or 0)
    if m <= 0 or not any(s.num_positions > 0 for t in trajs for s in t.segments):
        return max_len
    return fit_row_length(trajs, max_len, multiple=m)


def publish(ctx: RLContext, params: Any, version: int) -> float:
    if ctx.weight_sync is not None:  # non-blocking: compression + rebuild run on background threads
        return ctx.weight_sync.publish(params, version)
    t0 = time.monotonic()
    ctx.engine.update_weights(params, version)
    return time.monotonic() - t0


def _staleness_hist(batch: dict, version: int) -> dict[str, float]:
    m = batch["loss_mask"] > 0
    lag = (version - batch["versions"])[m]
    vals, counts = np.unique(lag, return_counts=True)
    return {f"staleness/hist/{int(v)}": float(c) for v, c in zip(vals, counts)}


def mark_stale(samples: Sequence[Sample], version: int, max_staleness: int) -> dict[str, float]:
    """Mask (``mask_reason='stale'``, counted) every live sample with a loss token sampled by a policy
    version more than `max_staleness` versions older than `version` (the learner's, at its update).
    The asynchronous reconciler's admission rule keeps this from firing; it stays as the safety net."""
    metrics: dict[str, float] = {}
    for s in samples:
        if s.mask_reason:
            continue
        vs = [int(v) for seg in s.trajectory.segments for v, m in zip(seg.policy_versions, seg.loss_mask) if m]
        if vs and version - min(vs) > int(max_staleness):
            s.mask_reason = "stale"
            s.trajectory.infra_failed = True
            metrics["masked/stale"] = metrics.get("masked/stale", 0.0) + 1.0
    return metrics


@dataclasses.dataclass
class LearnOutput:
    state: TrainState
    metrics: dict  # learner metrics, then diagnostics, then the staleness histogram (in that order)
    batch: dict  # the padded batch the update saw
    logp: Any = None  # [rows, L] the learner's logprobs of batch['targets'] before the update (diagnostics)


def group_chunks(trajs: Sequence[Any], n_chunks: int) -> list[list[Any]]:
    """Split trajectories into `n_chunks` contiguous runs of whole groups (group_id, first-appearance
    order), as equal in group count as possible; never splits a group (its baseline needs all of it)."""
    order: dict[str, list[Any]] = {}
    for t in trajs:
        order.setdefault(t.group_id, []).append(t)
    groups = list(order.values())
    n_chunks = max(1, min(n_chunks, len(groups)))
    bounds = np.linspace(0, len(groups), n_chunks + 1).round().astype(int)
    return [[t for g in groups[a:b] for t in g] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


_COUNT_KEYS = ("adv/used_samples", "adv/small_groups", "adv/zero_std_groups", "adv/nonfinite_rewards")


def _combine(key: str, values: list[float]) -> float:
    """One step's value of a learner metric reported once per minibatch."""
    if key.startswith("batch/") or key in _COUNT_KEYS:
        return float(sum(values))
    if key.endswith("max"):
        return float(max(values))
    return float(sum(values) / len(values))


def _minibatch_updates(ctx: RLContext, state: TrainState, trajs: Sequence[Any], n_mb: int,
                       version: int) -> tuple[TrainState, dict[str, float]]:
    """``rl.minibatches`` > 1: one optimizer update per minibatch of whole groups, in order (PPO-style
    minibatching: more updates per sampled batch at the same learner compute). Minibatch j is j updates
    off-policy; the objective's importance ratio (``objective.tis_cap`` or ``ppo``) corrects for it.
    Each minibatch is padded to the same shape (one jit compile), its reference logprobs computed on
    it. Returns the new state and the learner metrics over the minibatches: counts (``batch/*`` and the
    ``adv/`` sample and group counts) summed, maxima maximised, everything else averaged."""
    rl = ctx.rl
    chunks = group_chunks(trajs, n_mb)
    per = max(len(c) for c in chunks)
    row_len = learner_row_len(trajs, rl)  # one length for every minibatch: one jit shape per step
    probes = [pad_batch(c, row_len, reward_names=ctx.reward_names) for c in chunks]
    rows = _rows_bucket(max(p["tokens"].shape[0] for p in probes))
    has_routes = all("routes" in p for p in probes)
    per_mb: list[dict[str, float]] = []
    for chunk in chunks:
        mb = pad_batch(chunk, row_len, num_rows=rows, max_trajectories=per, reward_names=ctx.reward_names)
        ref = None
        if ctx.ref_params is not None:
            lr, _ = ctx.learner.logp(ctx.ref_params, mb, replay=bool(rl["router_replay"]) and has_routes)
            ref = np.asarray(lr)
        state, m = ctx.learner.update(state, mb, ref, version)
        per_mb.append({k: float(v) for k, v in jax.device_get(m).items()})
    out = {k: _combine(k, [m[k] for m in per_mb]) for k in per_mb[0]}
    out["learner/minibatches"] = float(len(chunks))
    return state, out


def learn(ctx: RLContext, state: TrainState, samples: Sequence[Sample], version: int) -> LearnOutput:
    """Steps 2-4 of `rl_step` on already graded (and staleness-checked) samples: `pad_batch`,
    diagnostics and reference logprobs, one learner update at policy `version`. The synchronous step
    and the asynchronous trainer service both call this (nothing else updates the parameters)."""
    rl = ctx.rl
    trajs = [s.trajectory for s in samples]
    if ctx.task_weights is not None:  # pad_batch carries it as batch["group_weight"]; the loss scales advantages
        for t in trajs:
            t.metadata["group_weight"] = float(ctx.task_weights.get(t.task_id, 1.0))
    n = len(trajs)
    # Rows needed (first-fit packing) depend on lengths: pad to a bucket so jit sees few shapes.
    row_len = learner_row_len(trajs, rl)
    probe = pad_batch(trajs, row_len, reward_names=ctx.reward_names)
    batch = pad_batch(trajs, row_len, num_rows=_rows_bucket(probe["tokens"].shape[0]),
                      max_trajectories=n, reward_names=ctx.reward_names)
    t0 = time.monotonic()
    mask = batch["loss_mask"] * (batch["traj_index"] >= 0)
    live_mask = mask * np.where(batch["traj_index"] >= 0,
                                1.0 - batch["infra_failed"][np.clip(batch["traj_index"], 0, None)], 0.0)
    seg_mask = (batch["segment_ids"] > 0).astype(np.float32)
    diag: dict[str, float] = {}
    logp_ref = None
    lp_replay = None
    has_routes = "routes" in batch
    n_mb = int(rl.get("minibatches", 1))
    sampler = batch.get("raw_logp", batch["behaviour_logp"])
    key = "with_replay" if rl["router_replay"] else "no_replay"
    # One update per step: the update's own forward (on the parameters before it) gives the learner's
    # logprobs and routes for the mismatch diagnostics, so they cost no forward of their own.
    fused = n_mb <= 1 and (has_routes or not rl["router_replay"])
    main_routes = other_routes = None  # the learner's routes on the main / the other forward
    if has_routes or not rl["router_replay"]:
        if not fused:
            lp, aux_main = ctx.learner.logp(state.params, batch, replay=bool(rl["router_replay"]) and has_routes)
            lp_replay, main_routes = np.asarray(lp), np.asarray(aux_main["routes"])
        if rl["replay_metrics"] and has_routes:
            lp_free, aux = ctx.learner.logp(state.params, batch, replay=not rl["router_replay"])
            other_routes = np.asarray(aux["routes"])
            mm = mismatch_stats(np.asarray(lp_free), sampler, live_mask)
            key2 = "no_replay" if rl["router_replay"] else "with_replay"
            diag[f"mismatch/{key2}/mean"], diag[f"mismatch/{key2}/p99"] = mm["mean"], mm["p99"]
    if ctx.ref_params is not None and n_mb <= 1:  # with minibatches: computed per minibatch
        lr, _ = ctx.learner.logp(ctx.ref_params, batch, replay=bool(rl["router_replay"]) and has_routes)
        logp_ref = np.asarray(lr)
    diag_s = time.monotonic() - t0
    t0 = time.monotonic()
    if fused:
        state, m, (lp, routes) = ctx.learner.update_with_logp(state, batch, logp_ref, version)
        lp_replay, main_routes = np.asarray(lp), np.asarray(routes)
    elif n_mb <= 1:
        state, m = ctx.learner.update(state, batch, logp_ref, version)
    else:
        state, m = _minibatch_updates(ctx, state, trajs, n_mb, version)
    if n_mb <= 1:
        m = {k: float(v) for k, v in jax.device_get(m).items()}
    if lp_replay is not None:
        mm = mismatch_stats(lp_replay, sampler, live_mask)
        diag[f"mismatch/{key}/mean"], diag[f"mismatch/{key}/p99"] = mm["mean"], mm["p99"]
    if other_routes is not None:
        own = other_routes if rl["router_replay"] else main_routes  # the learner's own choice
        diag["route_flip_rate"] = route_flip_rate(own, batch["routes"], seg_mask)
    learner_s = time.monotonic() - t0
    metrics: dict[str, float] = dict(m)
    metrics.update(diag)
    metrics.update(_staleness_hist(batch, version))
    metrics.update({k: m[k] for k in m if k.startswith("adv/")})
    metrics.update({"tokens/learner": float(mask.sum()), "learner/rows": float(batch["tokens"].shape[0]),
                    "learner/row_len": float(row_len), "learner/row_fill": float(seg_mask.mean()),
                    "time/diagnostics_s": diag_s, "time/learner_s": learner_s})
    return LearnOutput(state, metrics, batch, lp_replay)


def rl_step(ctx: RLContext, state: TrainState, tasks: Sequence[Any], *, step: int, version: int,
            engine_version: int) -> StepOutput:
    rl = ctx.rl
    G = int(rl["group_size"])
    t_step = time.monotonic()
    ctx.policy.seed = ctx.seed
    ctx.policy.seed_salt = step
    t0 = time.monotonic()
    if ctx.weight_sync is not None:
        ctx.weight_sync.wait()  # the engine holds engine_version before this step's rollouts
    wait_s = time.monotonic() - t0
    t0 = time.monotonic()
    samples: list[Sample] = collect(ctx.harness, ctx.policy, tasks, group_size=G, pool=ctx.pool,
                                    max_in_flight=int(rl["max_in_flight"]), max_len=int(rl["max_len"]),
                                    grade_fn=ctx.grade_fn)
    rollout_s = time.monotonic() - t0
    metrics: dict[str, float] = sample_stats(samples)
    # Staleness bound: a token sampled by a version older than allowed is dropped with a reason.
    for k, v in mark_stale(samples, version, int(rl["max_staleness"])).items():
        metrics[k] = metrics.get(k, 0.0) + v
    out = learn(ctx, state, samples, version)
    state = out.state
    version += 1
    publish_s = 0.0
    if version - engine_version > int(rl["max_staleness"]):
        publish_s = publish(ctx, state.params, version)
        engine_version = version
    metrics.update(out.metrics)
    if ctx.weight_sync is not None:
        metrics.update(ctx.weight_sync.metrics())  # weight_sync/*: identical share per dtype, delta size
        metrics["time/weight_wait_s"] = wait_s
    metrics.update({"version": float(version), "engine_version": float(engine_version),
                    "time/rollout_s": rollout_s, "time/publish_s": publish_s,
                    "time/step_s": time.monotonic() - t_step})
    return StepOutput(state, version, engine_version, metrics, samples)
