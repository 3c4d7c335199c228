"""`pad_batch`: trajectories -> the fixed-shape numpy arrays the jitted RL loss (and agent SFT) take.

Groups stay intact, segments are packed first-fit into rows of `max_len` (or one per row), and every
per-token field (tokens, loss mask, behaviour logprobs, versions, routes) lands at the same
positions; see `pad_batch` for the keys. The record it reads is `c2jax.trajectory.Trajectory`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from c2jax.trajectory import EFFORT_FIELDS, Segment, Trajectory, TrajectoryError


def _place_segments(lengths: Sequence[int], max_len: int, pack: bool) -> list[list[int]]:
    """Assign segments (by index) to rows: first fit in input order when packing, else one per row."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i, n in enumerate(lengths):
        if pack:
            for r, f in enumerate(free):
                if f >= n:
                    rows[r].append(i)
                    free[r] -= n
                    break
            else:
                rows.append([i])
                free.append(max_len - n)
        else:
            rows.append([i])
            free.append(max_len - n)
    return rows


def fit_row_length(trajectories: Sequence[Trajectory], max_len: int, multiple: int = 64, pack: bool = True) -> int:
    """The row length <= `max_len` (a multiple of `multiple`, or `max_len` itself) that holds
    `trajectories` in the fewest padded positions (rows x length) under `pad_batch`'s placement;
    ties go to the shorter row. E.g. agent demonstrations of 519-577 tokens packed into 1024-token
    rows fit one per row (52% of positions are padding); rows of 576 hold the same demonstrations at
    92%. The loss is unchanged (padding and other segments are masked), the compute is not."""
    lengths = [s.num_positions for t in trajectories for s in t.segments if s.num_positions > 0]
    if not lengths:
        raise ValueError("fit_row_length: no segment with a target")
    longest = max(lengths)
    if longest > max_len:
        raise ValueError(f"fit_row_length: a segment needs {longest} positions > max_len={max_len}")
    candidates = sorted({L for L in range(-(-longest // multiple) * multiple, max_len + 1, multiple)} | {max_len})
    return min(candidates, key=lambda L: (len(_place_segments(lengths, L, pack)) * L, L))


def pad_batch(
    trajectories: Sequence[Trajectory],
    max_len: int,
    *,
    num_rows: int | None = None,
    max_trajectories: int | None = None,
    pad_id: int = 0,
    pack: bool = True,
    reward_names: Sequence[str] | None = None,
    min_group_size: int = 1,
) -> dict[str, Any]:
    """Pad (and by default pack) trajectories into fixed-shape numpy arrays for the jitted RL loss.

    Each segment s = prompt + completion occupies len(s) - 1 positions of a row: inputs s[:-1] and
    next-token targets s[1:], so `behaviour_logp[b, t]` is the logprob of `targets[b, t]` and
    compares directly with the learner's log_softmax(logits)[b, t, targets[b, t]]. With
    `pack=True` several segments share a row (first fit in input order); `segment_ids` (1.. per
    row, 0 = padding) keeps attention inside a segment and `positions` restart at 0 per segment.
    A segment longer than `max_len` raises: nothing is truncated silently.

    Per-token arrays, shape [R, max_len] (R = `num_rows` if given, else the rows needed):
      tokens, targets      int32   input ids, next-token ids (pad_id at padding)
      loss_mask            float32 1 where targets[b, t] was sampled by the policy
      behaviour_logp       float32 sampler logprob of targets[b, t] (0 off the mask)
      raw_logp             float32 untempered logprob (only if every segment has raw_logprobs)
      versions             int32   policy version of targets[b, t] (-1 off the mask)
      positions            int32   position within its segment
      segment_ids          int32   1.. per segment within the row, 0 at padding
      traj_index           int32   index of the token's trajectory on the N axis, -1 at padding
      routes               int32   [R, max_len, nL, K] experts of tokens[b, t] (only with routes)
    Per-trajectory arrays, shape [N] (N = `max_trajectories` if given, else len(trajectories)):
      traj_valid           float32 1 for a real trajectory, 0 for N-axis padding
      infra_failed         float32 1 if lost to the infrastructure (masked out of the loss)
      truncated            float32 1 if the rollout hit its token/turn budget unfinished
      group_index          int32   dense group number (first-appearance order), -1 for padding
      policy_tokens        float32 number of policy tokens
      num_segments         int32
      reward_terms         {name: float32 [N]} every reward term seen (NaN where a trajectory lacks it)
      effort               {field: float32 [N]} for each of EFFORT_FIELDS
      tool_stats           {"calls", "malformed", "failed": float32 [N]}
    Group indices are < N, so jitted code can use N as a static bound on the number of groups.
    Only numpy arrays are returned (jit-ready as a pytree). `min_group_size` > 1 makes groups smaller
    than that (counting every trajectory, infra failures included) raise.
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    trajs = list(trajectories)
    if not trajs:
        raise ValueError("pad_batch: no trajectories")
    for i, t in enumerate(trajs):
        if not isinstance(t, Trajectory):
            raise TrajectoryError(f"trajectories[{i}]", f"must be a Trajectory, got {type(t).__name__}")
    n = len(trajs) if max_trajectories is None else max_trajectories
    if len(trajs) > n:
        raise ValueError(f"pad_batch: {len(trajs)} trajectories > max_trajectories={n}")

    route_flags = {t.has_routes for t in trajs if t.segments}
    if len(route_flags) > 1:
        raise TrajectoryError("segments.routes", "present in some trajectories and missing in others")
    with_routes = route_flags == {True}
    route_shape = None
    if with_routes:
        shapes = {s.routes.shape[1:] for t in trajs for s in t.segments}
        if len(shapes) > 1:
            raise TrajectoryError("segments.routes", f"different [n_moe_layers, top_k] across trajectories: {sorted(shapes)}")
        route_shape = shapes.pop()
    raw_flags = {t.has_raw_logprobs for t in trajs if t.segments}
    with_raw = raw_flags == {True}

    # Flatten segments.
    # A segment with one token in all (a 1-token prompt, no completion) has no target: nothing to place.
    flat: list[tuple[int, Segment]] = [(ti, s) for ti, t in enumerate(trajs) for s in t.segments if s.num_positions > 0]
    lengths = [s.num_positions for _, s in flat]
    for (ti, s), L in zip(flat, lengths):
        if L > max_len:
            si = next(j for j, x in enumerate(trajs[ti].segments) if x is s)
            raise ValueError(f"trajectories[{ti}].segments[{si}] needs {L} positions > max_len={max_len} "
                             f"(task {trajs[ti].task_id!r}); raise max_len or split the segment")
    rows = _place_segments(lengths, max_len, pack)
    r = len(rows) if num_rows is None else num_rows
    if len(rows) > r:
        raise ValueError(f"pad_batch: the segments need {len(rows)} rows > num_rows={r} (max_len={max_len})")

    tokens = np.full((r, max_len), pad_id, np.int32)
    targets = np.full((r, max_len), pad_id, np.int32)
    loss_mask = np.zeros((r, max_len), np.float32)
    behaviour = np.zeros((r, max_len), np.float32)
    raw = np.zeros((r, max_len), np.float32) if with_raw else None
    versions = np.full((r, max_len), -1, np.int32)
    positions = np.zeros((r, max_len), np.int32)
    segment_ids = np.zeros((r, max_len), np.int32)
    traj_index = np.full((r, max_len), -1, np.int32)
    routes = np.zeros((r, max_len) + route_shape, np.int32) if with_routes else None

    for row, members in enumerate(rows):
        off = 0
        for sid, k in enumerate(members, start=1):
            ti, s = flat[k]
            seq = np.concatenate([s.prompt_ids, s.completion_ids])
            L = len(seq) - 1
            P = len(s.prompt_ids)
            sl = slice(off, off + L)
            tokens[row, sl] = seq[:-1]
            targets[row, sl] = seq[1:]
            positions[row, sl] = np.arange(L, dtype=np.int32)
            segment_ids[row, sl] = sid
            traj_index[row, sl] = ti
            # Completion token j sits at sequence position P + j, i.e. target index P + j - 1.
            csl = slice(off + P - 1, off + L)
            m = s.loss_mask
            loss_mask[row, csl] = m
            behaviour[row, csl] = np.where(m, s.behaviour_logprobs, 0.0)
            versions[row, csl] = np.where(m, s.policy_versions, -1)
            if raw is not None:
                raw[row, csl] = np.where(m, s.raw_logprobs, 0.0)
            if routes is not None:
                routes[row, sl] = s.routes[:L]  # inputs only (drops the final token's row if present)
            off += L

    # Per-trajectory arrays.
    group_ids: dict[str, int] = {}
    group_index = np.full((n,), -1, np.int32)
    for i, t in enumerate(trajs):
        group_index[i] = group_ids.setdefault(t.group_id, len(group_ids))
    if min_group_size > 1:
        sizes = np.bincount(group_index[: len(trajs)], minlength=len(group_ids))
        small = [g for g, gi in group_ids.items() if sizes[gi] < min_group_size]
        if small:
            raise ValueError(f"group_id: groups {small[:5]} have fewer than min_group_size={min_group_size} trajectories")
    valid = np.zeros((n,), np.float32)
    valid[: len(trajs)] = 1.0
    infra = np.zeros((n,), np.float32)
    infra[: len(trajs)] = [float(t.infra_failed) for t in trajs]
    truncated = np.zeros((n,), np.float32)
    truncated[: len(trajs)] = [float(t.truncated) for t in trajs]
    names = list(reward_names) if reward_names is not None else sorted({k for t in trajs for k in t.reward_terms})
    reward_terms = {}
    for name in names:
        v = np.full((n,), np.nan, np.float32)
        v[: len(trajs)] = [float(t.reward_terms.get(name, np.nan)) for t in trajs]
        reward_terms[name] = v
    effort = {}
    for f in EFFORT_FIELDS:
        v = np.zeros((n,), np.float32)
        v[: len(trajs)] = [getattr(t.effort, f) for t in trajs]
        effort[f] = v
    tool_stats = {k: np.zeros((n,), np.float32) for k in ("calls", "malformed", "failed")}
    for i, t in enumerate(trajs):
        tool_stats["calls"][i] = len(t.tool_events)
        tool_stats["malformed"][i] = sum(e.malformed for e in t.tool_events)
        tool_stats["failed"][i] = sum((not e.ok) and not e.malformed for e in t.tool_events)
    policy_tokens = np.zeros((n,), np.float32)
    policy_tokens[: len(trajs)] = [t.num_policy_tokens for t in trajs]
    num_segments = np.zeros((n,), np.int32)
    num_segments[: len(trajs)] = [len(t.segments) for t in trajs]

    batch: dict[str, Any] = dict(
        tokens=tokens, targets=targets, loss_mask=loss_mask, behaviour_logp=behaviour, versions=versions,
        positions=positions, segment_ids=segment_ids, traj_index=traj_index,
        traj_valid=valid, infra_failed=infra, truncated=truncated, group_index=group_index, policy_tokens=policy_tokens,
        num_segments=num_segments, reward_terms=reward_terms, effort=effort, tool_stats=tool_stats,
    )
    if any("group_weight" in t.metadata for t in trajs):  # rl.task_weights: the task's weight in the update
        gw = np.ones((n,), np.float32)
        gw[: len(trajs)] = [float(t.metadata.get("group_weight", 1.0)) for t in trajs]
        batch["group_weight"] = gw
    if raw is not None:
        batch["raw_logp"] = raw
    if routes is not None:
        batch["routes"] = routes
    return batch
