"""How an RL step hands the learner's weights to the sampling engine: ``rl.weight_sync``.

    sync = WeightSync(engine, {"mode": "delta", "full_every": 10})   # or {"mode": "direct"} (the default)
    seconds_in_caller = sync.publish(params, version)   # never waits for compression
    sync.wait()        # before rollouts that must see `version` (max_staleness 0): the engine has it
    sync.metrics()     # weight_sync/* of the last publish (delta mode), for the step's metrics
    sync.close()

* ``direct``: ``engine.update_weights(params, version)`` (what rl_step does today).
* ``delta``: `WeightPublisher` (XOR deltas + zstd in a background thread, in memory or under
  ``dir``) and, on a second background thread, `WeightSubscriber.rebuild` + ``update_weights`` — the
  path a remote inference fleet takes, here in one process. The engine receives the rebuilt,
  hash-verified weights, never the learner's buffers.

``resolve_weight_sync(raw)`` checks the section and fills defaults (clear errors before any compute):
``{"mode": "direct" | "delta", "full_every": int >= 1, "dir": None | path, "wire_dtype": None | float
dtype name, "keep_full": None | int >= 1, "level": zstd level}``. The engine's ``engine`` argument is
duck-typed (anything with ``update_weights(params, version)``), so this module stays on the
foundations floor.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Mapping, Optional

from c2jax.sync.errors import MissingLinkError
from c2jax.sync.weight_store import WeightPublisher, WeightSubscriber, publish_to_engine

DEFAULTS = {"mode": "direct", "full_every": 10, "dir": None, "wire_dtype": None, "keep_full": 2, "level": 3}
MODES = ("direct", "delta")


def resolve_weight_sync(raw: Optional[Mapping[str, Any]]) -> dict:
    """The ``rl.weight_sync`` section with defaults; ValueError listing every bad key."""
    raw = dict(raw or {})
    errors = [f"unknown key {k!r} (known: {sorted(DEFAULTS)})" for k in raw if k not in DEFAULTS]
    out = dict(DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS})
    if out["mode"] not in MODES:
        errors.append(f"mode must be one of {MODES}, got {out['mode']!r}")
    for k, lo in (("full_every", 1), ("keep_full", 1)):
        v = out[k]
        if (v is not None or k == "full_every") and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            errors.append(f"{k} must be an int >= {lo}{' or None' if k == 'keep_full' else ''}, got {v!r}")
    if isinstance(out["level"], bool) or not isinstance(out["level"], int) or not -7 <= out["level"] <= 22:
        errors.append(f"level must be an int zstd level in [-7, 22], got {out['level']!r}")
    if out["dir"] is not None and not isinstance(out["dir"], str):
        errors.append(f"dir must be None (in memory) or a path string, got {out['dir']!r}")
    if out["wire_dtype"] is not None:
        import jax.numpy as jnp

        try:
            ok = jnp.issubdtype(jnp.dtype(out["wire_dtype"]), jnp.floating)
        except TypeError:
            ok = False
        if not ok:
            errors.append(f"wire_dtype must be None or a floating dtype name, got {out['wire_dtype']!r}")
    if errors:
        raise ValueError("rl.weight_sync: " + "; ".join(errors))
    return out


def engine_params(params: Any, cfg: Optional[Mapping[str, Any]]) -> Any:
    """The weights an engine fed by this sync must start from: with ``mode='delta'`` and a
    ``wire_dtype``, every floating leaf cast to that dtype (a bf16 sampler beside f32 masters, as in
    production; the engine checks that later updates keep its dtypes); otherwise `params` unchanged."""
    c = resolve_weight_sync(cfg)
    if c["mode"] != "delta" or c["wire_dtype"] is None:
        return params
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(c["wire_dtype"])
    return jax.tree_util.tree_map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


class WeightSync:
    """See the module docstring."""

    def __init__(self, engine: Any, cfg: Optional[Mapping[str, Any]] = None) -> None:
        self.cfg = resolve_weight_sync(cfg)
        self.engine = engine
        self.publisher: Optional[WeightPublisher] = None
        self.subscriber: Optional[WeightSubscriber] = None
        self._deliveries: list[concurrent.futures.Future] = []
        self._last_version: Optional[int] = None
        if self.cfg["mode"] == "delta":
            c = self.cfg
            self.publisher = WeightPublisher(c["dir"], full_every=c["full_every"], wire_dtype=c["wire_dtype"],
                                             level=c["level"], keep_full=c["keep_full"], replace_newer=True)
            self.subscriber = WeightSubscriber(self.publisher.store)
            self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="c2jax-weight-rebuild")

    def publish(self, params: Any, version: int) -> float:
        """Start publishing `version`; returns the seconds spent in the caller. Versions increase
        (an older one raises StaleRecordError); the last version again re-delivers its stored weights
        (`params` are then not read)."""
        t0 = time.monotonic()
        if self.publisher is None:
            self.engine.update_weights(params, version)
        elif self._last_version is not None and int(version) == self._last_version:
            # the same version again (a restarted engine starts from other weights): deliver the
            # stored record once more, nothing new is written
            self._deliveries.append(self._reader.submit(publish_to_engine, self.engine, self.subscriber, int(version)))
        else:
            written = self.publisher.publish(params, version)
            self._last_version = int(version)
            self._deliveries.append(self._reader.submit(self._deliver, written, int(version)))
        return time.monotonic() - t0

    def _deliver(self, written: concurrent.futures.Future, version: int) -> int:
        written.result()
        try:
            return publish_to_engine(self.engine, self.subscriber, version)
        except MissingLinkError:
            latest = self.subscriber.latest()
            if latest is not None and latest > version:
                return version  # pruned behind a newer full snapshot: the delivery queued after this one wins
            raise

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block until the engine holds the last published version (returned); re-raise the first failed
        publish / rebuild since the last wait()."""
        pending, self._deliveries = self._deliveries, []
        out = None
        for i, fut in enumerate(pending):
            try:
                out = fut.result(timeout=timeout)
            except BaseException:
                self._deliveries = pending[i + 1:]
                raise
        return out

    def metrics(self) -> dict[str, float]:
        st = self.publisher.publish_stats if self.publisher is not None else None
        return {} if st is None else st.metrics()

    def close(self) -> None:
        if self.publisher is not None:
            try:
                self.wait()
            finally:
                self.publisher.close()
                self._reader.shutdown(wait=True)
