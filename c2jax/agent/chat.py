"""Agent transcripts: canonical OpenAI-shaped messages <-> exact token ids, via THE chat template.

There is one template, `c2jax.data.chat_format` (Kimi-K2 special tokens); this module only adds
what the agent needs on top of it:

* `AgentContext`: one generation context (a future `Trajectory` segment). It wraps a
  `chat_format.Conversation`, so appending never changes earlier ids (token-in/token-out: the
  prompt of turn t+1 extends the ids of turn t exactly, the policy's ids are stored verbatim and
  never re-tokenised). It records per completion token the loss mask, behaviour / raw logprobs and
  policy versions, and turns into a `trajectory.Segment`.
* `render_openai(messages, tools)`: OpenAI chat messages -> prompt ids. An assistant message may
  carry ``token_ids`` (the ids the model produced for it, as returned by `c2jax.serve`); they are
  used verbatim instead of re-encoding the text, so a client that sends them back gets exactly
  the in-process context (an extension field; clients that do not send it get the canonical
  rendering).
* `to_openai(messages)` / `from_openai(dicts)`: the canonical stored form of a transcript.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from c2jax.data.chat_format import ChatFormat, Conversation, Message, ParsedAssistant, ToolCall  # noqa: F401
from c2jax.trajectory import Segment


def to_openai(messages: Sequence[Message]) -> list[dict]:
    """Canonical form: OpenAI chat messages (tool_calls with ids, `tool` results with tool_call_id)."""
    return [m.to_openai() for m in messages]


def from_openai(dicts: Sequence[dict]) -> list[Message]:
    counter = [0]
    return [Message.from_openai(d, counter) for d in dicts]


def render_openai(fmt: ChatFormat, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                  add_generation_prompt: bool = True) -> list[int]:
    """Prompt ids of an OpenAI-shaped conversation; assistant ``token_ids`` are used verbatim.

    Raises ValueError (with the message index) on a malformed message.
    """
    conv = Conversation(fmt, tools=tools)
    for i, d in enumerate(messages):
        if not isinstance(d, dict):
            raise ValueError(f"messages[{i}] must be an object, got {type(d).__name__}")
        if "role" not in d:
            raise ValueError(f"messages[{i}] has no role")
        try:
            if d["role"] == "assistant" and d.get("token_ids") is not None:
                ids = d["token_ids"]
                if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t
                                                        for t in ids):
                    raise ValueError("token_ids must be a list of non-negative integers")
                conv.add_completion(ids)
            else:
                conv.add(Message.from_openai(d, [conv.num_tool_calls]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"messages[{i}]: {e}") from None
    return conv.prompt_ids() if add_generation_prompt else list(conv.ids)


class AgentContext:
    """One generation context: exact ids, loss mask and per-token sampler data (see module docstring).

    The segment's prompt is the context before the first generation (header included); its
    completion is everything after: policy tokens (mask 1) interleaved with headers and tool
    outputs (mask 0), up to the end of the last generation.
    """

    def __init__(self, fmt: ChatFormat, system: str | None, tools: Sequence[dict] | None) -> None:
        self.fmt = fmt
        self.conv = Conversation(fmt, system=system, tools=tools)
        self.prompt_len: int | None = None  # set at the first generation
        self.logp: list[float] = []  # per id after prompt_len
        self.raw: list[float] = []
        self.versions: list[int] = []
        self.routes: np.ndarray | None = None
        self.has_raw = True
        self.has_routes = True
        self._end = 0  # ids up to here belong to the segment (end of the last generation)
        self.generations = 0
        self._gen_ids: dict[int, list[int]] = {}  # index in conv.messages -> the policy's ids

    def __len__(self) -> int:
        return len(self.conv.ids)

    @property
    def ids(self) -> list[int]:
        return self.conv.ids

    def add(self, msg: Message | dict) -> None:
        """Append a non-policy message (system, user, tool)."""
        self.conv.add(msg)

    def prompt_ids(self) -> list[int]:
        return self.conv.prompt_ids()

    def add_generation(self, ids: Sequence[int], logprobs: Sequence[float] | None = None,
                       raw_logprobs: Sequence[float] | None = None, versions: Sequence[int] | None = None,
                       routes: np.ndarray | None = None, train: bool = True,
                       message: Message | None = None) -> ParsedAssistant:
        """Append the policy's ids verbatim (after the generation header) and their sampler data.

        `routes` (optional): experts of every token of prompt + ids, as the engine reports them for
        this request ([len(prompt_ids()) + len(ids), nL, K]); the last generation's routes cover
        the whole segment. `train=False` (a policy without token ids) gives the ids loss mask 0.
        `message`: the message an endpoint returned (its tool-call ids and names are kept as they
        are, e.g. ``call_abc``); `ids` are then only its rendering.
        """
        ids = [int(i) for i in ids]
        n = len(ids)
        if self.prompt_len is None:
            self.prompt_len = len(self.conv.prompt_ids())
        before = len(self.conv.ids)
        parsed = self.conv.add_completion(ids)
        if message is not None:
            self.conv.messages[-1] = message
            parsed = ParsedAssistant(message.content, message.reasoning, list(message.tool_calls), [], True)
        if train:
            self._gen_ids[len(self.conv.messages) - 1] = ids
        if not train:
            for k in range(before, len(self.conv.loss_mask)):
                self.conv.loss_mask[k] = 0
        added = len(self.conv.ids) - before  # header + ids (+ a closing <|im_end|> when truncated)
        head = len(self.fmt.generation_prompt())
        lp = list(logprobs) if logprobs is not None else [0.0] * n
        rw = list(raw_logprobs) if raw_logprobs is not None else None
        vs = list(versions) if versions is not None else [0] * n
        if len(lp) != n or len(vs) != n or (rw is not None and len(rw) != n):
            raise ValueError(f"generation has {n} ids but {len(lp)} logprobs / {len(vs)} versions")
        start = before + head  # index of the first policy id (the header precedes it)
        self._pad_to(start)
        tail = added - head - n  # a closing <|im_end|> appended for a truncated turn
        self.logp += [float(x) for x in lp] + [0.0] * tail
        self.raw += ([float(x) for x in rw] if rw is not None else [0.0] * n) + [0.0] * tail
        self.versions += [int(v) for v in vs] + [-1] * tail
        self.has_raw &= rw is not None
        if routes is None:
            self.has_routes = False
        else:
            self.routes = np.asarray(routes)
        self._end = len(self.conv.ids)
        self.generations += 1
        return parsed

    def openai_messages(self) -> list[dict]:
        """The context as OpenAI messages; generated assistant messages carry their ``token_ids``."""
        out = []
        for i, m in enumerate(self.conv.messages):
            d = m.to_openai()
            if i in self._gen_ids:
                d["token_ids"] = list(self._gen_ids[i])
            out.append(d)
        return out

    def _pad_to(self, n_ids: int) -> None:
        """Per-token lists cover ids[prompt_len:n_ids] (non-policy ids get 0 / -1)."""
        missing = n_ids - self.prompt_len - len(self.logp)
        self.logp += [0.0] * missing
        self.raw += [0.0] * missing
        self.versions += [-1] * missing

    def segment(self) -> Segment | None:
        """The context as a `Segment` (None before the first generation)."""
        if self.prompt_len is None:
            return None
        P, end = self.prompt_len, self._end
        C = end - P
        ids = np.asarray(self.conv.ids[:end], np.int32)
        mask = np.asarray(self.conv.loss_mask[P:end], bool)
        routes = None
        if self.has_routes and self.routes is not None:
            routes = self.routes[: end] if self.routes.shape[0] >= end else (
                self.routes if self.routes.shape[0] == end - 1 else None)
        return Segment(prompt_ids=ids[:P], completion_ids=ids[P:], loss_mask=mask,
                       behaviour_logprobs=np.asarray(self.logp[:C], np.float32),
                       policy_versions=np.asarray(self.versions[:C], np.int32),
                       raw_logprobs=np.asarray(self.raw[:C], np.float32) if self.has_raw else None,
                       routes=routes)
