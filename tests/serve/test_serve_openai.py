"""The OpenAI-compatible server with the official `openai` client (base_url explicit, OPENAI_* cleared),
and a greedy episode that makes the same tool calls in-process and through the server.

Model: the tiny preset (random init) with a small tokenizer trained in the test, made a bigram
machine (tests/_serve_common.py) so that greedy decoding makes real tool calls: from the assistant
header it emits ``Let me check<|tool_calls_section_begin|> ... functions.read_lints:0 ... {} ... <|im_end|>``.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np
import pytest

from _agent_common import agent_tokenizer, needs_bwrap  # noqa: F401
from _serve_common import CONTENT, bigram_params, chain_ids
from c2jax.agent.harness import Harness, HarnessConfig
from c2jax.agent.tools import ToolConfig
from _paths import REPO_ROOT  # noqa: E402

TOOLS = ToolConfig(enabled=("read_lints", "run_terminal_cmd"))
HCFG = HarnessConfig(system_prompt="You are a coding agent.", tools=TOOLS, max_turns=3, max_new_tokens=48)


@pytest.fixture(scope="module")
def served(repo_env, tmp_path_factory):
    """(server, fmt, in-process episode) with one engine: the in-process episode runs first, then
    the engine is handed to the server's scheduler."""
    from c2jax.data.chat_format import ChatFormat
    from c2jax.envs import start
    from c2jax.model import preset
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.serve import ChatServer, load_serving_checkpoint, save_serving_checkpoint
    from c2jax.agent.policies import EnginePolicy

    tok = agent_tokenizer()
    fmt = ChatFormat(tok)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, mtp_depth=0)
    ck = str(tmp_path_factory.mktemp("ckpt"))
    save_serving_checkpoint(ck, bigram_params(cfg, fmt), cfg, tok)
    params, cfg2, tok2 = load_serving_checkpoint(ck)  # what `python -m c2jax.serve --checkpoint` loads
    assert cfg2 == cfg and tok2.fingerprint() == tok.fingerprint()
    engine = Engine(params, cfg2, EngineConfig(max_slots=2, max_len=1024, prefill_chunk=256), tokenizer=tok2)
    with start(repo_env[1]) as sb:
        local = Harness(fmt, HCFG).run(EnginePolicy(engine, fmt, temperature=0.0), sb, "Check the lints.", task_id="g")
    srv = ChatServer(engine, fmt, model_name="c2jax-tiny").start("127.0.0.1", 0)
    yield srv, fmt, local
    srv.close()


@pytest.fixture
def client(served, monkeypatch):
    import openai

    for k in list(os.environ):
        if k.startswith("OPENAI_"):
            monkeypatch.delenv(k)
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="test", max_retries=0, timeout=120)


pytestmark = needs_bwrap


def test_models_and_tool_call_round_trip(served, client):
    srv, fmt, _ = served
    assert [m.id for m in client.models.list().data] == ["c2jax-tiny"]
    assert srv.url.startswith("http://127.0.0.1:")
    from c2jax.agent.tools import openai_tools

    tools = openai_tools(["read_lints"])
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "lint please"}]
    r = client.chat.completions.create(model="c2jax-tiny", messages=msgs, tools=tools, temperature=0, logprobs=True,
                                       max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    (tc,) = ch.message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("read_lints", {})
    assert tc.id.startswith("call_")  # unique per call; the header functions.read_lints:0 is rendered back
    assert ch.message.content == CONTENT
    ids = ch.model_extra["token_ids"]
    assert ids == chain_ids(fmt) and r.usage.completion_tokens == len(ids)
    assert ch.model_extra["prompt_token_ids"] == fmt.render(msgs, tools, add_generation_prompt=True).ids.tolist()
    lps = [c.logprob for c in ch.logprobs.content]
    assert len(lps) == len(ids) and all(-1e-3 < x <= 0 for x in lps)  # greedy on a peaked model
    # send the call and its result back: the server renders them with the template and goes on
    msgs2 = msgs + [ch.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id,
                                                                "content": "No lint errors."}]
    r2 = client.chat.completions.create(model="c2jax-tiny", messages=msgs2, tools=tools, temperature=0, max_tokens=40)
    as_model = msgs + [{"role": "assistant", "content": CONTENT, "tool_calls": [
        {"id": "functions.read_lints:0", "type": "function", "function": {"name": "read_lints", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.read_lints:0", "content": "No lint errors."}]
    want = fmt.render(as_model, tools, add_generation_prompt=True).ids.tolist()  # the call_ id maps to the header
    assert r2.choices[0].model_extra["prompt_token_ids"] == want
    assert r2.choices[0].message.tool_calls[0].function.name == "read_lints"


def test_streaming_matches_non_streaming(served, client):
    from c2jax.agent.tools import openai_tools

    msgs = [{"role": "user", "content": "lint"}]
    tools = openai_tools(["read_lints"])
    full = client.chat.completions.create(model="c2jax-tiny", messages=msgs, tools=tools, temperature=0, max_tokens=40)
    chunks = list(client.chat.completions.create(model="c2jax-tiny", messages=msgs, tools=tools, temperature=0,
                                                 max_tokens=40, stream=True, logprobs=True,
                                                 stream_options={"include_usage": True}))
    calls: dict[int, dict] = {}
    finish, content, n_lp, pieces = None, "", 0, 0
    for c in chunks:
        for ch in c.choices:
            content += ch.delta.content or ""
            pieces += bool(ch.delta.content)
            for d in ch.delta.tool_calls or []:
                e = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                e["id"] += d.id or ""
                e["name"] += d.function.name or ""
                e["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
            n_lp += len(ch.logprobs.content) if ch.logprobs and ch.logprobs.content else 0
    m = full.choices[0].message
    assert finish == "tool_calls" and content == m.content == CONTENT and pieces >= 2  # streamed token by token
    assert [(v["name"], v["arguments"]) for _, v in sorted(calls.items())] == [
        (t.function.name, t.function.arguments) for t in m.tool_calls]
    streamed_ids = [v["id"] for _, v in sorted(calls.items())]
    assert all(i.startswith("call_") for i in streamed_ids) and not set(streamed_ids) & {t.id for t in m.tool_calls}
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == n_lp


def _post(url: str, body: bytes, ctype: str = "application/json"):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_json_4xx(served, client):
    import openai

    srv = served[0]
    url = srv.url + "/v1/chat/completions"
    ok_msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (b"{not json", 400, None),
        (json.dumps([1, 2]).encode(), 400, None),
        (json.dumps({"messages": ok_msgs}).encode(), 400, "model"),
        (json.dumps({"model": "c2jax-tiny", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": "c2jax-tiny", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages"),
        (json.dumps({"model": "c2jax-tiny", "messages": ok_msgs, "temperature": 9}).encode(), 400, "temperature"),
        (json.dumps({"model": "c2jax-tiny", "messages": ok_msgs, "n": 3}).encode(), 400, "n"),
        (json.dumps({"model": "c2jax-tiny", "messages": ok_msgs, "tools": [{"type": "x"}]}).encode(), 400, "tools"),
        (json.dumps({"model": "c2jax-tiny", "messages": ok_msgs, "tool_choice": "required"}).encode(), 400, "tool_choice"),
        (json.dumps({"model": "c2jax-tiny", "messages": [{"role": "user", "content": "word " * 3000}]}).encode(), 400,
         "messages"),
        (json.dumps({"model": "other", "messages": ok_msgs}).encode(), 404, "model"),
    ]
    for body, status, param in cases:
        code, js = _post(url, body)
        assert code == status and set(js["error"]) >= {"message", "type", "param", "code"}, (body[:60], code, js)
        assert js["error"]["param"] == param, (body[:60], js)
    code, js = _post(srv.url + "/v1/nowhere", b"{}")
    assert code == 404 and "error" in js
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=ok_msgs)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="c2jax-tiny", messages=[{"role": "user", "content": "word " * 3000}])
    # the server is still healthy afterwards
    assert client.chat.completions.create(model="c2jax-tiny", messages=ok_msgs, max_tokens=4).choices


def test_greedy_episode_same_tool_calls_in_process_and_through_server(served, repo_env):
    from c2jax.agent.policies import OpenAIPolicy
    from c2jax.envs import start

    srv, fmt, local = served
    os.environ.pop("OPENAI_API_KEY", None)
    pol = OpenAIPolicy(base_url=srv.url + "/v1", model="c2jax-tiny", api_key="test", temperature=0.0)
    with start(repo_env[1]) as sb:
        remote = Harness(fmt, HCFG).run(pol, sb, "Check the lints.", task_id="g")
    calls = lambda ep: [(m["tool_calls"][0]["function"]["name"], m["tool_calls"][0]["function"]["arguments"])  # noqa: E731
                        for m in ep.messages[0] if m.get("tool_calls")]
    assert calls(local) == calls(remote) == [("read_lints", "{}")] * 3
    assert local.stop_reason == remote.stop_reason == "max_turns"
    a, b = local.trajectory.segments[0], remote.trajectory.segments[0]
    np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)  # token-exact through the server
    np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
    np.testing.assert_allclose(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-5)
    assert remote.trajectory.metadata["trainable"] and local.trajectory.metadata["trainable"]
    assert [e.ok for e in local.trajectory.tool_events] == [e.ok for e in remote.trajectory.tool_events]
    # in-process the engine also gives routes (router replay) for the whole segment; RL can batch it
    from c2jax.batching import pad_batch

    assert a.routes is not None and a.routes.shape[0] in (a.num_tokens - 1, a.num_tokens) and b.routes is None
    assert (a.policy_versions[a.loss_mask] == 0).all()
    batch = pad_batch([local.trajectory], max_len=1024)
    assert batch["loss_mask"].sum() == a.loss_mask.sum() and batch["routes"].shape[2:] == a.routes.shape[1:]


@pytest.mark.slow
def test_serve_cli_subprocess(tmp_path, monkeypatch):
    """`python -m c2jax.serve --checkpoint PATH --port 0` in its own process, with the openai client."""
    import re
    import subprocess
    import sys
    import time

    import openai

    from c2jax.data.chat_format import ChatFormat
    from c2jax.model import preset
    from c2jax.serve import save_serving_checkpoint

    tok = agent_tokenizer()
    fmt = ChatFormat(tok)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, mtp_depth=0)
    save_serving_checkpoint(str(tmp_path), bigram_params(cfg, fmt), cfg, tok)
    root = REPO_ROOT
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = root
    proc = subprocess.Popen([sys.executable, "-m", "c2jax.serve", "--checkpoint", str(tmp_path), "--port", "0",
                             "--max-len", "512", "--max-slots", "2", "--model-name", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=root)
    try:
        line = ""
        t0 = time.time()
        while "serving" not in line and time.time() - t0 < 240:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "server exited"
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        for k in list(os.environ):
            if k.startswith("OPENAI_"):
                monkeypatch.delenv(k)
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=240)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        from c2jax.agent.tools import openai_tools

        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "lint"}],
                                           tools=openai_tools(["read_lints"]), temperature=0, max_tokens=32)
        assert r.choices[0].message.tool_calls[0].function.name == "read_lints"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode is not None


@pytest.mark.slow
def test_concurrent_engine_episodes_share_the_engine(repo_env):
    """Several async episodes of one EnginePolicy: the engine's background loop batches them, the
    sandbox pool bounds them, and greedy episodes agree with each other token for token."""
    import asyncio

    from c2jax.agent.policies import EnginePolicy
    from c2jax.data.chat_format import ChatFormat
    from c2jax.envs.pool import SandboxPool
    from c2jax.model import preset
    from c2jax.sampling import Engine, EngineConfig

    tok = agent_tokenizer()
    fmt = ChatFormat(tok)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, mtp_depth=0)
    engine = Engine(bigram_params(cfg, fmt), cfg, EngineConfig(max_slots=2, max_len=1024, prefill_chunk=256))
    pol = EnginePolicy(engine, fmt, temperature=0.0)
    try:
        with SandboxPool(max_concurrency=2) as pool:
            eps = asyncio.run(Harness(fmt, HCFG).arun_many(pol, pool, [(repo_env[1], "Check the lints.", f"t{i}")
                                                                       for i in range(4)]))
    finally:
        engine.shutdown()
    assert [e.stop_reason for e in eps] == ["max_turns"] * 4
    ref = eps[0].trajectory.segments[0]
    for e in eps[1:]:
        np.testing.assert_array_equal(e.trajectory.segments[0].completion_ids, ref.completion_ids)
    assert all(len(e.trajectory.tool_events) == 3 for e in eps)


def test_message_only_endpoint_episode_is_evaluation_only(served, repo_env):
    """Without token ids (a hosted API), the episode runs on the returned messages: the same tool
    calls, rendered into the trajectory with loss mask 0 and marked not trainable."""
    from c2jax.agent.policies import OpenAIPolicy
    from c2jax.envs import start

    srv, fmt, local = served
    pol = OpenAIPolicy(base_url=srv.url + "/v1", model="c2jax-tiny", api_key="test", temperature=0.0,
                       use_token_ids=False)
    with start(repo_env[1]) as sb:
        ep = Harness(fmt, HCFG).run(pol, sb, "Check the lints.", task_id="g")
    assert [(e.name, e.ok, e.malformed) for e in ep.trajectory.tool_events] == [("read_lints", True, False)] * 3
    assert not ep.trajectory.metadata["trainable"] and ep.trajectory.num_policy_tokens == 0
    assert all("token_ids" not in m for m in ep.messages[0])
