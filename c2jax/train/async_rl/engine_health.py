"""The inference service on the embedded backend: a stable handle to the sampling engine that a health
check can replace when the engine dies.

    engine = SupervisedEngine(ctx.engine, params=state.params, version=0, tokenizer=tok)
    policy.engine = engine; publisher.engine = engine     # everything talks to the handle
    engine.healthy()           # False once the engine's scheduler thread has died
    engine.replace()           # new Engine with the latest published weights; old requests fail

On the embedded backend the engine is a scheduler thread in this process (`c2jax.sampling.Engine`);
"the engine process is killed" there means that thread dies (an exception in a decode step, a device
error). Its requests would then wait forever. `replace` builds a new engine from the same model and
engine config with the weights of the latest ``update_weights`` the handle forwarded (with
``rl.weight_sync='delta'`` those are the weight store's rebuilt, hash-verified weights: `WeightSync`
delivers through this handle) at that version, starts it, and fails every request the dead engine
held with `EngineLost`; the rollout worker turns an episode lost that way into a lost group
(`workers.RolloutWorker.run_group`), which the driver rolls out again with the same ids and seeds.

Requests go through the handle (`submit` / `agenerate`) under the same lock `replace` takes, so no
request can reach the dead engine after its requests were failed. The handle's futures are its own:
a caller that goes away (an episode cancelled when its group is lost) cancels the request in the
engine instead of cancelling the engine's future, which the engine's loop would later try to
resolve (a cancelled future cannot be resolved, and the exception would end the loop thread).
Everything else (``version``, ``config``, ``update_weights`` ...) is forwarded to the current engine.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from typing import Any, Callable


class EngineLost(RuntimeError):
    """The engine serving a request died before finishing it (the request was not sampled)."""


def engine_alive(engine: Any) -> bool:
    """False iff the engine's background loop was started and its thread has ended without shutdown."""
    t = getattr(engine, "_thread", None)  # c2jax.sampling.Engine keeps its loop thread here
    return t is None or t.is_alive()


class SupervisedEngine:
    """See the module docstring."""

    def __init__(self, engine: Any, *, params: Any, version: int, tokenizer: Any = None,
                 build: Callable[[Any, int], Any] | None = None) -> None:
        self.current = engine
        self.original = engine
        self._latest = (params, int(version))  # the weights a replacement starts from
        self._lock = threading.RLock()
        self.replacements = 0
        self.failed_requests = 0
        self._build = build or self._same_config(engine, tokenizer)

    @staticmethod
    def _same_config(engine: Any, tokenizer: Any) -> Callable[[Any, int], Any]:
        def build(params: Any, version: int) -> Any:
            from c2jax.sampling import Engine

            return Engine(params, engine.model_cfg, engine.config, tokenizer=tokenizer, version=version)
        return build

    # ---- forwarded API -------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in ("current", "_lock"):  # not yet set (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.current, name)

    def update_weights(self, params: Any, version: int) -> None:
        """Forward to the current engine and remember the weights for a replacement."""
        with self._lock:
            self.current.update_weights(params, version)
            self._latest = (params, int(version))

    def start(self) -> "SupervisedEngine":
        with self._lock:
            self.current.start()
        return self

    def submit(self, req: Any) -> cf.Future:
        """The request's future (this handle's own; see the module docstring)."""
        outer: cf.Future = cf.Future()
        with self._lock:
            engine = self.current
            inner = engine.submit(req)

        def relay(f: cf.Future) -> None:
            try:
                if f.cancelled():
                    outer.cancel()
                elif f.exception() is not None:
                    outer.set_exception(f.exception())
                else:
                    outer.set_result(f.result())
            except cf.InvalidStateError:
                pass  # the caller cancelled first

        def on_cancel(f: cf.Future) -> None:
            if f.cancelled() and getattr(req, "id", None) is not None and not inner.done():
                engine.cancel(req.id)

        inner.add_done_callback(relay)
        outer.add_done_callback(on_cancel)
        return outer

    async def agenerate(self, req: Any) -> Any:
        return await asyncio.wrap_future(self.submit(req))

    # ---- health --------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        return engine_alive(self.current)

    def replace(self) -> Any:
        """A new engine with the latest weights in place of the current one; the old engine's
        unfinished requests fail with `EngineLost`. Returns the new engine."""
        with self._lock:
            old = self.current
            params, version = self._latest
            new = self._build(params, version)
            new.start()
            self.current = new
            self.replacements += 1
            lost = old.unfinished()  # inbox, queue and rows; takes no step lock (the old loop may be stuck)
            for seq in lost:
                fut = getattr(seq, "future", None)
                if fut is not None and not fut.done():
                    try:
                        fut.set_exception(EngineLost(f"engine died serving request {seq.req.id!r}; "
                                                     f"replaced by a new engine at version {version}"))
                        self.failed_requests += 1
                    except cf.InvalidStateError:
                        pass
        if old is not self.original:
            try:
                old.shutdown()  # its loop already ended; this only clears it
            except Exception:  # noqa: BLE001 - a dead engine may fail to shut down; it is replaced anyway
                pass
        return new

    def close_replacements(self) -> None:
        """Shut down a replacement engine (the original belongs to whoever built it)."""
        if self.current is not self.original:
            self.current.shutdown()
