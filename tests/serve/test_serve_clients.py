"""`c2jax.serve` against what third-party clients expect, with the official `openai` client:
unique tool-call ids mapped back to the model's headers, the `developer` role, OpenAI's
context-length wording and code, deeply nested JSON -> 400, a wrong method -> 405, and a client that
disconnects mid-generation has its request cancelled (engine counters, not timing).

No sandbox needed: the bigram and loop machines of tests/_serve_common.py on the tiny preset.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import time

import pytest

from _agent_common import agent_tokenizer
from _serve_common import CONTENT, bigram_params, loop_params

MODEL = "c2jax-tiny"
MAX_LEN = 1024
HEADER = "functions.read_lints:0"  # the call header the bigram machine generates
CLIENT_TIMEOUT_S = 600  # only stops a hung test: the first request compiles, and CI machines are shared


def _engine(params_fn):
    from c2jax.data.chat_format import ChatFormat
    from c2jax.model import preset
    from c2jax.sampling import Engine, EngineConfig

    # one prefill chunk size and one attention window: two compilations serve every test here
    tok = agent_tokenizer()
    fmt = ChatFormat(tok)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, mtp_depth=0)
    ecfg = EngineConfig(max_slots=2, max_len=MAX_LEN, prefill_chunk=16, min_window=MAX_LEN)
    return Engine(params_fn(cfg, fmt), cfg, ecfg, tokenizer=tok), fmt


@pytest.fixture(scope="module")
def bigram_server():
    from c2jax.serve import ChatServer

    engine, fmt = _engine(bigram_params)
    srv = ChatServer(engine, fmt, model_name=MODEL).start("127.0.0.1", 0)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def loop_server():
    from c2jax.serve import ChatServer

    engine, fmt = _engine(loop_params)
    srv = ChatServer(engine, fmt, model_name=MODEL, default_max_tokens=600).start("127.0.0.1", 0)
    yield srv
    srv.close()


def _client(srv, monkeypatch):
    import openai

    for k in list(os.environ):
        if k.startswith("OPENAI_"):
            monkeypatch.delenv(k)
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0, timeout=CLIENT_TIMEOUT_S)


def _tools():
    from c2jax.agent.tools import openai_tools

    return openai_tools(["read_lints"])


def _call_msg(call_id: str) -> list[dict]:
    return [{"role": "assistant", "content": CONTENT, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "read_lints", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "No lint errors."}]


def test_tool_call_ids_are_unique_and_render_as_the_model_header(bigram_server, monkeypatch):
    srv = bigram_server
    client = _client(srv, monkeypatch)
    fmt, tools = srv.fmt, _tools()
    user = [{"role": "user", "content": "lint"}]
    ids = [client.chat.completions.create(model=MODEL, messages=user, tools=tools, temperature=0, max_tokens=40)
           .choices[0].message.tool_calls[0].id for _ in range(2)]
    chunks = list(client.chat.completions.create(model=MODEL, messages=user, tools=tools, temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    stream_ids = [d.id for c in chunks for ch in c.choices for d in (ch.delta.tool_calls or []) if d.id]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    all_ids = ids + stream_ids
    assert len(all_ids) == 3 and len(set(all_ids)) == 3 and all(i.startswith("call_") for i in all_ids)
    # sent back, every issued id renders as the header the model generated, in the call and its result
    want = fmt.render(user + _call_msg(HEADER), tools, add_generation_prompt=True).ids.tolist()
    for cid in all_ids + [HEADER]:
        r = client.chat.completions.create(model=MODEL, messages=user + _call_msg(cid), tools=tools, temperature=0,
                                           max_tokens=40)
        assert r.choices[0].model_extra["prompt_token_ids"] == want, cid
    # an id this server never issued: the canonical header (call index in the conversation), not the raw id
    r = client.chat.completions.create(model=MODEL, messages=user + _call_msg("call_fromelsewhere"), tools=tools,
                                       temperature=0, max_tokens=40)
    assert r.choices[0].model_extra["prompt_token_ids"] == want
    text = fmt.tok.decode(r.choices[0].model_extra["prompt_token_ids"])
    assert "call_fromelsewhere" not in text and f"## Return of {HEADER}" in text


def test_developer_role_is_rendered_as_system(bigram_server, monkeypatch):
    client = _client(bigram_server, monkeypatch)

    def prompt(role: str) -> list[int]:
        r = client.chat.completions.create(model=MODEL, messages=[{"role": role, "content": "Be brief."},
                                                                  {"role": "user", "content": "hi"}], max_tokens=2)
        return r.choices[0].model_extra["prompt_token_ids"]

    assert prompt("developer") == prompt("system")


def test_context_length_errors_use_openai_wording(bigram_server, monkeypatch):
    import openai

    client = _client(bigram_server, monkeypatch)
    msgs = [{"role": "user", "content": "hi"}]
    ok = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    n_prompt = ok.usage.prompt_tokens
    assert ok.usage.completion_tokens <= 3
    # the largest max_tokens that fits is accepted; one more is 400 context_length_exceeded
    client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_LEN - n_prompt)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_LEN - n_prompt + 1)
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert err["message"] == (f"This model's maximum context length is {MAX_LEN} tokens. However, you requested "
                              f"{MAX_LEN + 1} tokens ({n_prompt} in the messages, {MAX_LEN - n_prompt + 1} in the "
                              f"completion). Please reduce the length of the messages or completion.")
    with pytest.raises(openai.BadRequestError) as e:  # max_completion_tokens: the newer name, same rule
        client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=10 * MAX_LEN)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:  # no max_tokens: only the prompt can overflow
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 3000}])
    assert e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["message"].startswith(f"This model's maximum context length is {MAX_LEN} tokens. However, "
                                              f"your messages resulted in ")


def _raw(srv, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, dict]:
    host, port = srv.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), json.loads(r.read() or b"{}")
    finally:
        conn.close()


def test_nested_json_is_400_and_wrong_method_is_405(bigram_server):
    srv = bigram_server
    deep = 200_000
    cases = [b"[" * deep + b"]" * deep,  # beyond the parser's recursion limit
             json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                         "tools": [{"type": "function", "function": {"name": "f", "parameters": json.loads(
                             "[" * 500 + "]" * 500)}}]}).encode()]  # parses, nests past the server's limit
    for body in cases:
        status, _, js = _raw(srv, "POST", "/v1/chat/completions", body)
        assert status == 400 and js["error"]["code"] == "invalid_json" and "deeper than" in js["error"]["message"]
    status, headers, js = _raw(srv, "GET", "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST" and js["error"]["code"] == "method_not_allowed"
    status, headers, _ = _raw(srv, "POST", "/v1/models", b"{}")
    assert status == 405 and headers["Allow"] == "GET"
    status, headers, _ = _raw(srv, "DELETE", "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST"
    assert _raw(srv, "GET", "/v1/nowhere")[0] == 404 and _raw(srv, "PUT", "/v1/nowhere", b"{}")[0] == 404
    status, _, js = _raw(srv, "POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())
    assert status == 200 and js["choices"]  # still serving


def _wait_for(cond, what: str, limit_s: float = CLIENT_TIMEOUT_S) -> None:
    """Poll `cond` (bounded); the assertion is on engine state, the bound only stops a hung test."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit_s, f"gave up waiting for {what}"
        time.sleep(0.02)


def _post_raw(srv, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    host, port = srv.httpd.server_address[:2]
    s = socket.create_connection((host, port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_client_disconnect_cancels_the_request_and_frees_its_slot(loop_server, monkeypatch):
    srv = loop_server
    eng = srv.engine
    client = _client(srv, monkeypatch)
    msgs = [{"role": "user", "content": "go"}]
    # control: the loop machine never stops by itself; a connected client gets every token it asked for
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    assert eng.stats["cancelled"] == 0
    for stream in (False, True):
        gen0, cancelled0 = eng.stats["generated_tokens"], eng.stats["cancelled"]
        if stream:
            resp = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=500,
                                                  stream=True)
            got = 0
            for _ in resp:  # read a few chunks, then leave
                got += 1
                if got == 4:
                    break
            resp.close()
        else:
            s = _post_raw(srv, {"model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": 500})
            _wait_for(lambda: eng.stats["generated_tokens"] >= gen0 + 3, "generation to start")
            s.close()
        _wait_for(lambda: eng.stats["cancelled"] == cancelled0 + 1, "the cancellation")
        _wait_for(lambda: not eng.has_work(), "the slot to be freed")
        assert all(seq is None for seq in eng.row_seq) and not eng.queue
        assert eng.stats["generated_tokens"] - gen0 < 500, stream  # stopped early, not run to max_tokens
    # the freed slots serve the next request in full
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=4)
    assert r.usage.completion_tokens == 4 and eng.stats["cancelled"] == 2


def test_engine_cancel_queued_and_running():
    """Engine.cancel directly: a queued request finishes without a row, a running one frees its row."""
    from c2jax.sampling import Request, SamplingParams

    eng, fmt = _engine(loop_params)
    prompt = fmt.render([{"role": "user", "content": "go"}], add_generation_prompt=True).ids.tolist()
    reqs = [Request(prompt, SamplingParams(temperature=0.0, max_new_tokens=300), id=f"r{i}") for i in range(3)]
    for r in reqs:
        eng.add_request(r)
    eng.step()  # two slots: r0, r1 run, r2 waits
    assert [s.req.id for s in eng.row_seq] == ["r0", "r1"] and [s.req.id for s in eng.queue] == ["r2"]
    assert eng.cancel("r2") and eng.cancel("r0") and not eng.cancel("nope")
    done = {}
    while "r0" not in done or "r2" not in done:
        done.update({ev.request_id: ev.result for ev in eng.step() if ev.result is not None})
    assert done["r2"].finish_reason == "cancelled" and len(done["r2"].output_tokens) == 0
    assert done["r0"].finish_reason == "cancelled" and 0 < len(done["r0"].output_tokens) < 300
    assert [s.req.id if s else None for s in eng.row_seq] == [None, "r1"] and eng.stats["cancelled"] == 2
    assert eng.cancel("r1")
    while eng.has_work():
        eng.step()
    assert eng.stats["finished"] == 3
