"""Weight publishing behind one small interface, so a weight store (compressed deltas) can plug in.

    pub = EnginePublisher(engine)
    pub.publish(params, version)      # never blocks the trainer: the engine swaps between decode steps
    pub.live_version()                # the version the engine serves now (admission reads this)
    pub.wait_live(version, timeout)   # block until it is live (the max_staleness=0 rendezvous)

A `WeightPublisher` is anything with those three methods. `EnginePublisher` uses the sampling
engine's own `update_weights(params, version)` (thread-safe, applied between two decode steps; with
``recompute_cache_on_update`` in-flight sequences keep going and their later tokens carry the new
version). ``EnginePublisher(engine, sync=WeightSync(engine, {"mode": "delta"}))`` routes the
weights through the compressed-delta store instead (`c2jax.sync.engine_sync.WeightSync`, whose
``publish`` is non-blocking too); ``live_version`` is still read from the engine.
"""
from __future__ import annotations

import time
from typing import Any, Protocol


class WeightPublisher(Protocol):
    def publish(self, params: Any, version: int) -> None: ...

    def live_version(self) -> int: ...

    def wait_live(self, version: int, timeout: float | None = None) -> bool: ...


class EnginePublisher:
    """`WeightPublisher` over `c2jax.sampling.Engine.update_weights` (see module docstring)."""

    def __init__(self, engine: Any, sync: Any = None) -> None:
        self.engine = engine
        self.sync = sync  # anything with a non-blocking publish(params, version); None = update_weights
        self.published: int = int(engine.version)
        self.publish_s: float = 0.0  # time the trainer spent inside publish (should stay ~0)

    def publish(self, params: Any, version: int) -> None:
        if int(version) < self.published:
            raise ValueError(f"publish: version {version} is older than the last published ({self.published})")
        t0 = time.monotonic()
        self.engine.start()  # the background loop applies the update even when nothing is generating
        if self.sync is not None:
            self.sync.publish(params, int(version))
        else:
            self.engine.update_weights(params, int(version))
        self.published = int(version)
        self.publish_s += time.monotonic() - t0

    def live_version(self) -> int:
        return int(self.engine.version)

    def wait_live(self, version: int, timeout: float | None = None) -> bool:
        t_end = None if timeout is None else time.monotonic() + timeout
        while self.live_version() < int(version):
            if t_end is not None and time.monotonic() > t_end:
                return False
            time.sleep(0.001)
        return True
