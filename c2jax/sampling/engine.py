"""The sampling engine: fixed slots, continuous batching, prefix reuse, in-flight weight updates.

    from c2jax.sampling import Engine, EngineConfig, Request, SamplingParams
    eng = Engine(params, model_cfg, EngineConfig(max_slots=8, max_len=1024), tokenizer=tok)
    results = eng.generate([Request(prompt_ids, SamplingParams(temperature=0.8, seed=1))])
    for ev in eng.stream(requests): ...            # token events, then the finished Result
    eng.start(); fut = eng.submit(req); res = await eng.agenerate(req)   # background loop

Design (all decode work jitted with fixed shapes, see device.py; the host loop does per-step
bookkeeping only):
* Slots: ``max_slots`` cache rows of ``max_len`` positions. Each scheduler step (1) applies a
  pending weight update, (2) admits queued requests into free rows (continuous batching; with
  ``continuous=False`` only when every row is free: static batching, for comparison), prefilling
  each prompt in bucketed chunks into its row, (3) runs one decode step over all rows.
* The forward is the model's own decoder block over per-layer (unstacked) serving weights
  (forward.py); attention runs over a power-of-two window of the cache that covers the longest
  row (``min_window`` .. ``max_len``), so a large ``max_len`` costs nothing until it is used.
* A finished sequence's last token is still fed once (one extra step for that row) so that its
  routes exist and its row then holds the KV of the WHOLE sequence; the row keeps it after the
  sequence leaves (LRU over free rows).
* Prefix reuse: a new prompt is matched against the token contents of every row (free rows kept
  from finished sequences and rows of running ones); the longest common prefix (at least
  ``min_prefix_reuse`` tokens, at most prompt length - 1) is reused: in place when the row is free,
  else copied to a free row on device. Only the rest of the prompt is prefilled. Routes and policy
  versions of reused tokens are the recorded ones of the tokens whose KV is reused.
* `update_weights(params, version)`: takes effect between two decode steps; in-flight sequences
  keep their KV cache (computed by the old weights; their tokens keep recording the version that
  processed them) unless ``recompute_cache_on_update=True``, which re-prefills every running
  row with the new weights (routes and ``route_versions`` are then the new ones, prompt tokens get
  the new version; generated tokens keep the version that sampled them) and drops the stale
  free rows from the prefix cache.
* Numerics: the model config's ``dtype`` and ``moe.precision`` (so the sampler can run in the
  trainer's low precision). ``moe_impl='auto'`` runs the experts with the exact all-experts
  kernel (`c2jax.model.moe_dense`) when ``n_routed_experts <= 64`` (CPU / small models) and with
  ``'dropless'`` otherwise; the capacity implementation is never used (it drops tokens).
* ``spec_decode=True``: greedy rows decode speculatively with the model's MTP head (spec.py);
  output unchanged, acceptance rate in `spec_acceptance_rate`.
* `cancel(request_id)`: a queued or running request stops at the next step (``finish_reason=
  'cancelled'``) and frees its row, e.g. when the server's client disconnects.
* Threads: `add_request` / `submit` / `update_weights` never wait for a running step. They put
  their work in an inbox guarded by a lock of its own (the wake-up condition's) that no step
  holds; the next `step()` moves the inbox into the queue, in submission order. So an agent
  harness on an event loop submits its next turn (or a tool call's continuation) at once instead
  of blocking its whole loop for the rest of a decode step. `cancel` does wait for the step (it
  edits the rows), which is fine: it is rare.
* Sequences are limited to ``max_len`` tokens in total: a sequence that reaches it ends with
  ``finish_reason='length'``.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import ModelConfig
from c2jax.model import moe_dense
from c2jax.model.moe_impls import exact_moe_impls
from c2jax.sampling.device import compiled
from c2jax.sampling.forward import init_serving_cache, prepare
from c2jax.sampling.requests import StreamEvent, SeqState
from c2jax.sampling.stops import StopMatcher, token_byte_table
from c2jax.sampling.types import Request, RequestError, Result, SamplingParams, validate_request


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 8  # concurrent sequences (cache rows)
    max_len: int = 512  # positions per row: prompt + generated tokens
    prefill_chunk: int = 256  # largest prefill call; chunks are padded to powers of two >= 16
    prefix_reuse: bool = True
    min_prefix_reuse: int = 1
    continuous: bool = True  # False = static batching (admit only into an empty engine)
    recompute_cache_on_update: bool = False
    moe_impl: str = "auto"  # 'auto' | a name of c2jax.model.MOE_IMPLS that drops no token (exact_moe_impls)
    cache_dtype: Optional[str] = None  # default: the model dtype
    spec_decode: bool = False  # MTP speculative decoding for greedy rows (needs mtp_depth >= 1)
    seed: int = 0  # draws the seeds of requests that do not set one
    min_window: int = 128  # smallest attention window (power of two); see device.py

    def validate(self, cfg: ModelConfig) -> None:
        problems = []
        if self.max_slots < 1:
            problems.append(f"max_slots must be >= 1, got {self.max_slots}")
        if self.max_len < 2:
            problems.append(f"max_len must be >= 2, got {self.max_len}")
        if self.min_window < 1 or self.min_window & (self.min_window - 1):
            problems.append(f"min_window must be a power of two >= 1, got {self.min_window}")
        if self.prefill_chunk < 16 or self.prefill_chunk & (self.prefill_chunk - 1):
            problems.append(f"prefill_chunk must be a power of two >= 16, got {self.prefill_chunk}")
        if self.moe_impl != "auto" and self.moe_impl not in exact_moe_impls():
            problems.append(f"moe_impl {self.moe_impl!r}: use 'auto' or one of {exact_moe_impls()} (an "
                            "implementation that drops tokens, e.g. 'capacity', would drop them at decode)")
        if self.spec_decode and cfg.mtp_depth < 1:
            problems.append("spec_decode needs a model with mtp_depth >= 1")
        if problems:
            raise ValueError("invalid EngineConfig: " + "; ".join(problems))


def _shapes(params: dict) -> dict:
    """{'a/b/c': (shape, dtype)} of every leaf: what a weight update must match."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(k): (tuple(v.shape), str(v.dtype)) for k, v in flat}


class Engine:
    """Batched KV-cache generation with logprobs, routed experts and in-flight weight updates."""

    def __init__(self, params: dict, model_cfg: ModelConfig, config: EngineConfig = EngineConfig(), *,
                 tokenizer: Any = None, version: int = 0):
        config.validate(model_cfg)
        self.config = config
        impl = config.moe_impl
        if impl == "auto":
            impl = moe_dense.NAME if model_cfg.moe.n_routed_experts <= 64 else "dropless"
        self.model_cfg = model_cfg
        self.run_cfg = model_cfg.replace(**{"moe.impl": impl})  # numerics: dtype + moe.precision kept
        self._param_shapes = _shapes(params)
        self.params = self._prepare(params)
        self.version = int(version)
        self._steps = compiled(self.run_cfg)
        S, T = config.max_slots, config.max_len
        self.cache = init_serving_cache(model_cfg, S, T, config.cache_dtype)
        nm, k = model_cfg.n_moe_layers, model_cfg.moe.top_k
        self.row_tokens = np.zeros((S, T), np.int32)
        self.row_len = np.zeros((S,), np.int64)
        self.row_routes = np.zeros((S, T, nm, k), np.int32)
        self.row_versions = np.zeros((S, T), np.int64)
        self.row_route_versions = np.zeros((S, T), np.int64)
        self.row_reusable = np.zeros((S,), bool)
        self.row_last_used = np.zeros((S,), np.int64)
        self.row_seq: list[Optional[SeqState]] = [None] * S
        # per-slot sampling parameters (device inputs of every decode step)
        self._temp = np.zeros((S,), np.float32)
        self._top_p = np.ones((S,), np.float32)
        self._top_k = np.zeros((S,), np.int32)
        self._seed = np.zeros((S,), np.uint32)
        self._samp_dev: Optional[dict] = None
        self.queue: collections.deque[SeqState] = collections.deque()
        self._tick = 0
        self._n_submitted = 0
        self._seed_rng = np.random.default_rng(config.seed)
        self._lock = threading.RLock()  # engine state (rows, queue, cache); held for a whole step
        # The inbox, pending update, loop state and seed draws; never held across device work, so
        # callers on other threads (an event loop submitting a request) do not wait for a step.
        self._wake = threading.Condition(threading.Lock())
        self._inbox: list[SeqState] = []  # submitted, not yet seen by a step (drained in order)
        self._pending: Optional[tuple[dict, int]] = None
        self._cancelled: collections.deque[SeqState] = collections.deque()  # cancelled while queued
        self._thread: Optional[threading.Thread] = None
        self._running = False
        self._byte_table = None if tokenizer is None else token_byte_table(tokenizer, model_cfg.vocab_size)
        self.stats = collections.Counter()
        self._spec = None
        if config.spec_decode:
            from c2jax.sampling.spec import SpecDecoder
            self._spec = SpecDecoder(self)

    # ---- public API ------------------------------------------------------------------------
    def add_request(self, req: Request, index: Optional[int] = None,
                    future: Optional[concurrent.futures.Future] = None) -> SeqState:
        """Validate and queue one request (thread-safe; does not wait for a running step: the
        next step picks it up). An invalid request finishes at once with ``result.error`` set
        (other requests are unaffected); `future`, if given, resolves to the request's `Result`."""
        with self._wake:
            idx = self._n_submitted if index is None else index
            self._n_submitted += 1
            seq = SeqState(index=idx, req=req, params=getattr(req, "params", None), prompt=np.zeros((0,), np.int32),
                       seed=0, future=future)
            try:
                if not isinstance(req, Request):
                    raise RequestError(f"expected a Request, got {type(req).__name__}")
                p = validate_request(req, vocab_size=self.model_cfg.vocab_size, max_len=self.config.max_len)
                if p.stop_strings and self._byte_table is None:
                    raise RequestError("stop_strings need the engine to have a tokenizer")
            except RequestError as e:
                seq.result = Result(id=getattr(req, "id", None), finish_reason="error", error=e)
                self.stats["rejected"] += 1
                if future is not None:
                    future.set_result(seq.result)
                return seq
            seq.prompt = np.asarray(req.prompt, np.int32)
            seq.seed = int(p.seed) if p.seed is not None else int(self._seed_rng.integers(0, 2**32))
            if p.stop_strings:
                seq.matcher = StopMatcher(p.stop_strings, p.include_stop_str)
            self._inbox.append(seq)
            self._wake.notify_all()
            return seq

    def _take_inbox(self) -> None:
        """Move submitted requests into the queue (caller holds ``_lock``)."""
        with self._wake:
            inbox, self._inbox = self._inbox, []
        self.queue.extend(inbox)

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def unfinished(self) -> list[SeqState]:
        """Requests submitted and not finished: the inbox, the queue and the running rows (a
        snapshot that takes no step lock, so it also works on an engine whose loop is stuck or dead)."""
        with self._wake:
            out = list(self._inbox)  # read before the queue: a request moving on is seen twice, never missed
        out += list(self.queue) + list(self._cancelled) + [s for s in list(self.row_seq) if s is not None]
        seen: set[int] = set()
        return [s for s in out if not (id(s) in seen or seen.add(id(s)))]

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed MTP drafts so far (NaN before any proposal)."""
        p = self.stats["spec_proposed"]
        return self.stats["spec_accepted"] / p if p else float("nan")

    def has_work(self) -> bool:
        return (bool(self._inbox) or bool(self.queue) or bool(self._cancelled)
                or any(s is not None for s in self.row_seq))

    def cancel(self, request_id: str) -> bool:
        """Stop request `request_id` (thread-safe), e.g. because its client went away.

        A queued request leaves the queue; a running one stops sampling and its row is freed at the
        next step (its last token is still fed, so the row keeps the whole sequence for prefix
        reuse). Either way it finishes at the next `step()` with ``finish_reason='cancelled'`` and
        the tokens generated so far. Returns False if no queued or running request has that id."""
        with self._lock:
            self._take_inbox()
            for seq in self.queue:
                if seq.req.id == request_id:
                    self.queue.remove(seq)
                    seq.finish_reason = "cancelled"
                    self._cancelled.append(seq)
                    self.stats["cancelled"] += 1
                    self._notify()
                    return True
            for seq in self.row_seq:
                if seq is not None and seq.req.id == request_id and seq.finish_reason is None:
                    seq.finish_reason, seq.draining = "cancelled", True
                    self.stats["cancelled"] += 1
                    self._notify()
                    return True
        return False

    def update_weights(self, params: dict, version: int) -> None:
        """Swap in new weights between two decode steps (thread-safe; nothing in flight is dropped).

        Raises ValueError (and keeps the current weights) if the tree, shapes or dtypes differ."""
        got = _shapes(params)
        if got != self._param_shapes:
            diff = [k for k in sorted(set(got) | set(self._param_shapes)) if got.get(k) != self._param_shapes.get(k)]
            raise ValueError(f"update_weights: parameter tree does not match the engine's model: "
                             f"{len(diff)} mismatching leaves, e.g. {diff[:3]} "
                             f"(got {[got.get(k) for k in diff[:3]]}, expected {[self._param_shapes.get(k) for k in diff[:3]]})")
        with self._wake:  # not the step lock: the weight-sync thread does not wait for a decode step
            self._pending = (params, int(version))
            self._wake.notify_all()

    def step(self) -> list[StreamEvent]:
        """One scheduler iteration: pending weight update, admissions (+prefill), one decode step."""
        events: list[StreamEvent] = []
        with self._lock:
            with self._wake:
                pending, self._pending = self._pending, None
            if pending is not None:
                self._apply_update(*pending)
            self._take_inbox()
            while self._cancelled:  # cancelled before admission: finish without a row
                self._finish_unstarted(self._cancelled.popleft(), events)
            self._admit(events)
            if any(s is not None for s in self.row_seq):
                if self._spec is not None:
                    self._spec.step(events)
                else:
                    self._decode(events)
        return events

    def generate(self, requests: Sequence[Request]) -> list[Result]:
        """Run `requests` to completion; results in input order (rejected ones carry `.error`)."""
        return [ev.result for ev in sorted(self._drive(requests, stream=False), key=lambda e: e.index)]

    def stream(self, requests: Sequence[Request]) -> Iterator[StreamEvent]:
        """Like `generate`, yielding a `StreamEvent` per generated token and one per finished request."""
        yield from self._drive(requests, stream=True)

    # background loop: submit() / agenerate() -----------------------------------------------
    def start(self) -> "Engine":
        """Run the scheduler loop in a background thread (for `submit` / `agenerate`). Returns at
        once if it runs already (no lock: `submit` calls this on every request)."""
        if self._thread is not None:
            return self
        with self._wake:
            if self._thread is None:
                self._running = True
                self._thread = threading.Thread(target=self._loop, name="c2jax-sampler", daemon=True)
                self._thread.start()
        return self

    def shutdown(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify_all()
            t = self._thread
        if t is not None:
            t.join()
        self._thread = None

    def submit(self, req: Request) -> concurrent.futures.Future:
        """Queue `req` on the background loop; the future resolves to its `Result`."""
        if self._thread is None:
            self.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.add_request(req, future=fut)
        return fut

    async def agenerate(self, req: Request) -> Result:
        """asyncio form of `submit`."""
        return await asyncio.wrap_future(self.submit(req))

    def _loop(self) -> None:
        while True:
            with self._wake:  # every producer notifies under this lock: no wake-up is lost
                while self._running and not self.has_work() and self._pending is None:
                    self._wake.wait()
                if not self._running:
                    return
            self.step()  # finished requests resolve their futures in _finish

    # ---- scheduling ------------------------------------------------------------------------
    def _drive(self, requests: Sequence[Request], stream: bool) -> Iterator[StreamEvent]:
        if self._thread is not None:
            raise RuntimeError("generate/stream cannot run while the background loop is started; use submit")
        seqs = [self.add_request(r, index=i) for i, r in enumerate(requests)]
        todo = set()
        for s in seqs:
            if s.result is not None:
                yield StreamEvent(s.index, s.result.id, result=s.result)
            else:
                todo.add(id(s))
        mine = {id(s) for s in seqs}
        while todo:
            for ev in self.step():
                if ev._seq_id not in mine:  # type: ignore[attr-defined]
                    continue
                if ev.result is not None:
                    todo.discard(ev._seq_id)  # type: ignore[attr-defined]
                    yield ev
                elif stream:
                    yield ev

    def _event(self, seq: SeqState, **kw) -> StreamEvent:
        ev = StreamEvent(seq.index, seq.req.id, **kw)
        ev._seq_id = id(seq)  # type: ignore[attr-defined]
        return ev

    def _pick_row(self, seq: SeqState, free: list[int]) -> tuple[int, int, int]:
        """-> (slot, reuse length, source row or -1)."""
        best, src = 0, -1
        if self.config.prefix_reuse:
            p = seq.prompt
            for r in range(self.config.max_slots):
                n = int(min(self.row_len[r], len(p) - 1))
                if n <= best or not self.row_reusable[r]:
                    continue
                neq = np.flatnonzero(self.row_tokens[r, :n] != p[:n])
                lcp = int(neq[0]) if neq.size else n
                if lcp > best or (lcp == best and src not in free and r in free):
                    best, src = lcp, r
        if self._spec is not None:
            best -= 1  # the MTP entry of the last reused position depends on the next token
        if best >= max(1, self.config.min_prefix_reuse) and src >= 0:
            if src in free:
                return src, best, -1
            slot = min(free, key=lambda r: (self.row_reusable[r], self.row_last_used[r]))
            return slot, best, src
        slot = min(free, key=lambda r: (self.row_reusable[r], self.row_last_used[r]))
        return slot, 0, -1

    def _admit(self, events: list) -> None:
        free = [r for r in range(self.config.max_slots) if self.row_seq[r] is None]
        if not self.config.continuous and len(free) < self.config.max_slots:
            return
        while self.queue and free:
            seq = self.queue.popleft()
            slot, reuse, src = self._pick_row(seq, free)
            free.remove(slot)
            if src >= 0:
                self.cache = self._steps.copy_row(self.cache, jnp.int32(src), jnp.int32(slot), jnp.int32(reuse))
                if self._spec is not None:
                    self._spec.copy_row(src, slot, reuse)
                for a in (self.row_tokens, self.row_routes, self.row_versions, self.row_route_versions):
                    a[slot, :reuse] = a[src, :reuse]
                self.stats["prefix_copies"] += 1
            self._start(seq, slot, reuse, events)

    def _window(self, n: int) -> int:
        """Attention window for positions < n: a power of two >= max(n, min_window), <= max_len."""
        w = max(self.config.min_window, 1 << max(0, n - 1).bit_length())
        return min(w, self.config.max_len)

    def _buckets(self, n: int) -> int:
        c = 16
        while c < n and c < self.config.prefill_chunk:
            c *= 2
        return c

    def _prefill(self, slot: int, tokens: np.ndarray, start: int, samp: dict, draw: int, follow: int = -1):
        """Chunked prefill of `tokens` into row `slot` from position `start`. Returns the last
        chunk's (token, logprob_sampling, logprob_raw) and fills row routes/tokens. `follow` is
        the token after `tokens` if already known (speculative decoding's MTP cache needs it)."""
        pos, end = start, start + len(tokens)
        while pos < end:
            n = min(self.config.prefill_chunk, end - pos)
            c = self._buckets(n)
            chunk = np.zeros((c,), np.int32)
            chunk[:n] = tokens[pos - start: pos - start + n]
            if self._spec is not None:
                fol = int(tokens[pos - start + n]) if pos + n < end else follow
                tok, lps, lpr, routes = self._spec.prefill(slot, chunk, pos, n, fol, samp, draw)
            else:
                self.cache, tok, lps, lpr, routes = self._steps.prefill(
                    self._window(pos + n), self.params, self.cache, jnp.int32(slot), jnp.asarray(chunk),
                    jnp.int32(pos), jnp.int32(n), samp, jnp.int32(draw))
            self.row_tokens[slot, pos:pos + n] = chunk[:n]
            self.row_routes[slot, pos:pos + n] = np.asarray(routes)[:n]
            self.row_route_versions[slot, pos:pos + n] = self.version
            self.stats["prefill_tokens"] += n
            self.stats["prefill_calls"] += 1
            pos += n
        self.row_len[slot] = end
        return int(tok), float(lps), float(lpr)

    def _start(self, seq: SeqState, slot: int, reuse: int, events: list) -> None:
        p = seq.params
        seq.slot, seq.reused = slot, reuse
        self.row_seq[slot] = seq
        self.row_reusable[slot] = True
        self._temp[slot], self._top_p[slot], self._top_k[slot] = p.temperature, p.top_p, p.top_k
        self._seed[slot] = seq.seed
        self._samp_dev = None
        samp = {"temperature": jnp.float32(p.temperature), "top_p": jnp.float32(p.top_p),
                "top_k": jnp.int32(p.top_k), "seed": jnp.uint32(seq.seed)}
        P = len(seq.prompt)
        tok, lps, lpr = self._prefill(slot, seq.prompt[reuse:], reuse, samp, 0)
        self.row_versions[slot, reuse:P] = self.version
        self.stats["reused_tokens"] += reuse
        self._append(seq, tok, lps, lpr, events)

    def _append(self, seq: SeqState, tok: int, lps: float, lpr: float, events: list) -> None:
        """Record a newly sampled token of `seq` and decide whether it ends the sequence."""
        slot, p = seq.slot, seq.params
        pos = len(seq.prompt) + len(seq.gen)  # position the token will be fed at
        seq.gen.append(tok)
        seq.lps.append(lps)
        seq.lpr.append(lpr)
        seq.next_tok = tok
        self.row_versions[slot, pos] = self.version
        self.stats["generated_tokens"] += 1
        events.append(self._event(seq, token=tok, logprob=lps, raw_logprob=lpr, version=self.version))
        if tok in p.stop_token_ids:
            seq.finish_reason, seq.stop = "stop_token", tok
        else:
            if seq.matcher is not None and seq.matcher.feed(self._byte_table[tok]):
                seq.finish_reason, seq.stop = "stop_string", seq.matcher.matched
            elif len(seq.gen) >= p.max_new_tokens or pos + 1 >= self.config.max_len:
                seq.finish_reason = "length"
        if seq.finish_reason is not None:
            seq.draining = True

    def _decode(self, events: list) -> None:
        S = self.config.max_slots
        tok = np.zeros((S,), np.int32)
        active = np.zeros((S,), bool)
        draw = np.zeros((S,), np.int32)
        for s, seq in enumerate(self.row_seq):
            if seq is not None:
                tok[s], active[s], draw[s] = seq.next_tok, True, len(seq.gen)
        win = self._window(int(self.row_len[active].max()) + 1)
        self.cache, nxt, lps, lpr, routes = self._steps.decode(
            win, self.params, self.cache, jnp.asarray(tok), jnp.asarray(active), self._samp_device(), jnp.asarray(draw))
        nxt, lps, lpr, routes = jax.device_get((nxt, lps, lpr, routes))
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += int(active.sum())  # rows that carried a sequence (the rest idle)
        for s in np.flatnonzero(active):
            self._fed(s, tok[s], routes[s])
            seq = self.row_seq[s]
            if seq.draining:
                self._finish(seq, events)
            else:
                self._append(seq, int(nxt[s]), float(lps[s]), float(lpr[s]), events)

    def _samp_device(self) -> dict:
        """Per-slot sampling parameters on device (uploaded again only after an admission)."""
        if self._samp_dev is None:
            self._samp_dev = {"temperature": jnp.array(self._temp), "top_p": jnp.array(self._top_p),
                              "top_k": jnp.array(self._top_k), "seed": jnp.array(self._seed)}  # copies
        return self._samp_dev

    def _fed(self, s: int, tok: int, routes: np.ndarray) -> None:
        pos = self.row_len[s]
        self.row_tokens[s, pos] = tok
        self.row_routes[s, pos] = routes
        self.row_route_versions[s, pos] = self.version
        self.row_len[s] = pos + 1

    def _finish(self, seq: SeqState, events: list) -> None:
        s = seq.slot
        n = len(seq.prompt) + len(seq.gen)
        text = None
        if self._byte_table is not None:
            if seq.matcher is not None:
                text = seq.matcher.text()
            else:
                gen = seq.gen[:-1] if seq.finish_reason == "stop_token" else seq.gen
                text = b"".join(self._byte_table[t] for t in gen).decode("utf-8", errors="replace")
        seq.result = Result(
            id=seq.req.id, prompt_len=len(seq.prompt), tokens=self.row_tokens[s, :n].copy(),
            routes=self.row_routes[s, :n].copy(), versions=self.row_versions[s, :n].copy(),
            route_versions=self.row_route_versions[s, :n].copy(),
            logprobs=np.asarray(seq.lps, np.float32), raw_logprobs=np.asarray(seq.lpr, np.float32),
            text=text, finish_reason=seq.finish_reason, stop=seq.stop, seed=seq.seed,
            reused_prefix_len=seq.reused)
        self.row_seq[s] = None
        self._tick += 1
        self.row_last_used[s] = self._tick
        self.stats["finished"] += 1
        events.append(self._event(seq, result=seq.result))
        if seq.future is not None and not seq.future.done():  # a caller may have cancelled it
            seq.future.set_result(seq.result)

    def _finish_unstarted(self, seq: SeqState, events: list) -> None:
        """Result of a request that never got a row (cancelled while queued): its prompt, no tokens."""
        P = len(seq.prompt)
        seq.result = Result(
            id=seq.req.id, prompt_len=P, tokens=seq.prompt.copy(), routes=np.zeros((P, *self.row_routes.shape[2:]),
                                                                                    np.int32),
            versions=np.full((P,), self.version, np.int64), route_versions=np.full((P,), self.version, np.int64),
            logprobs=np.zeros((0,), np.float32), raw_logprobs=np.zeros((0,), np.float32),
            text="" if self._byte_table is not None else None, finish_reason=seq.finish_reason, seed=seq.seed)
        self.stats["finished"] += 1
        events.append(self._event(seq, result=seq.result))
        if seq.future is not None and not seq.future.done():  # a caller may have cancelled it
            seq.future.set_result(seq.result)

    def _prepare(self, params: dict) -> dict:
        """The engine's working copy of the weights: per layer (forward.py), routed experts in the
        fused layout when the all-experts kernel serves them (`c2jax.model.moe_dense`)."""
        layout = None
        if self.run_cfg.moe.impl == moe_dense.NAME and moe_dense.can_fuse(self.run_cfg):
            # few tokens per step: skip the experts nobody chose; else one fused matmul
            m = self.run_cfg.moe
            layout = "split" if self.config.max_slots * m.top_k * 2 <= m.n_routed_experts else "fused"
        return prepare(params, self.run_cfg, layout)

    def _apply_update(self, params: dict, version: int) -> None:
        self.params, self.version = self._prepare(params), int(version)
        self.stats["weight_updates"] += 1
        if not self.config.recompute_cache_on_update:
            return
        for s in range(self.config.max_slots):
            seq = self.row_seq[s]
            if seq is None:
                self.row_reusable[s] = False  # stale KV: not reused after a recomputing update
                continue
            n = int(self.row_len[s])
            samp = {"temperature": jnp.float32(0), "top_p": jnp.float32(1), "top_k": jnp.int32(0),
                    "seed": jnp.uint32(0)}
            self._prefill(s, self.row_tokens[s, :n].copy(), 0, samp, 0, follow=seq.next_tok)
            self.row_versions[s, :min(n, len(seq.prompt))] = self.version
            self.stats["recomputed_tokens"] += n
