"""OpenAI-compatible HTTP server for a c2jax model: ``/v1/models`` and ``/v1/chat/completions`` with
tools, streaming (server-sent events) and logprobs. Standard library `http.server` (one thread per
connection) over the sampling engine (one scheduler thread: continuous batching across requests).

    srv = ChatServer(engine, fmt, model_name="c2jax").start("127.0.0.1", 0)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

Prompts are rendered with THE chat template (`c2jax.data.chat_format`, via `agent.chat.render_openai`);
tool calls are parsed from the Kimi-K2 special tokens. Behaviour clients rely on:
* Tool-call ids are ``call_<24 hex>``, unique per call; ids sent back are mapped to the model's
  ``functions.NAME:IDX`` headers before rendering (call_ids.py).
* The ``developer`` role is rendered as ``system``.
* Context: an explicit ``max_tokens`` / ``max_completion_tokens`` that does not fit with the prompt
  is HTTP 400 ``context_length_exceeded`` in OpenAI's wording ("This model's maximum context length
  is N tokens. However, you requested M tokens ..."); without it the completion gets
  ``min(default_max_tokens, max_len - prompt)`` tokens (protocol.py).
* A client that disconnects (non-streaming or streaming) has its request cancelled in the engine:
  its slot is free for the others at the next step.
* Errors are JSON ``{"error": {"message", "type", "param", "code"}}``: 4xx for bad requests (invalid
  or too deeply nested JSON included), 404 for unknown paths, 405 (with ``Allow``) for a wrong method.

Extensions beyond the OpenAI shape, for token-exact clients (the agent's `OpenAIPolicy`): each choice
carries ``token_ids`` (the generated ids), ``prompt_token_ids`` and ``versions``; an assistant
message sent back with ``token_ids`` is rendered from those ids verbatim.
"""
from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

from c2jax.agent.chat import render_openai
from c2jax.data.chat_format import ChatFormat
from c2jax.sampling import Request, SamplingParams
from c2jax.serve.call_ids import CallIds, to_model_messages
from c2jax.serve.protocol import MAX_BODY, APIError, completion_budget, decode_body, number
from c2jax.serve.scheduler import Scheduler

CHAT_PATH = "/v1/chat/completions"
POLL_S = 0.1  # how often a waiting connection thread checks whether its client is still there

Disconnected = Callable[[], bool]


def peer_closed(sock: socket.socket) -> bool:
    """True when the client closed its end (readable with nothing to read) or the socket broke."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):
        return True


class ChatServer:
    """See the module docstring. `start(host, port)` binds (127.0.0.1 by default) and serves in a thread."""

    def __init__(self, engine: Any, fmt: ChatFormat, model_name: str = "c2jax", default_max_tokens: int = 256) -> None:
        self.engine, self.fmt, self.model_name = engine, fmt, model_name
        self.default_max_tokens = default_max_tokens
        self.sched = Scheduler(engine)
        self.call_ids = CallIds()
        self.httpd: ThreadingHTTPServer | None = None
        self.created = int(time.time())

    # ---- request handling ----
    def parse_request(self, body: Any) -> tuple[Request, dict]:
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise APIError(400, "'model' is required (a string)", "model", "missing_required_parameter")
        if model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}", "model",
                           "model_not_found")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise APIError(400, "'messages' must be a non-empty array", "messages", "invalid_value")
        tools = body.get("tools")
        if tools is not None:
            if not isinstance(tools, list) or not all(
                    isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
                    and isinstance(t["function"].get("name"), str) for t in tools):
                raise APIError(400, "'tools' must be an array of {type: 'function', function: {name, ...}}", "tools",
                               "invalid_value")
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise APIError(400, "only tool_choice 'auto' and 'none' are supported", "tool_choice", "unsupported_value")
        if choice == "none":
            tools = None
        n = number(body, "n", 1, 1, 1, integer=True)
        temperature = number(body, "temperature", 0.0, 2.0, 1.0)
        top_p = number(body, "top_p", 1e-9, 1.0, 1.0)
        limit = self.engine.config.max_len
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = number(body, key, 1, 1 << 30, None, integer=True)
        seed = number(body, "seed", 0, 2**32 - 1, None, integer=True)
        top_logprobs = number(body, "top_logprobs", 0, 0, 0, integer=True)
        logprobs = body.get("logprobs", False)
        if not isinstance(logprobs, bool) and logprobs is not None:
            raise APIError(400, "'logprobs' must be a boolean", "logprobs", "invalid_value")
        stream = body.get("stream", False)
        if not isinstance(stream, bool) and stream is not None:
            raise APIError(400, "'stream' must be a boolean", "stream", "invalid_value")
        stop = body.get("stop")
        stops: tuple[str, ...] = ()
        if stop is not None:
            stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else (None,)
            if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
                raise APIError(400, "'stop' must be a non-empty string or up to 4 of them", "stop", "invalid_value")
        try:
            prompt = render_openai(self.fmt, to_model_messages(msgs, self.fmt, self.call_ids), tools)
        except ValueError as e:
            raise APIError(400, f"invalid messages: {e}", "messages", "invalid_value") from None
        new_tokens = completion_budget(limit, len(prompt), max_tokens, self.default_max_tokens)
        if any(t >= self.engine.model_cfg.vocab_size for t in prompt):
            raise APIError(400, "messages contain token_ids outside the vocabulary", "messages", "invalid_value")
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p),
                                max_new_tokens=int(new_tokens), seed=seed,
                                stop_token_ids=tuple(self.fmt.stop_ids), stop_strings=stops)
        opts = {"stream": bool(stream), "logprobs": bool(logprobs), "n": n, "top_logprobs": top_logprobs,
                "include_usage": bool((body.get("stream_options") or {}).get("include_usage")) if isinstance(
                    body.get("stream_options"), dict) else False}
        return Request(prompt, params, id=f"chatcmpl-{uuid.uuid4().hex}"), opts

    def _token_logprob(self, tok_id: int, lp: float) -> dict:
        tok = self.fmt.tok
        text = tok.id_to_token(tok_id) if tok.is_special(tok_id) else tok.decode([tok_id])
        return {"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")), "top_logprobs": []}

    def _message(self, out: list[int]) -> tuple[dict, Any]:
        parsed = self.fmt.parse_assistant(out)
        msg: dict[str, Any] = {"role": "assistant", "content": parsed.content if (parsed.content or not parsed.tool_calls)
                               else None}
        if parsed.tool_calls:  # a fresh id per call; the header it stands for is remembered (call_ids.py)
            msg["tool_calls"] = [{**c.to_openai(), "id": self.call_ids.issue(c.id)} for c in parsed.tool_calls]
        if parsed.reasoning is not None:
            msg["reasoning_content"] = parsed.reasoning
        return msg, parsed

    @staticmethod
    def _finish_reason(result: Any, parsed: Any) -> str:
        if parsed.tool_calls:
            return "tool_calls"
        return "length" if result.finish_reason == "length" else "stop"

    def _next(self, q: queue.Queue, req: Request, disconnected: Disconnected | None) -> tuple[str, Any] | None:
        """The request's next event; None (and the request cancelled) once its client has gone."""
        while True:
            try:
                kind, item = q.get(timeout=POLL_S)
            except queue.Empty:
                kind, item = "", None
            if disconnected is not None and disconnected():  # checked while tokens flow too
                self.sched.cancel(req.id)
                return None
            if not kind:
                continue
            if kind == "error":
                raise APIError(500, f"generation failed: {item}", type_="server_error")
            return kind, item

    def complete(self, req: Request, opts: dict, disconnected: Disconnected | None = None) -> dict | None:
        """The chat.completion response; None if the client disconnected first (request cancelled)."""
        q = self.sched.submit(req)
        while True:
            got = self._next(q, req, disconnected)
            if got is None:
                return None
            if got[0] == "done":
                return self._response(req, got[1], opts)

    def _result_or_error(self, result: Any) -> None:
        if result.error is not None:
            raise APIError(400, str(result.error), "messages", "invalid_value")

    def _response(self, req: Request, result: Any, opts: dict) -> dict:
        self._result_or_error(result)
        out = [int(t) for t in result.output_tokens]
        msg, parsed = self._message(out)
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": self._finish_reason(result, parsed),
                                  "logprobs": None, "token_ids": out, "prompt_token_ids": [int(t) for t in req.prompt],
                                  "versions": [int(v) for v in result.versions[result.prompt_len:]]}
        if opts["logprobs"]:
            choice["logprobs"] = {"content": [self._token_logprob(t, lp) for t, lp in zip(out, result.logprobs)]}
        return {"id": req.id, "object": "chat.completion", "created": int(time.time()), "model": self.model_name,
                "choices": [choice], "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": len(out),
                                               "total_tokens": len(req.prompt) + len(out)}}

    def stream(self, req: Request, opts: dict, disconnected: Disconnected | None = None) -> Iterator[dict]:
        """Yield SSE chunk dicts; content deltas as tokens arrive, tool calls once complete.

        Stops (and cancels the request) when `disconnected()` says so or when the caller closes the
        generator early (a failed write)."""
        base = {"id": req.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model_name}

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None,
                                         **extra}]}

        yield chunk({"role": "assistant", "content": ""})
        q = self.sched.submit(req)
        finished = False
        try:
            yield from self._stream_tokens(req, opts, q, chunk, disconnected)
            finished = True
        finally:
            if not finished:  # client gone (or a write failed): free the slot
                self.sched.cancel(req.id)

    def _stream_tokens(self, req: Request, opts: dict, q: queue.Queue, chunk: Callable[..., dict],
                       disconnected: Disconnected | None) -> Iterator[dict]:
        fmt = self.fmt
        out: list[int] = []
        emitted = ""
        in_content = True
        while True:
            got = self._next(q, req, disconnected)
            if got is None:
                return
            kind, item = got
            if kind == "done":
                result = item
                break
            ev = item
            out.append(int(ev.token))
            extra = {}
            if opts["logprobs"]:
                extra["logprobs"] = {"content": [self._token_logprob(int(ev.token), ev.logprob)]}
            delta = ""
            if in_content and (out[0] == fmt.think_begin or fmt.tok.is_special(int(ev.token))):
                in_content = False  # reasoning / tool calls / stop: sent once complete
            if in_content:
                text = fmt.tok.decode(out)
                if not text.endswith("\ufffd") and text.startswith(emitted):
                    delta, emitted = text[len(emitted):], text
            if delta or extra:
                yield chunk({"content": delta} if delta else {}, **extra)
        self._result_or_error(result)
        out = [int(t) for t in result.output_tokens]
        msg, parsed = self._message(out)
        rest: dict[str, Any] = {}
        content = parsed.content
        if content.startswith(emitted) and len(content) > len(emitted):
            rest["content"] = content[len(emitted):]
        if parsed.reasoning is not None:
            rest["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            rest["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
        if rest:
            yield chunk(rest)
        yield chunk({}, self._finish_reason(result, parsed), token_ids=out,
                    prompt_token_ids=[int(t) for t in req.prompt],
                    versions=[int(v) for v in result.versions[result.prompt_len:]])
        if opts["include_usage"]:
            yield {**chunk({}), "choices": [], "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": len(out),
                                                    "total_tokens": len(req.prompt) + len(out)}}

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "c2jax"}]}

    # ---- HTTP ----
    def start(self, host: str = "127.0.0.1", port: int = 0) -> "ChatServer":
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name="c2jax-serve-http", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        try:
            self.httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.sched.stop()


def _handler(server: ChatServer):
    allowed = {CHAT_PATH: "POST", "/v1/models": "GET", "/health": "GET", "/v1/health": "GET"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "c2jax-serve"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default
            pass

        def _send_json(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: APIError) -> None:
            self._send_json(e.status, e.body(), e.headers)

        def _path(self) -> str:
            return self.path.split("?")[0].rstrip("/")

        def _discard_body(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)
            elif length != 0:
                self.close_connection = True

        def _wrong_method(self, path: str) -> None:
            """405 (with Allow) on a known path, else 404; any body is read and dropped."""
            self._discard_body()
            want = "GET" if path.startswith("/v1/models/") else allowed.get(path)
            if want is None:
                return self._error(APIError(404, f"unknown path {path!r}", code="not_found"))
            self._error(APIError(405, f"{self.command} is not allowed on {path}; use {want}", code="method_not_allowed",
                                 headers={"Allow": want}))

        def _disconnected(self) -> bool:
            """Whether the client has gone; the socket is looked at most every POLL_S seconds."""
            now = time.monotonic()
            if now - getattr(self, "_checked_at", 0.0) < POLL_S:
                return False
            self._checked_at = now
            return peer_closed(self.connection)

        def do_GET(self) -> None:
            path = self._path()
            if path == "/v1/models":
                self._send_json(200, server.models())
            elif path.startswith("/v1/models/"):
                name = path[len("/v1/models/"):]
                if name == server.model_name:
                    self._send_json(200, server.models()["data"][0])
                else:
                    self._error(APIError(404, f"the model {name!r} does not exist", "model", "model_not_found"))
            elif path in ("/health", "/v1/health"):
                self._send_json(200, {"status": "ok"})
            else:
                self._wrong_method(path)

        def do_PUT(self) -> None:
            self._wrong_method(self._path())

        do_DELETE = do_PATCH = do_PUT

        def do_POST(self) -> None:
            path = self._path()
            if path != CHAT_PATH:
                return self._wrong_method(path)
            try:
                try:
                    length = int(self.headers.get("Content-Length") or -1)
                except ValueError:
                    length = -1
                if length < 0:
                    self.close_connection = True
                    raise APIError(411, "a Content-Length header is required")
                if length > MAX_BODY:
                    self.close_connection = True
                    raise APIError(413, f"request body over {MAX_BODY} bytes")
                body = decode_body(self.rfile.read(length))
                req, opts = server.parse_request(body)
                if not opts["stream"]:
                    resp = server.complete(req, opts, self._disconnected)
                    if resp is None:  # the client left; its request was cancelled
                        self.close_connection = True
                        return
                    return self._send_json(200, resp)
            except APIError as e:
                return self._error(e)
            except RecursionError:
                return self._error(APIError(400, "the request nests too deeply to render", code="invalid_value"))
            except Exception as e:  # noqa: BLE001 - a bug must not kill the connection thread silently
                return self._error(APIError(500, f"{type(e).__name__}: {e}", type_="server_error"))
            self._send_stream(req, opts)

        def _send_stream(self, req: Request, opts: dict) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            chunks = server.stream(req, opts, self._disconnected)
            try:
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except APIError as e:
                self._write_quietly(f"data: {json.dumps(e.body())}\n\ndata: [DONE]\n\n".encode())
            except OSError:  # the client went away mid-stream: closing the generator cancels the request
                pass
            finally:
                chunks.close()

        def _write_quietly(self, data: bytes) -> None:
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                pass

    return Handler
