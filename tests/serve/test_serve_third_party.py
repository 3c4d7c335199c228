"""`c2jax.serve` driven by third-party clients (the `clients` extra: pip install -e .[clients]):
the OpenAI agents SDK runs a tool loop (it drops a tool call whose id it has seen before, so
unique ids are what keep the loop going: positive control with the old repeated ids), and
litellm maps the server's context-length error to its ContextWindowExceededError.
Each test skips, saying so, when its package is not installed.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

from test_serve_clients import CLIENT_TIMEOUT_S, MAX_LEN, MODEL, bigram_server  # noqa: F401  (fixture)


# decided at collection, so that a skipped test does not start the server first
needs_agents = pytest.mark.skipif(importlib.util.find_spec("agents") is None,
                                  reason="openai-agents is not installed (pip install -e .[clients])")
needs_litellm = pytest.mark.skipif(importlib.util.find_spec("litellm") is None,
                                   reason="litellm is not installed (pip install -e .[clients])")


@pytest.fixture
def no_openai_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("OPENAI_", "LITELLM_")):
            monkeypatch.delenv(k)


def _run_agent(srv, max_turns: int) -> tuple[list[int], Exception | None]:
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[int] = []

    @agents.function_tool
    def read_lints() -> str:
        """Read the linter errors of the workspace."""
        calls.append(1)
        return "No lint errors."

    client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="test", max_retries=0, timeout=CLIENT_TIMEOUT_S)
    agent = agents.Agent(name="coder", instructions="You are a coding agent.", tools=[read_lints],
                         model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
    try:
        agents.Runner.run_sync(agent, "Check the lints.", max_turns=max_turns)
    except agents.MaxTurnsExceeded as e:
        return calls, e
    return calls, None


@needs_agents
def test_openai_agents_sdk_runs_the_tool_loop(bigram_server, no_openai_env, monkeypatch):
    # the bigram machine calls read_lints every turn: the run goes on until max_turns
    calls, err = _run_agent(bigram_server, max_turns=3)
    assert err is not None and len(calls) == 3
    # positive control: with one id for every call (the model's header, as before) the SDK ends the run early
    monkeypatch.setattr(bigram_server.call_ids, "issue", lambda header: header)
    calls, err = _run_agent(bigram_server, max_turns=3)
    assert len(calls) < 3, (calls, err)


@needs_litellm
def test_litellm_maps_the_context_error(bigram_server, no_openai_env):
    import litellm
    kw = dict(model=f"openai/{MODEL}", api_base=bigram_server.url + "/v1", api_key="test", num_retries=0,
              timeout=CLIENT_TIMEOUT_S)
    msgs = [{"role": "user", "content": "lint"}]
    from c2jax.agent.tools import openai_tools

    ok = litellm.completion(messages=msgs, tools=openai_tools(["read_lints"]), temperature=0, max_tokens=40, **kw)
    assert ok.choices[0].message.tool_calls[0].function.name == "read_lints"
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=msgs, max_tokens=MAX_LEN, **kw)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "word " * 3000}], **kw)
