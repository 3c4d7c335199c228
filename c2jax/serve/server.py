"""OpenAI-compatible HTTP server for a c2jax model: ``/v1/models`` and ``/v1/chat/completions`` with
tools, streaming (server-sent events) and logprobs. Standard library `http.server` (one thread per
connection) over the sampling engine (one scheduler thread: continuous batching across requests).

    srv = ChatServer(engine, fmt, model_name="c2jax").start("127.0.0.1", 0)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

Prompts are rendered with THE chat template (`c2jax.data.chat_format`, via `agent.chat.render_openai`);
tool calls are parsed from the Kimi-K2 special tokens. Extensions beyond the OpenAI shape, for
token-exact clients (the agent's `OpenAIPolicy`): each choice carries ``token_ids`` (the generated
ids), ``prompt_token_ids`` and ``versions``; an assistant message sent back with ``token_ids`` is
rendered from those ids verbatim. Bad requests get JSON errors
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from c2jax.agent.chat import render_openai
from c2jax.data.chat_format import ChatFormat
from c2jax.sampling import Request, SamplingParams

MAX_BODY = 16 << 20


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Scheduler:
    """Drives `engine.step()` in one thread and routes each request's stream events to its queue."""

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


def _num(body: dict, key: str, lo: float, hi: float, default: Any, integer: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi):
        kind = "an integer" if integer else "a number"
        raise APIError(400, f"'{key}' must be {kind} in [{lo}, {hi}], got {v!r}", key, "invalid_value")
    return v


class ChatServer:
    """See the module docstring. `start(host, port)` binds (127.0.0.1 by default) and serves in a thread."""

    def __init__(self, engine: Any, fmt: ChatFormat, model_name: str = "c2jax", default_max_tokens: int = 256) -> None:
        self.engine, self.fmt, self.model_name = engine, fmt, model_name
        self.default_max_tokens = default_max_tokens
        self.sched = _Scheduler(engine)
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
        n = _num(body, "n", 1, 1, 1, integer=True)
        temperature = _num(body, "temperature", 0.0, 2.0, 1.0)
        top_p = _num(body, "top_p", 1e-9, 1.0, 1.0)
        limit = self.engine.config.max_len
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _num({"max_tokens": max_tokens}, "max_tokens", 1, 1 << 30, self.default_max_tokens, integer=True)
        seed = _num(body, "seed", 0, 2**32 - 1, None, integer=True)
        top_logprobs = _num(body, "top_logprobs", 0, 0, 0, integer=True)
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
            prompt = render_openai(self.fmt, msgs, tools)
        except ValueError as e:
            raise APIError(400, f"invalid messages: {e}", "messages", "invalid_value") from None
        if len(prompt) >= limit:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this model's context holds {limit} "
                                f"(prompt + at least one new token)", "messages", "context_length_exceeded")
        if any(t >= self.engine.model_cfg.vocab_size for t in prompt):
            raise APIError(400, "messages contain token_ids outside the vocabulary", "messages", "invalid_value")
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p),
                                max_new_tokens=int(min(max_tokens, limit - len(prompt))), seed=seed,
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
        if parsed.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
        if parsed.reasoning is not None:
            msg["reasoning_content"] = parsed.reasoning
        return msg, parsed

    @staticmethod
    def _finish_reason(result: Any, parsed: Any) -> str:
        if parsed.tool_calls:
            return "tool_calls"
        return "length" if result.finish_reason == "length" else "stop"

    def complete(self, req: Request, opts: dict) -> dict:
        q = self.sched.submit(req)
        while True:
            kind, item = q.get()
            if kind == "done":
                return self._response(req, item, opts)
            if kind == "error":
                raise APIError(500, f"generation failed: {item}", type_="server_error")

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

    def stream(self, req: Request, opts: dict):
        """Yield SSE chunk dicts; content deltas as tokens arrive, tool calls once complete."""
        base = {"id": req.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model_name}

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None,
                                         **extra}]}

        yield chunk({"role": "assistant", "content": ""})
        q = self.sched.submit(req)
        fmt = self.fmt
        out: list[int] = []
        emitted = ""
        in_content = True
        while True:
            kind, item = q.get()
            if kind == "error":
                raise APIError(500, f"generation failed: {item}", type_="server_error")
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
            rest["tool_calls"] = [{"index": i, **c.to_openai()} for i, c in enumerate(parsed.tool_calls)]
        if rest:
            yield chunk(rest)
        yield chunk({}, self._finish_reason(result, parsed), token_ids=out,
                    prompt_token_ids=[int(t) for t in req.prompt],
                    versions=[int(v) for v in result.versions[result.prompt_len:]])
        if opts["include_usage"]:
            yield {**base, "choices": [], "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": len(out),
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
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "c2jax-serve"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default
            pass

        def _send_json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: APIError) -> None:
            self._send_json(e.status, e.body())

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
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
                self._error(APIError(404, f"unknown path {path!r}", code="not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path != "/v1/chat/completions":
                length = int(self.headers.get("Content-Length") or 0)
                if 0 < length <= MAX_BODY:
                    self.rfile.read(length)
                self.close_connection = True
                return self._error(APIError(404, f"unknown path {path!r}", code="not_found"))
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
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise APIError(400, f"the body is not valid JSON: {e}") from None
                req, opts = server.parse_request(body)
                if not opts["stream"]:
                    return self._send_json(200, server.complete(req, opts))
            except APIError as e:
                return self._error(e)
            except Exception as e:  # noqa: BLE001 - a bug must not kill the connection thread silently
                return self._error(APIError(500, f"{type(e).__name__}: {e}", type_="server_error"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for c in server.stream(req, opts):
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                    self.wfile.flush()
            except APIError as e:
                self.wfile.write(f"data: {json.dumps(e.body())}\n\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                return
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler
