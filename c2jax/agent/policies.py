"""Policies the harness drives: each turns a `TurnRequest` (the exact prompt ids plus the same context
as OpenAI messages) into a `Generation`.

* `EnginePolicy`: a c2jax model through the sampling engine (`c2jax.sampling.Engine`): token ids,
  behaviour and raw logprobs, policy versions and routes; trainable.
* `OpenAIPolicy`: any OpenAI-compatible endpoint (vLLM, SGLang, a hosted API, `c2jax.serve`) through
  the official `openai` client. Evaluation only unless the endpoint returns token ids and logprobs
  (`c2jax.serve` does: ``choices[0].token_ids``, and takes them back on assistant messages so the
  context stays token-exact).
* `ScriptedPolicy`: a list of turns (raw ids, messages, or callables) for tests.
* `OraclePolicy`: applies a task's gold patch through the `apply_patch` tool, then finishes.

`make_policy(name, **kw)` picks one by name (`POLICIES` registry).
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from c2jax.data.chat_format import ChatFormat, Message, ToolCall, make_call_id
from c2jax.registry import Registry

POLICIES = Registry("agent_policies")


@dataclasses.dataclass
class TurnRequest:
    """What a policy sees for one turn."""

    prompt_ids: list[int]  # the exact context (ends with the assistant generation header)
    messages: list[dict]  # the same context as OpenAI messages (assistant ones carry token_ids)
    tools: list[dict]  # OpenAI tool declarations
    max_new_tokens: int
    turn: int = 0  # generations so far in this episode (all contexts)
    purpose: str = "act"  # 'act' | 'summarize'
    sample_id: str = ""  # the episode's sample id ("task#k"); seeds sampling order-free


@dataclasses.dataclass
class Generation:
    """One policy output. Token policies fill `ids` (+ per-token data); message policies `message`."""

    ids: list[int] | None = None
    logprobs: list[float] | None = None
    raw_logprobs: list[float] | None = None
    versions: list[int] | None = None
    routes: np.ndarray | None = None
    message: Message | None = None  # endpoints without token ids: the parsed message
    finish_reason: str = "stop"  # 'stop' | 'length' | 'tool_calls' | 'error'
    trainable: bool = True  # False: ids are a re-rendering, not what the model sampled
    info: dict = dataclasses.field(default_factory=dict)


class Policy:
    """Base: `generate(req)`; `agenerate(req)` defaults to running it in a worker thread."""

    name = "policy"
    max_context_tokens: int | None = None  # the model's context (prompt + new tokens), if bounded

    def generate(self, req: TurnRequest) -> Generation:
        raise NotImplementedError

    async def agenerate(self, req: TurnRequest) -> Generation:
        return await asyncio.to_thread(_no_stop_iteration, self.generate, req)


def _no_stop_iteration(fn: Callable, *args: Any) -> Any:
    """A StopIteration cannot cross into a Future (the awaiting task would hang): re-raise it."""
    try:
        return fn(*args)
    except StopIteration as e:
        raise RuntimeError(f"policy raised StopIteration: {e!r}") from None


# ---- c2jax checkpoint through the sampling engine --------------------------------------------------

def request_seed(seed: int, salt: int | str | None, sample_id: str, turn: int, purpose: str) -> int:
    """A uint32 seed from (base seed, salt, sample id, turn, purpose): stable across processes and
    Python versions (blake2b of a canonical string), independent of arrival order."""
    key = json.dumps([int(seed), None if salt is None else str(salt), str(sample_id), int(turn), str(purpose)])
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")


@POLICIES.register("engine")
class EnginePolicy(Policy):
    """A c2jax model through `c2jax.sampling.Engine` (greedy when temperature == 0).

    Seeds are order-free: with `seed` set, request seed = `request_seed(seed, seed_salt,
    req.sample_id, req.turn, req.purpose)` (a blake2b hash -> uint32), never the arrival order or
    the batch a request lands in, so the same sample gets the same tokens however many episodes run
    concurrently and in whatever order they are submitted. `seed_salt` (e.g. the RL step) makes
    each step's draws different but reproducible. A request without a sample id hashes its prompt
    ids instead. `seed=None`: the engine draws seeds (not reproducible).
    """

    name = "engine"

    def __init__(self, engine: Any, fmt: ChatFormat, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, seed_salt: int | str | None = None) -> None:
        self.engine, self.fmt = engine, fmt
        self.temperature, self.top_p, self.top_k, self.seed = temperature, top_p, top_k, seed
        self.seed_salt = seed_salt
        self.max_context_tokens = int(engine.config.max_len)

    def seed_for(self, req: TurnRequest) -> int | None:
        """The engine seed of `req` (None when the policy has no base seed)."""
        if self.seed is None:
            return None
        sid = req.sample_id
        if not sid:
            sid = "prompt:" + hashlib.blake2b(np.asarray(req.prompt_ids, np.int64).tobytes(), digest_size=16).hexdigest()
        return request_seed(self.seed, self.seed_salt, sid, req.turn, req.purpose)

    def _request(self, req: TurnRequest):
        from c2jax.sampling import Request, SamplingParams

        room = self.engine.config.max_len - len(req.prompt_ids)
        seed = self.seed_for(req)
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                max_new_tokens=max(1, min(req.max_new_tokens, room)), seed=seed,
                                stop_token_ids=tuple(self.fmt.stop_ids))
        return Request(list(req.prompt_ids), params)

    def _to_generation(self, res: Any) -> Generation:
        if not res.ok:
            return Generation(ids=[], finish_reason="error", info={"error": str(res.error)})
        out = [int(t) for t in res.output_tokens]
        return Generation(ids=out, logprobs=[float(x) for x in res.logprobs],
                          raw_logprobs=[float(x) for x in res.raw_logprobs],
                          versions=[int(v) for v in res.versions[res.prompt_len:]], routes=np.asarray(res.routes),
                          finish_reason="length" if res.finish_reason == "length" else "stop")

    def generate(self, req: TurnRequest) -> Generation:
        if self.engine._thread is not None:  # background loop running: go through it
            return self._to_generation(self.engine.submit(self._request(req)).result())
        return self._to_generation(self.engine.generate([self._request(req)])[0])

    async def agenerate(self, req: TurnRequest) -> Generation:
        self.engine.start()  # concurrent episodes share the engine's continuous batching
        return self._to_generation(await self.engine.agenerate(self._request(req)))


# ---- any OpenAI-compatible endpoint --------------------------------------------------------------

@POLICIES.register("openai")
class OpenAIPolicy(Policy):
    """An OpenAI-compatible endpoint through the official client (`base_url` explicit).

    With `use_token_ids` (default) and an endpoint that returns ``token_ids`` (c2jax.serve), the
    generation is token-exact and carries logprobs (trainable); otherwise the message is re-rendered
    with the template and the trajectory is for evaluation only.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, timeout: float = 600.0,
                 use_token_ids: bool = True, client: Any = None) -> None:
        import openai

        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get(
            "OPENAI_API_KEY") or "none", timeout=timeout, max_retries=0)
        self.model = model
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.seed_salt: int | str | None = None
        self.use_token_ids = use_token_ids

    def _model(self) -> str:
        if self.model is None:
            self.model = self.client.models.list().data[0].id
        return self.model

    def generate(self, req: TurnRequest) -> Generation:
        msgs = req.messages if self.use_token_ids else [
            {k: v for k, v in m.items() if k != "token_ids"} for m in req.messages]
        kw: dict[str, Any] = dict(model=self._model(), messages=msgs, max_tokens=req.max_new_tokens,
                                  temperature=self.temperature, top_p=self.top_p, logprobs=True)
        if req.tools:
            kw["tools"] = req.tools
        if self.seed is not None:  # per request, order-free (as EnginePolicy): k samples must differ
            kw["seed"] = request_seed(self.seed, self.seed_salt, req.sample_id or "", req.turn, req.purpose) \
                if req.sample_id else self.seed
        resp = self.client.chat.completions.create(**kw)
        ch = resp.choices[0]
        m = ch.message
        calls = [ToolCall(id=c.id or make_call_id(c.function.name, i), name=c.function.name,
                          arguments=c.function.arguments or "") for i, c in enumerate(m.tool_calls or [])]
        extra = getattr(ch, "model_extra", None) or {}
        reasoning = (getattr(m, "model_extra", None) or {}).get("reasoning_content")
        msg = Message("assistant", m.content or "", calls, reasoning=reasoning)
        finish = {"length": "length", "tool_calls": "tool_calls"}.get(ch.finish_reason, "stop")
        ids = extra.get("token_ids")
        lps = [c.logprob for c in ch.logprobs.content] if (ch.logprobs and ch.logprobs.content) else None
        if self.use_token_ids and ids is not None and lps is not None and len(lps) == len(ids):
            return Generation(ids=[int(i) for i in ids], logprobs=lps, versions=extra.get("versions"),
                              finish_reason=finish, message=msg, info={"prompt_token_ids": extra.get("prompt_token_ids")})
        return Generation(message=msg, finish_reason=finish, trainable=False)


# ---- scripted and oracle -------------------------------------------------------------------------

@POLICIES.register("scripted")
class ScriptedPolicy(Policy):
    """Replays a script, item `req.turn` for turn `req.turn` (stateless across episodes, so one
    instance can drive many concurrent episodes): a list of ids (emitted verbatim), a `Message` or
    OpenAI dict (rendered with the template), or a callable `(TurnRequest) -> item`. After the
    script ends it says `final` and stops. `requests` keeps every TurnRequest it got (for tests)."""

    name = "scripted"

    def __init__(self, fmt: ChatFormat, script: Sequence[Any], final: str = "Done.") -> None:
        self.fmt, self.script, self.final = fmt, list(script), final
        self.requests: list[TurnRequest] = []

    def generate(self, req: TurnRequest) -> Generation:
        self.requests.append(req)
        item: Any = self.script[req.turn] if req.turn < len(self.script) else Message("assistant", self.final)
        if callable(item):
            item = item(req)
        if isinstance(item, dict):
            item = Message.from_openai({"role": "assistant", **item}, [0])
        if isinstance(item, Message):
            ids = self.fmt.assistant_body(item)
        else:
            ids = [int(i) for i in item]
        ids = ids[: req.max_new_tokens]
        return Generation(ids=ids, logprobs=[0.0] * len(ids), versions=[0] * len(ids),
                          finish_reason="stop" if ids and ids[-1] == self.fmt.im_end else "length")


@POLICIES.register("oracle")
class OraclePolicy(ScriptedPolicy):
    """Applies the task's gold patch with `apply_patch`, then finishes (checks tools + grading)."""

    name = "oracle"

    def __init__(self, fmt: ChatFormat, patch: str) -> None:
        call = ToolCall(make_call_id("apply_patch", 0), "apply_patch", json.dumps({"patch": patch}))
        super().__init__(fmt, [Message("assistant", "Applying the fix.", [call])], final="Applied the fix.")


def make_policy(name: str, **kwargs: Any) -> Policy:
    return POLICIES.get(name)(**kwargs)


ScriptItem = Sequence[int] | Message | dict | Callable[[TurnRequest], Any]
