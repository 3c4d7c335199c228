"""THE token-level chat template (Kimi-K2 style): render messages to ids + loss mask, parse model output.

One place for the template: SFT (here) and the agent harness (later) both use it; no second template
exists anywhere. Messages are OpenAI-shaped (`role`, `content`, `tool_calls`, `tool_call_id`), the
canonical trajectory form; rendering works at the token level, never through a text template.

Layout (``[X]`` is one special id, other parts are text encoded with special tokens DISABLED, so a
file or a tool output containing ``<|im_end|>`` cannot open a role or a tool call):

    tools      [<|im_system|>] tool_declare [<|im_middle|>] {tools json} [<|im_end|>]
    system     [<|im_system|>] system [<|im_middle|>] content [<|im_end|>]
    user       [<|im_user|>] user [<|im_middle|>] content [<|im_end|>]
    tool       [<|im_system|>] tool [<|im_middle|>] ## Return of {tool_call_id}\\n content [<|im_end|>]
    assistant  [<|im_assistant|>] assistant [<|im_middle|>]                      <- generation prompt
               ([<think>] reasoning [</think>])? content
               ([<|tool_calls_section_begin|>]
                  ([<|tool_call_begin|>] functions.NAME:IDX [<|tool_call_argument_begin|>] {json}
                   [<|tool_call_end|>])*
                [<|tool_calls_section_end|>])?
               [<|im_end|>]                                                      <- stop token

Loss mask: 1 on the assistant body and its closing ``<|im_end|>`` (what the policy generates),
0 on everything else (headers, system, user, tool results).

Token-in/token-out: every message renders independently and is appended, so the ids of a
conversation prefix are always a prefix of the ids of the longer conversation. `Conversation`
keeps the exact ids (model completions are appended verbatim, never re-tokenised); the prompt of
turn t+1 extends the ids of turn t exactly.

    fmt = ChatFormat(tok)
    r = fmt.render([Message("user", "hi"), Message("assistant", "hello")])   # r.ids, r.loss_mask
    conv = Conversation(fmt, system="You are a coding agent.", tools=TOOLS)
    conv.add(Message("user", "fix the bug"))
    prompt = conv.prompt_ids()                 # ids + assistant header
    parsed = conv.add_completion(model_ids)    # ParsedAssistant(content, tool_calls, errors)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from c2jax.data import tokenizer as T

ROLES = ("system", "user", "assistant", "tool")
_CALL_ID_RE = re.compile(r"^functions\.(?P<name>[^:\s]+):(?P<idx>\d+)$")


def make_call_id(name: str, index: int) -> str:
    """Kimi-K2 tool-call id, which doubles as the call header: ``functions.NAME:IDX``."""
    return f"functions.{name}:{index}"


def tools_json(tools: Sequence[dict]) -> str:
    """Canonical JSON of tool declarations (stable key order, compact, unicode kept)."""
    return json.dumps(list(tools), ensure_ascii=False, sort_keys=True, separators=(",", ":"))


@dataclass
class ToolCall:
    """One tool call: `arguments` is the raw JSON text exactly as rendered or generated."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """`json.loads(arguments)`; raises ValueError with the call named on bad JSON."""
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call {self.id}: arguments are not valid JSON: {e}") from None

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, d: dict, index: int | None = None) -> "ToolCall":
        fn = d.get("function", d)
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        name = fn["name"]
        call_id = d.get("id") or make_call_id(name, index or 0)
        return cls(id=call_id, name=name, arguments=args)


@dataclass
class Message:
    """An OpenAI-shaped chat message. `train` (assistant only) says whether its tokens get loss."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    reasoning: str | None = None
    train: bool = True

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {self.role!r}")
        if self.content is None:
            self.content = ""
        if not isinstance(self.content, str):
            raise ValueError(f"{self.role} message content must be a string, got {type(self.content).__name__}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")

    @classmethod
    def from_openai(cls, d: dict, call_counter: list[int] | None = None) -> "Message":
        calls = []
        for c in d.get("tool_calls") or []:
            idx = call_counter[0] if call_counter is not None else len(calls)
            calls.append(ToolCall.from_openai(c, idx))
            if call_counter is not None:
                call_counter[0] += 1
        content = d.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: keep the text parts, in order
            bad = [p.get("type") for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
            if bad:
                raise ValueError(f"{d['role']} message: only text content parts can be rendered, got {bad}")
            content = "".join(p.get("text", "") for p in content)
        return cls(role=d["role"], content=content, tool_calls=calls,
                   tool_call_id=d.get("tool_call_id"), reasoning=d.get("reasoning_content") or d.get("reasoning"),
                   train=bool(d.get("train", True)))

    def to_openai(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            d["reasoning_content"] = self.reasoning
        return d


@dataclass
class Rendered:
    """Token ids [N] int32 and loss mask [N] uint8 (1 = assistant-generated token)."""

    ids: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class ParsedAssistant:
    """Model output parsed back into an assistant message; `errors` lists malformed parts.

    `finished` is True when the output ended with ``<|im_end|>``. A malformed tool call is kept
    (with its raw text) and described in `errors` so the harness can answer it as a message.
    """

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    errors: list[str]
    finished: bool

    def to_message(self) -> Message:
        return Message("assistant", self.content, list(self.tool_calls), reasoning=self.reasoning)


class ChatFormat:
    """Renders messages to ids + loss mask and parses assistant ids, for one tokenizer."""

    def __init__(self, tok: T.Tokenizer):
        self.tok = tok
        s = tok.special_id
        self.im_system, self.im_user, self.im_assistant = s(T.IM_SYSTEM), s(T.IM_USER), s(T.IM_ASSISTANT)
        self.im_middle, self.im_end = s(T.IM_MIDDLE), s(T.IM_END)
        self.calls_begin, self.calls_end = s(T.TOOL_CALLS_BEGIN), s(T.TOOL_CALLS_END)
        self.call_begin, self.call_arg, self.call_end = s(T.TOOL_CALL_BEGIN), s(T.TOOL_CALL_ARG_BEGIN), s(T.TOOL_CALL_END)
        self.think_begin, self.think_end = s(T.THINK_BEGIN), s(T.THINK_END)
        self._role_token = {"system": self.im_system, "user": self.im_user,
                            "assistant": self.im_assistant, "tool": self.im_system}

    # ---- rendering ------------------------------------------------------------------------
    @property
    def stop_ids(self) -> list[int]:
        """Generation stops at ``<|im_end|>``."""
        return [self.im_end]

    def header(self, role: str) -> list[int]:
        """``[role token] role [<|im_middle|>]`` (for assistant: the generation prompt)."""
        return [self._role_token[role], *self.tok.encode(role), self.im_middle]

    def generation_prompt(self) -> list[int]:
        return self.header("assistant")

    def render_tools(self, tools: Sequence[dict]) -> list[int]:
        """The tool declaration block (a system message named ``tool_declare``)."""
        return [self.im_system, *self.tok.encode("tool_declare"), self.im_middle,
                *self.tok.encode(tools_json(tools)), self.im_end]

    def assistant_body(self, msg: Message) -> list[int]:
        """Ids the policy generates for `msg` (after the header), ending with ``<|im_end|>``."""
        enc = self.tok.encode
        out: list[int] = []
        if msg.reasoning is not None:
            out += [self.think_begin, *enc(msg.reasoning), self.think_end]
        out += enc(msg.content)
        if msg.tool_calls:
            out.append(self.calls_begin)
            for c in msg.tool_calls:
                out += [self.call_begin, *enc(c.id), self.call_arg, *enc(c.arguments), self.call_end]
            out.append(self.calls_end)
        out.append(self.im_end)
        return out

    def render_message(self, msg: Message) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of one message, header included."""
        head = self.header(msg.role)
        if msg.role == "assistant":
            body = self.assistant_body(msg)
            return head + body, [0] * len(head) + [int(msg.train)] * len(body)
        text = msg.content if msg.role != "tool" else f"## Return of {msg.tool_call_id}\n{msg.content}"
        ids = head + self.tok.encode(text) + [self.im_end]
        return ids, [0] * len(ids)

    def render(self, messages: Iterable[Message | dict], tools: Sequence[dict] | None = None,
               add_generation_prompt: bool = False) -> Rendered:
        """Render a whole conversation; equals building it incrementally with `Conversation`."""
        ids: list[int] = []
        mask: list[int] = []
        if tools:
            t = self.render_tools(tools)
            ids += t
            mask += [0] * len(t)
        counter = [0]
        for m in messages:
            if isinstance(m, dict):
                m = Message.from_openai(m, counter)
            i, k = self.render_message(m)
            ids += i
            mask += k
        if add_generation_prompt:
            g = self.generation_prompt()
            ids += g
            mask += [0] * len(g)
        return Rendered(np.asarray(ids, np.int32), np.asarray(mask, np.uint8))

    # ---- parsing --------------------------------------------------------------------------
    def parse_assistant(self, ids: Sequence[int]) -> ParsedAssistant:
        """Parse generated ids (after the generation prompt) into content, reasoning, tool calls.

        Never raises on malformed output: problems go to `errors` (a malformed tool call is a
        message to the agent, and a countable failure, not a crash).
        """
        ids = [int(i) for i in ids]
        errors: list[str] = []
        finished = False
        if self.im_end in ids:
            cut = ids.index(self.im_end)
            if cut != len(ids) - 1:
                errors.append(f"{len(ids) - cut - 1} token(s) after <|im_end|> ignored")
            ids = ids[:cut]
            finished = True
        pos = 0
        reasoning = None
        if ids and ids[0] == self.think_begin:
            if self.think_end in ids:
                j = ids.index(self.think_end)
                reasoning = self.tok.decode(ids[1:j])
                pos = j + 1
            else:
                errors.append("unterminated <think> block")
                reasoning = self.tok.decode(ids[1:])
                pos = len(ids)
        end_content = ids.index(self.calls_begin, pos) if self.calls_begin in ids[pos:] else len(ids)
        content_ids = ids[pos:end_content]
        stray = [self.tok.id_to_token(i) for i in content_ids if self.tok.is_special(i)]
        if stray:
            errors.append(f"unexpected special token(s) in content: {stray[:4]}")
        content = self.tok.decode(content_ids)
        calls: list[ToolCall] = []
        if end_content < len(ids):
            calls, call_errors = self._parse_calls(ids[end_content + 1:])
            errors += call_errors
        return ParsedAssistant(content, reasoning, calls, errors, finished)

    def _parse_calls(self, ids: list[int]) -> tuple[list[ToolCall], list[str]]:
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        closed = False
        while pos < len(ids):
            t = ids[pos]
            if t == self.calls_end:
                closed = True
                rest = self.tok.decode(ids[pos + 1:])
                if rest.strip():
                    errors.append(f"text after <|tool_calls_section_end|> ignored: {rest[:40]!r}")
                break
            if t != self.call_begin:
                # Skip whitespace/text between calls, report anything else.
                nxt = _find_any(ids, (self.call_begin, self.calls_end), pos)
                junk = self.tok.decode(ids[pos:nxt])
                if junk.strip():
                    errors.append(f"text between tool calls ignored: {junk[:40]!r}")
                pos = nxt
                continue
            end = _find_any(ids, (self.call_end, self.call_begin, self.calls_end), pos + 1)
            body = ids[pos + 1:end]
            n = len(calls)
            if end >= len(ids) or ids[end] != self.call_end:
                errors.append(f"tool call {n}: missing <|tool_call_end|>")
            if self.call_arg in body:
                k = body.index(self.call_arg)
                header, args = self.tok.decode(body[:k]), self.tok.decode(body[k + 1:])
            else:
                header, args = self.tok.decode(body), ""
                errors.append(f"tool call {n}: missing <|tool_call_argument_begin|>")
            m = _CALL_ID_RE.match(header.strip())
            if m:
                name = m.group("name")
            else:
                name = header.strip()
                errors.append(f"tool call {n}: header {header[:60]!r} is not 'functions.NAME:IDX'")
            # An empty header still needs an id: the harness answers every call with a tool message
            # that names it (found by tests/agent/test_agent_fuzz_episodes.py: `<calls_begin><call_begin>`).
            call = ToolCall(id=header.strip() or f"malformed:{n}", name=name, arguments=args)
            try:
                call.parsed_arguments()
            except ValueError as e:
                errors.append(str(e))
            calls.append(call)
            pos = end + 1 if end < len(ids) and ids[end] == self.call_end else end
        if not closed:
            errors.append("missing <|tool_calls_section_end|>")
        return calls, errors


def _find_any(ids: list[int], targets: tuple[int, ...], start: int) -> int:
    for i in range(start, len(ids)):
        if ids[i] in targets:
            return i
    return len(ids)


class Conversation:
    """An incrementally built conversation holding the exact token ids (token-in/token-out).

    `prompt_ids()` is the context for the next assistant turn; `add_completion(ids)` appends the
    model's ids verbatim (loss mask 1) and returns them parsed. Appending never changes earlier
    ids, so each turn's prompt extends the previous one exactly.
    """

    def __init__(self, fmt: ChatFormat, system: str | None = None, tools: Sequence[dict] | None = None):
        self.fmt = fmt
        self.ids: list[int] = []
        self.loss_mask: list[int] = []
        self.messages: list[Message] = []
        self.tools = list(tools or [])
        self.num_tool_calls = 0
        if self.tools:
            self._append(fmt.render_tools(self.tools), 0)
        if system is not None:
            self.add(Message("system", system))

    def _append(self, ids: Sequence[int], mask: int | Sequence[int]) -> None:
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids) if isinstance(mask, int) else list(mask))

    def add(self, msg: Message | dict) -> None:
        """Append a rendered message (system, user, tool, or a given assistant message)."""
        if isinstance(msg, dict):
            msg = Message.from_openai(msg, [self.num_tool_calls])
        ids, mask = self.fmt.render_message(msg)
        self._append(ids, mask)
        self.messages.append(msg)
        self.num_tool_calls += len(msg.tool_calls)

    def prompt_ids(self) -> list[int]:
        """Current ids plus the assistant generation header (does not modify the conversation)."""
        return self.ids + self.fmt.generation_prompt()

    def next_call_id(self, name: str) -> str:
        return make_call_id(name, self.num_tool_calls)

    def add_completion(self, completion_ids: Sequence[int]) -> ParsedAssistant:
        """Append the header and the model's ids verbatim; close the turn if it was truncated.

        `completion_ids` are the sampled ids INCLUDING the stop token ``<|im_end|>`` when the model
        produced it (it is a policy token: loss mask 1). Without it the turn counts as truncated and
        a closing ``<|im_end|>`` with loss mask 0 is appended, so the next message is well formed.
        """
        completion_ids = [int(i) for i in completion_ids]
        self._append(self.fmt.generation_prompt(), 0)
        self._append(completion_ids, 1)
        parsed = self.fmt.parse_assistant(completion_ids)
        if not parsed.finished:  # truncated: close the turn so the next message is well formed
            self._append([self.fmt.im_end], 0)
        self.messages.append(parsed.to_message())
        self.num_tool_calls += len(parsed.tool_calls)
        return parsed

    def rendered(self) -> Rendered:
        return Rendered(np.asarray(self.ids, np.int32), np.asarray(self.loss_mask, np.uint8))
