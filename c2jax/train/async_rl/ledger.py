"""The sample ledger: every sample id ends trained exactly once, or dropped with a reason.

    ledger = SampleLedger(path)                      # append-only JSONL, fsynced per event batch
    ledger.queue(["g3/task#0", "g3/task#1"], group=3)
    ledger.move(ids, "rolling_out"); ledger.move(ids, "ready")
    ledger.trained(ids, step=7, version=7)           # or ledger.dropped(ids, "stale")
    ledger.check_complete()                          # raises LedgerError naming the first violation
    ledger.summary()                                 # {"trained": n, "dropped": {"reason": n}, ...}

States (`STATES`) move only forward: queued -> rolling_out -> grading -> ready -> trained | dropped;
a terminal state is never left (a second `trained` for the same id raises: that is a repeated
sample). Going back to ``queued`` is allowed only from a non-terminal state (`requeue`: a lost
worker's group is rolled out again under the same ids and seeds).

Persistence: events are appended to ``path`` as JSON lines and replayed by `SampleLedger.load`.
For restarts the trainer also snapshots the ledger into its own checkpoint (`snapshot` /
`from_snapshot`), so the ledger and the parameters always agree on which samples were trained.
"""
from __future__ import annotations

import collections
import json
import os
import threading
from typing import Any, Iterable, Mapping

STATES = ("queued", "rolling_out", "grading", "ready", "trained", "dropped")
TERMINAL = frozenset({"trained", "dropped"})
_ORDER = {s: i for i, s in enumerate(STATES)}


class LedgerError(RuntimeError):
    """An illegal sample transition (e.g. trained twice) or an incomplete ledger."""


class SampleLedger:
    """Thread-safe record of every sample's lifecycle (see module docstring)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.records: dict[str, dict[str, Any]] = {}
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    # ---- transitions ------------------------------------------------------------------------------
    def queue(self, ids: Iterable[str], group: int) -> None:
        ids = list(ids)
        with self._lock:
            for i in ids:
                if i in self.records:
                    raise LedgerError(f"sample {i!r} queued twice (state {self.records[i]['state']})")
            for i in ids:
                self.records[i] = {"state": "queued", "group": int(group)}
            self._write([{"ev": "queue", "id": i, "group": int(group)} for i in ids])

    def move(self, ids: Iterable[str], state: str) -> None:
        """Advance non-terminal samples to `state` (queued < rolling_out < grading < ready)."""
        if state not in STATES or state in TERMINAL:
            raise ValueError(f"move: state must be one of {[s for s in STATES if s not in TERMINAL]}, got {state!r}")
        ids = list(ids)
        with self._lock:
            for i in ids:
                cur = self._get(i)["state"]
                if cur in TERMINAL or _ORDER[state] < _ORDER[cur]:
                    raise LedgerError(f"sample {i!r}: illegal move {cur} -> {state}")
            for i in ids:
                self.records[i]["state"] = state
            self._write([{"ev": "move", "id": i, "state": state} for i in ids])

    def requeue(self, ids: Iterable[str], why: str) -> None:
        """Back to ``queued`` (a lost worker's group is rolled out again with the same ids and seeds)."""
        ids = list(ids)
        with self._lock:
            for i in ids:
                if self._get(i)["state"] in TERMINAL:
                    raise LedgerError(f"sample {i!r} is {self.records[i]['state']}: it cannot be rolled out again")
            for i in ids:
                self.records[i]["state"] = "queued"
                self.records[i]["retries"] = self.records[i].get("retries", 0) + 1
            self._write([{"ev": "requeue", "id": i, "why": why} for i in ids])

    def trained(self, ids: Iterable[str], step: int, version: int) -> None:
        ids = list(ids)
        with self._lock:
            for i in ids:
                cur = self._get(i)["state"]
                if cur != "ready":
                    raise LedgerError(f"sample {i!r} trained from state {cur!r} (only 'ready' samples train; "
                                      f"'trained' means it would be repeated)")
            for i in ids:
                self.records[i].update(state="trained", step=int(step), version=int(version))
            self._write([{"ev": "trained", "id": i, "step": int(step), "version": int(version)} for i in ids])

    def dropped(self, ids: Iterable[str], reason: str) -> None:
        if not reason:
            raise ValueError("dropped: a reason is required")
        ids = list(ids)
        with self._lock:
            for i in ids:
                if self._get(i)["state"] in TERMINAL:
                    raise LedgerError(f"sample {i!r} dropped ({reason}) after it was {self.records[i]['state']}")
            for i in ids:
                self.records[i].update(state="dropped", reason=str(reason))
            self._write([{"ev": "dropped", "id": i, "reason": str(reason)} for i in ids])

    # ---- queries ----------------------------------------------------------------------------------
    def state(self, sample_id: str) -> str:
        with self._lock:
            return self._get(sample_id)["state"]

    def summary(self) -> dict[str, Any]:
        with self._lock:
            by_state = collections.Counter(r["state"] for r in self.records.values())
            reasons = collections.Counter(r["reason"].split(" ")[0] for r in self.records.values()
                                          if r["state"] == "dropped")
            return {"samples": len(self.records), "trained": by_state.get("trained", 0),
                    "dropped": dict(sorted(reasons.items())),
                    "open": {s: n for s, n in by_state.items() if s not in TERMINAL},
                    "retries": sum(r.get("retries", 0) for r in self.records.values())}

    def check_complete(self) -> None:
        """Every sample is trained (once: enforced on entry) or dropped with a reason."""
        with self._lock:
            for i, r in self.records.items():
                if r["state"] not in TERMINAL:
                    raise LedgerError(f"sample {i!r} left in state {r['state']!r}")
                if r["state"] == "dropped" and not r.get("reason"):
                    raise LedgerError(f"sample {i!r} dropped without a reason")

    # ---- persistence ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"records": {k: dict(v) for k, v in self.records.items()}}

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any], path: str | None = None) -> "SampleLedger":
        led = cls(path)
        led.records = {k: dict(v) for k, v in dict(snap.get("records", {})).items()}
        if path:
            led._write([{"ev": "snapshot", "records": led.records}])
        return led

    @classmethod
    def load(cls, path: str) -> "SampleLedger":
        """Replay the JSONL event log at `path` (a torn last line from a kill is ignored)."""
        led = cls(None)
        with open(path) as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                if n >= len(lines) - 2:
                    break  # torn final write
                raise LedgerError(f"{path}:{n + 1}: corrupt ledger line")
            kind = ev["ev"]
            if kind == "queue":
                led.records[ev["id"]] = {"state": "queued", "group": ev["group"]}
            elif kind == "move":
                led.records[ev["id"]]["state"] = ev["state"]
            elif kind == "requeue":
                r = led.records[ev["id"]]
                r.update(state="queued", retries=r.get("retries", 0) + 1)
            elif kind == "trained":
                led.records[ev["id"]].update(state="trained", step=ev["step"], version=ev["version"])
            elif kind == "dropped":
                led.records[ev["id"]].update(state="dropped", reason=ev["reason"])
            elif kind == "snapshot":
                led.records = {k: dict(v) for k, v in ev["records"].items()}
        led.path = path
        return led

    def _get(self, sample_id: str) -> dict[str, Any]:
        r = self.records.get(sample_id)
        if r is None:
            raise LedgerError(f"unknown sample {sample_id!r}")
        return r

    def _write(self, events: list[dict]) -> None:
        if not self.path or not events:
            return
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))
            f.flush()
            os.fsync(f.fileno())
