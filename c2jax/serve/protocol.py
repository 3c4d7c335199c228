"""OpenAI request rules of `c2jax.serve`: JSON errors, body decoding, parameter checks, the context limit.

Errors are ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status, worded as the
OpenAI API words them where clients parse the text (litellm maps ``This model's maximum context
length is N tokens`` to its context-window error).

Context rule (``max_len`` = the engine's tokens per sequence, prompt + completion):
* ``max_tokens`` (or ``max_completion_tokens``) given: prompt + max_tokens must fit, else HTTP 400
  ``context_length_exceeded`` (as the OpenAI API and vLLM answer); never clamped silently.
* not given: the completion may use ``min(default_max_tokens, max_len - prompt)`` tokens; a prompt
  that leaves no room is the same 400.
"""
from __future__ import annotations

import json
from typing import Any

MAX_BODY = 16 << 20  # bytes
MAX_JSON_DEPTH = 128  # nesting of arrays/objects in a request body (tool schemas are far shallower)


class APIError(Exception):
    """An HTTP error with an OpenAI-shaped JSON body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def json_depth(obj: Any) -> int:
    """Nesting depth of arrays/objects (a scalar is 0), without recursion."""
    depth, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            depth = max(depth, d)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return depth


def decode_body(raw: bytes) -> Any:
    """The JSON request body; 400 on invalid JSON or nesting deeper than `MAX_JSON_DEPTH`."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, f"the body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels",
                       code="invalid_json") from None
    if json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    return body


def number(body: dict, key: str, lo: float, hi: float, default: Any, integer: bool = False) -> Any:
    """body[key] checked to be a number (an int if `integer`) in [lo, hi]; `default` when absent/null."""
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi):
        kind = "an integer" if integer else "a number"
        raise APIError(400, f"'{key}' must be {kind} in [{lo}, {hi}], got {v!r}", key, "invalid_value")
    return v


def context_error(limit: int, prompt_len: int, max_tokens: int | None) -> APIError:
    """OpenAI's wording of a request that does not fit the context."""
    if max_tokens is None:
        msg = (f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
               f"{prompt_len} tokens. Please reduce the length of the messages.")
    else:
        msg = (f"This model's maximum context length is {limit} tokens. However, you requested "
               f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
               f"Please reduce the length of the messages or completion.")
    return APIError(400, msg, "messages", "context_length_exceeded")


def completion_budget(limit: int, prompt_len: int, requested: int | None, default: int) -> int:
    """New tokens a request may generate under the context rule of the module docstring."""
    if requested is not None:
        if prompt_len + requested > limit:
            raise context_error(limit, prompt_len, requested)
        return requested
    if prompt_len >= limit:
        raise context_error(limit, prompt_len, None)
    return min(default, limit - prompt_len)
