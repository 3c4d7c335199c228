"""The record RL consumes: a token-in/token-out agent trajectory, and its padding into jit-ready arrays.

A `Trajectory` is one rollout of the agent on one task. It stores the exact token ids the policy
saw and produced (text is never re-tokenised between turns), split into `Segment`s: one segment
per generation, i.e. one forward context. A plain multi-turn rollout is one segment whose
completion interleaves policy tokens with tool-output tokens (loss mask 0). Self-summarisation
restarts the context from the summary, which starts a new segment; the final reward applies to
every segment in the chain (Composer 2 report, section 3.5).

Per completion token a segment stores the loss mask (1 = sampled by the policy), the behaviour
(sampler) logprob of the token under the distribution it was actually sampled from, optionally the
raw (untempered) model logprob, and the policy version that produced it (in-flight weight updates
make versions change mid-rollout). Optionally `routes` holds the routed experts the sampler chose
for every input token of the segment (int32 [P + C - 1 (or P + C), n_moe_layers, top_k]) for
router replay.

The trajectory also carries the tool events, effort counts (the inputs of the length penalty),
reward terms from the grader and the behaviour monitors, task and group ids, and `infra_failed`:
a sample lost to the infrastructure (sandbox crash, timeout of the environment, not of the model)
is masked out of the loss. `truncated` marks a rollout that hit its token or turn budget unfinished
(kept in the loss by default, as in Composer 2: no overlong masking). A failure that is the model's fault (e.g. a malformed tool call) is NOT
an infra failure: it gets a negative reward, otherwise the policy learns to fail on hard tasks.

Construction converts lists to numpy arrays and validates; any missing or mismatched field raises
`TrajectoryError` naming the field, e.g. ``segments[1].behaviour_logprobs``.

`c2jax.batching.pad_batch` turns a list of trajectories into a dict of fixed-shape numpy arrays
that the jitted RL loss consumes. This module needs only numpy and the standard library so that the
agent harness and the sampler can import it cheaply.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

EFFORT_FIELDS: tuple[str, ...] = (
    "thinking_tokens",
    "tool_call_tokens",
    "tool_output_tokens",
    "final_message_tokens",
    "tool_calls",
    "turns",
)

# Tolerance for behaviour logprobs slightly above 0 from float rounding in the sampler.
_LOGP_SLACK = 1e-3


class TrajectoryError(ValueError):
    """A trajectory field is missing, malformed, or inconsistent with another field."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


@dataclass
class Effort:
    """Effort counts of a rollout: the measures the length penalty C_{k,q} weights (report 3.4)."""

    thinking_tokens: int = 0
    tool_call_tokens: int = 0
    tool_output_tokens: int = 0
    final_message_tokens: int = 0
    tool_calls: int = 0
    turns: int = 0

    def validate(self, prefix: str = "effort") -> None:
        for name in EFFORT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise TrajectoryError(f"{prefix}.{name}", f"must be an integer >= 0, got {v!r}")

    def as_dict(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in EFFORT_FIELDS}


@dataclass
class ToolEvent:
    """One tool call the agent made and what came back.

    `malformed` marks a call the harness could not parse or that named an unknown tool: the model's
    fault, turned into an error message for the agent and counted as a negative in the reward.
    `ok` is False when the call was well formed but the tool reported failure (non-zero exit, ...).
    """

    name: str
    ok: bool = True
    malformed: bool = False
    error: str | None = None
    turn: int = 0
    segment: int = 0
    call_tokens: int = 0
    output_tokens: int = 0

    def validate(self, prefix: str) -> None:
        if not isinstance(self.name, str):
            raise TrajectoryError(f"{prefix}.name", f"must be a string, got {self.name!r}")
        for name in ("ok", "malformed"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TrajectoryError(f"{prefix}.{name}", f"must be a bool, got {getattr(self, name)!r}")
        for name in ("turn", "segment", "call_tokens", "output_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise TrajectoryError(f"{prefix}.{name}", f"must be an integer >= 0, got {v!r}")


def _finite_off_mask(logp: np.ndarray, mask: np.ndarray) -> list[float]:
    """Logprobs as a JSON list; slots off the loss mask (ignored everywhere) become 0 if not finite."""
    return np.where(mask | np.isfinite(logp), logp, 0.0).tolist()


def _as_array(value: Any, dtype: Any, name: str, ndim: int) -> np.ndarray:
    if value is None:
        raise TrajectoryError(name, "missing")
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise TrajectoryError(name, f"not a rectangular array ({e})") from None
    if arr.size == 0:
        arr = arr.reshape((0,) * ndim if ndim > 1 else (0,))
    if arr.ndim != ndim:
        raise TrajectoryError(name, f"must have {ndim} dimension(s), got shape {arr.shape}")
    if np.dtype(dtype) == np.bool_ and arr.size and not np.isin(arr, (0, 1)).all():
        raise TrajectoryError(name, "must hold only 0/1 (or booleans)")
    if np.issubdtype(np.dtype(dtype), np.integer):
        if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
            raise TrajectoryError(name, f"must hold integers, got dtype {arr.dtype}")
    elif arr.size and not (np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)):
        raise TrajectoryError(name, f"must hold numbers, got dtype {arr.dtype}")
    return arr.astype(dtype, copy=False)


@dataclass
class Segment:
    """One generation: a prompt (context) and the completion produced from it.

    Shapes (P prompt tokens, C completion tokens, nL MoE layers, K experts per token):
      prompt_ids          int32 [P], P >= 1
      completion_ids      int32 [C]
      loss_mask           bool  [C]  True where the token was sampled by the policy
      behaviour_logprobs  float32 [C]  sampler logprob of the token (finite, <= 0 where masked in)
      policy_versions     int32 [C]  weight version that sampled the token (>= 0 where masked in)
      raw_logprobs        float32 [C] or None  untempered model logprob, if the sampler reports it
      routes              int32 [P + C - 1 or P + C, nL, K] or None  experts chosen per context token
                          (the final sampled token is never fed back, so P + C - 1 rows suffice)
    """

    prompt_ids: Any
    completion_ids: Any
    loss_mask: Any
    behaviour_logprobs: Any
    policy_versions: Any
    raw_logprobs: Any = None
    routes: Any = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, prefix: str = "segment") -> None:
        p = f"{prefix}."
        self.prompt_ids = _as_array(self.prompt_ids, np.int32, p + "prompt_ids", 1)
        self.completion_ids = _as_array(self.completion_ids, np.int32, p + "completion_ids", 1)
        self.loss_mask = _as_array(self.loss_mask, np.bool_, p + "loss_mask", 1)
        self.behaviour_logprobs = _as_array(self.behaviour_logprobs, np.float32, p + "behaviour_logprobs", 1)
        self.policy_versions = _as_array(self.policy_versions, np.int32, p + "policy_versions", 1)
        if self.raw_logprobs is not None:
            self.raw_logprobs = _as_array(self.raw_logprobs, np.float32, p + "raw_logprobs", 1)
        if self.routes is not None:
            self.routes = _as_array(self.routes, np.int32, p + "routes", 3)

        if len(self.prompt_ids) < 1:
            raise TrajectoryError(p + "prompt_ids", "must hold at least one token (the context a generation starts from)")
        for name, arr in (("prompt_ids", self.prompt_ids), ("completion_ids", self.completion_ids)):
            if arr.size and arr.min() < 0:
                raise TrajectoryError(p + name, f"token ids must be >= 0, got {int(arr.min())}")
        c = len(self.completion_ids)
        for name in ("loss_mask", "behaviour_logprobs", "policy_versions", "raw_logprobs"):
            arr = getattr(self, name)
            if arr is not None and len(arr) != c:
                raise TrajectoryError(p + name, f"length {len(arr)} != len(completion_ids) {c}")
        m = self.loss_mask
        for name in ("behaviour_logprobs", "raw_logprobs"):
            arr = getattr(self, name)
            if arr is None:
                continue
            bad = m & ~(np.isfinite(arr) & (arr <= _LOGP_SLACK))
            if bad.any():
                i = int(np.argmax(bad))
                raise TrajectoryError(p + name, f"policy token {i} has logprob {float(arr[i])}; must be finite and <= 0")
        if (m & (self.policy_versions < 0)).any():
            i = int(np.argmax(m & (self.policy_versions < 0)))
            raise TrajectoryError(p + "policy_versions", f"policy token {i} has version {int(self.policy_versions[i])}; must be >= 0")
        if self.routes is not None:
            t = len(self.prompt_ids) + c
            if self.routes.shape[0] not in (t - 1, t):
                raise TrajectoryError(p + "routes", f"first dimension {self.routes.shape[0]} must be len(prompt_ids) + "
                                      f"len(completion_ids) = {t} or one less (the last token is never an input)")
            if self.routes.size and self.routes.min() < 0:
                raise TrajectoryError(p + "routes", "expert ids must be >= 0")

    @property
    def num_tokens(self) -> int:
        """Tokens in the context (prompt + completion)."""
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def num_positions(self) -> int:
        """Positions this segment occupies in a padded row: inputs s[:-1] predict targets s[1:]."""
        return self.num_tokens - 1


@dataclass
class Trajectory:
    """One rollout of the agent on one task (see the module docstring)."""

    segments: list[Segment]
    task_id: str
    group_id: str
    reward_terms: dict[str, float] = field(default_factory=dict)
    effort: Effort = field(default_factory=Effort)
    tool_events: list[ToolEvent] = field(default_factory=list)
    infra_failed: bool = False
    truncated: bool = False
    sample_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; raise `TrajectoryError` naming the first bad one."""
        for name in ("task_id", "group_id"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise TrajectoryError(name, f"must be a non-empty string, got {v!r}")
        if not isinstance(self.sample_id, str):
            raise TrajectoryError("sample_id", f"must be a string, got {self.sample_id!r}")
        for name in ("infra_failed", "truncated"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TrajectoryError(name, f"must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.segments, (list, tuple)):
            raise TrajectoryError("segments", f"must be a list of Segment, got {type(self.segments).__name__}")
        if not self.segments and not self.infra_failed:
            raise TrajectoryError("segments", "empty; only an infra_failed trajectory may have no segments")
        route_shape = None
        for i, seg in enumerate(self.segments):
            if not isinstance(seg, Segment):
                raise TrajectoryError(f"segments[{i}]", f"must be a Segment, got {type(seg).__name__}")
            seg.validate(f"segments[{i}]")
            if seg.routes is not None:
                if route_shape is None:
                    route_shape = seg.routes.shape[1:]
                elif seg.routes.shape[1:] != route_shape:
                    raise TrajectoryError(f"segments[{i}].routes", f"shape {seg.routes.shape[1:]} per token != {route_shape} of an earlier segment")
        has_routes = {seg.routes is not None for seg in self.segments}
        if len(has_routes) > 1:
            raise TrajectoryError("segments.routes", "present in some segments and missing in others")
        if not isinstance(self.reward_terms, dict):
            raise TrajectoryError("reward_terms", f"must be a dict name -> float, got {type(self.reward_terms).__name__}")
        for k, v in self.reward_terms.items():
            if not isinstance(k, str) or not k:
                raise TrajectoryError("reward_terms", f"keys must be non-empty strings, got {k!r}")
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TrajectoryError(f"reward_terms[{k!r}]", f"must be a number, got {v!r}")
        if not isinstance(self.effort, Effort):
            raise TrajectoryError("effort", f"must be an Effort, got {type(self.effort).__name__}")
        self.effort.validate()
        for i, ev in enumerate(self.tool_events):
            if not isinstance(ev, ToolEvent):
                raise TrajectoryError(f"tool_events[{i}]", f"must be a ToolEvent, got {type(ev).__name__}")
            ev.validate(f"tool_events[{i}]")
            if ev.segment >= max(len(self.segments), 1):
                raise TrajectoryError(f"tool_events[{i}].segment", f"{ev.segment} >= number of segments {len(self.segments)}")

    # ---- summaries --------------------------------------------------------------------------
    @property
    def num_policy_tokens(self) -> int:
        return int(sum(int(s.loss_mask.sum()) for s in self.segments))

    @property
    def has_routes(self) -> bool:
        return bool(self.segments) and self.segments[0].routes is not None

    @property
    def has_raw_logprobs(self) -> bool:
        return bool(self.segments) and all(s.raw_logprobs is not None for s in self.segments)

    # ---- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (arrays become lists; NaN rewards become null)."""
        segs = []
        for s in self.segments:
            d = {
                "prompt_ids": s.prompt_ids.tolist(),
                "completion_ids": s.completion_ids.tolist(),
                "loss_mask": s.loss_mask.astype(np.int8).tolist(),
                "behaviour_logprobs": _finite_off_mask(s.behaviour_logprobs, s.loss_mask),
                "policy_versions": s.policy_versions.tolist(),
                "raw_logprobs": None if s.raw_logprobs is None else _finite_off_mask(s.raw_logprobs, s.loss_mask),
                "routes": None if s.routes is None else encode_array(s.routes),
            }
            segs.append(d)
        return {
            "segments": segs,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "reward_terms": {k: (None if not math.isfinite(float(v)) else float(v)) for k, v in self.reward_terms.items()},
            "effort": self.effort.as_dict(),
            "tool_events": [dataclasses.asdict(e) for e in self.tool_events],
            "infra_failed": bool(self.infra_failed),
            "truncated": bool(self.truncated),
            "sample_id": self.sample_id,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        """Inverse of `to_dict`; a missing required key raises `TrajectoryError` naming it."""
        if not isinstance(d, dict):
            raise TrajectoryError("trajectory", f"must be a JSON object, got {type(d).__name__}")
        for key in ("segments", "task_id", "group_id"):
            if key not in d:
                raise TrajectoryError(key, "missing")
        segs = []
        seg_keys = ("prompt_ids", "completion_ids", "loss_mask", "behaviour_logprobs", "policy_versions")
        if not isinstance(d["segments"], list):
            raise TrajectoryError("segments", f"must be a list, got {type(d['segments']).__name__}")
        for i, sd in enumerate(d["segments"]):
            if not isinstance(sd, dict):
                raise TrajectoryError(f"segments[{i}]", f"must be an object, got {type(sd).__name__}")
            for key in seg_keys:
                if key not in sd:
                    raise TrajectoryError(f"segments[{i}].{key}", "missing")
            try:
                fields = {k: sd.get(k) for k in seg_keys + ("raw_logprobs", "routes")}
                if isinstance(fields["routes"], dict):
                    fields["routes"] = decode_array(fields["routes"], f"segments[{i}].routes")
                segs.append(Segment(**fields))
            except TrajectoryError as e:
                raise TrajectoryError(e.field.replace("segment.", f"segments[{i}].", 1), str(e).split(": ", 1)[1]) from None
        terms = {k: (float("nan") if v is None else v) for k, v in (d.get("reward_terms") or {}).items()}
        unknown = set(d.get("effort") or {}) - set(EFFORT_FIELDS)
        if unknown:
            raise TrajectoryError("effort", f"unknown fields {sorted(unknown)}; known: {list(EFFORT_FIELDS)}")
        tool_fields = {f.name for f in dataclasses.fields(ToolEvent)}
        events = []
        for i, ed in enumerate(d.get("tool_events") or []):
            bad = set(ed) - tool_fields
            if bad:
                raise TrajectoryError(f"tool_events[{i}]", f"unknown fields {sorted(bad)}")
            if "name" not in ed:
                raise TrajectoryError(f"tool_events[{i}].name", "missing")
            events.append(ToolEvent(**ed))
        return cls(
            segments=segs,
            task_id=d["task_id"],
            group_id=d["group_id"],
            reward_terms=terms,
            effort=Effort(**(d.get("effort") or {})),
            tool_events=events,
            infra_failed=d.get("infra_failed", False),
            truncated=d.get("truncated", False),
            sample_id=d.get("sample_id", ""),
            metadata=d.get("metadata") or {},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "Trajectory":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TrajectoryError("trajectory", f"invalid JSON: {e}") from None
        return cls.from_dict(d)


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """Compact JSON form of an integer array (routes: T x layers x top_k ints would be huge as lists).

    Stored little-endian in the narrowest unsigned dtype that holds the values, base64-encoded.
    """
    a = np.asarray(a)
    hi = int(a.max()) if a.size else 0
    dt = "<u1" if hi < 2 ** 8 else "<u2" if hi < 2 ** 16 else "<i4"
    return {"shape": list(a.shape), "dtype": dt, "b64": base64.b64encode(a.astype(dt).tobytes()).decode("ascii")}


def decode_array(d: dict[str, Any], name: str) -> np.ndarray:
    """Inverse of `encode_array`; malformed input raises `TrajectoryError` naming the field."""
    try:
        dt = np.dtype(d["dtype"])
        if dt.kind not in "ui":
            raise ValueError(f"dtype {d['dtype']!r} is not an integer type")
        raw = base64.b64decode(d["b64"], validate=True)
        return np.frombuffer(raw, dt).reshape([int(x) for x in d["shape"]]).astype(np.int32)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise TrajectoryError(name, f"malformed encoded array ({e})") from None


def save_jsonl(trajectories: Iterable[Trajectory], path: str) -> None:
    with open(path, "w") as f:
        for t in trajectories:
            f.write(t.to_json() + "\n")


def load_jsonl(path: str) -> list[Trajectory]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f):
            if line.strip():
                try:
                    out.append(Trajectory.from_json(line))
                except TrajectoryError as e:
                    raise TrajectoryError(f"{path}:{n + 1}: {e.field}", str(e).split(": ", 1)[1]) from None
    return out
