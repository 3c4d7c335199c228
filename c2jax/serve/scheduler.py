"""One thread that drives the sampling engine for the HTTP server and routes each request's events.

Connection threads `submit` a `Request` and read ``("token", StreamEvent)``, then ``("done", Result)``
(or ``("error", text)`` if a step raised) from the queue they get back; `cancel` stops a request
whose client went away, so its slot is free for the others at the next step.
"""
from __future__ import annotations

import queue
import threading
from typing import Any

from c2jax.sampling import Request


class Scheduler:
    """Drives `engine.step()` in one thread; continuous batching across all open requests."""

    def __init__(self, engine: Any) -> None:
        if getattr(engine, "_thread", None) is not None:
            engine.shutdown()  # one driver only: the engine's own loop would consume our events
        self.engine = engine
        self.cond = threading.Condition()
        self.queues: dict[str, queue.Queue] = {}
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="c2jax-serve-scheduler", daemon=True)
        self.thread.start()

    def submit(self, req: Request) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        with self.cond:
            self.queues[req.id] = q
            seq = self.engine.add_request(req)
            if seq.result is not None:  # rejected at once
                self.queues.pop(req.id, None)
                q.put(("done", seq.result))
            self.cond.notify_all()
        return q

    def cancel(self, request_id: str) -> bool:
        """Stop a request nobody is waiting for; its events are dropped. False if already finished."""
        with self.cond:
            self.queues.pop(request_id, None)
            ok = self.engine.cancel(request_id)
            self.cond.notify_all()
        return ok

    def _loop(self) -> None:
        while True:
            with self.cond:
                while self.running and not self.engine.has_work():
                    self.cond.wait(0.5)
                if not self.running:
                    return
            try:
                events = self.engine.step()
            except Exception as e:  # noqa: BLE001 - fail every waiting request, keep serving
                with self.cond:
                    qs, self.queues = list(self.queues.values()), {}
                for q in qs:
                    q.put(("error", f"{type(e).__name__}: {e}"))
                continue
            for ev in events:
                with self.cond:
                    q = self.queues.get(ev.request_id)
                    if ev.result is not None:
                        self.queues.pop(ev.request_id, None)
                if q is not None:
                    q.put(("done", ev.result) if ev.result is not None else ("token", ev))

    def stop(self) -> None:
        with self.cond:
            self.running = False
            self.cond.notify_all()
        self.thread.join(timeout=10)
