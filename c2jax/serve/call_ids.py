"""Tool-call ids the server hands out (``call_<24 hex>``, unique per call) <-> the model's call headers.

The model names each call with a Kimi-K2 header, ``functions.NAME:IDX`` (`c2jax.data.chat_format`),
and IDX repeats across turns and conversations. OpenAI clients key calls by id: the OpenAI agents
SDK drops a call whose id it has seen before and ends the run. So each call gets a fresh
``call_…`` id in responses, and the messages a client sends back are mapped to the model's headers
before rendering (`to_model_messages`), in this order:

1. an id that already is a header (``functions.NAME:IDX``, e.g. from a token-exact client) stays;
2. an assistant message that carries ``token_ids`` (c2jax extension): its calls are the ones the
   ids parse to, so its ``tool_calls`` ids map, position by position, to the parsed headers;
3. an id this server issued (remembered for the last `CallIds.capacity` calls) maps to the header
   the model generated for it: the rendering is then the model's own;
4. any other id (another server's, or one forgotten after a restart) gets the canonical header
   ``functions.NAME:K`` with K the call's index in the conversation, as `Conversation` numbers calls.

`tool` messages' ``tool_call_id`` is mapped with the same table, so a result renders as
``## Return of functions.NAME:IDX`` whatever id the client used.
"""
from __future__ import annotations

import collections
import re
import threading
import uuid
from typing import Any, Sequence

from c2jax.data.chat_format import ChatFormat, make_call_id

HEADER_RE = re.compile(r"^functions\.[^:\s]+:\d+$")


class CallIds:
    """Issues ``call_…`` ids and remembers the header of the last `capacity` of them (thread-safe)."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = capacity
        self._headers: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    def issue(self, header: str) -> str:
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        with self._lock:
            self._headers[call_id] = header
            while len(self._headers) > self.capacity:
                self._headers.popitem(last=False)
        return call_id

    def header(self, call_id: Any) -> str | None:
        with self._lock:
            return self._headers.get(call_id) if isinstance(call_id, str) else None


def to_model_messages(messages: Sequence[Any], fmt: ChatFormat, ids: CallIds) -> list[Any]:
    """Copy of `messages` with tool-call ids mapped to model headers (module docstring) and the
    ``developer`` role (OpenAI's newer name for system instructions) rendered as ``system``.

    Malformed messages are copied unchanged: `render_openai` reports them."""
    table: dict[str, str] = {}
    n_calls = 0
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(m.get("token_ids"), list):
            try:
                parsed = [c.id for c in fmt.parse_assistant(m["token_ids"]).tool_calls]
            except (TypeError, ValueError, KeyError, IndexError):
                parsed = []  # render_openai reports bad token_ids
            for c, header in zip(calls if isinstance(calls, list) else [], parsed):
                if isinstance(c, dict) and isinstance(c.get("id"), str):
                    table[c["id"]] = header
            n_calls += len(parsed)
        elif m.get("role") == "assistant" and isinstance(calls, list):
            new_calls = []
            for c in calls:
                if isinstance(c, dict) and isinstance(c.get("function"), dict):
                    cid = c.get("id")
                    header = (cid if isinstance(cid, str) and HEADER_RE.match(cid) else ids.header(cid)) or \
                        make_call_id(str(c["function"].get("name", "")), n_calls)
                    if isinstance(cid, str):
                        table[cid] = header
                    c = {**c, "id": header}
                new_calls.append(c)
                n_calls += 1
            m["tool_calls"] = new_calls
        elif m.get("role") == "tool":
            tid = m.get("tool_call_id")
            if isinstance(tid, str):
                m["tool_call_id"] = table.get(tid) or ids.header(tid) or tid
        out.append(m)
    return out
