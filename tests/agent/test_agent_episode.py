"""Full episodes of scripted policies against real sandboxes: read, edit, run tests, finish; token-in/
token-out with non-canonical segmentations; malformed calls as messages; self-summarisation with the
exact post-summary context (recursive); budgets; the oracle; concurrent episodes bounded by a pool."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from _agent_common import FIX_PATCH, chat_format, needs_bwrap  # noqa: F401
from c2jax.agent.harness import Harness, HarnessConfig, SUMMARY_HEADER, post_summary_messages, token_counts
from c2jax.agent.policies import OraclePolicy, ScriptedPolicy
from c2jax.data.chat_format import Message, ToolCall
from c2jax.trajectory import Trajectory

pytestmark = needs_bwrap


def call(name: str, i: int, **args) -> ToolCall:
    return ToolCall(f"functions.{name}:{i}", name, json.dumps(args))


@pytest.fixture
def sb(repo_env):
    from c2jax.envs import start

    with start(repo_env[1], timeout_s=120) as s:
        yield s


def check_token_exact(policy: ScriptedPolicy, traj: Trajectory, emitted: list[list[int]]) -> None:
    """Within each context, request k+1's prompt starts with request k's prompt + its emitted ids,
    and the stored segment is the last request's prompt + emitted ids (nothing re-tokenised)."""
    reqs = policy.requests
    assert len(reqs) == len(emitted)
    seg_of = []
    seg = 0
    for k, r in enumerate(reqs):
        if k and not r.prompt_ids[:len(reqs[k - 1].prompt_ids)] == reqs[k - 1].prompt_ids:
            seg += 1  # a new context (after a summary)
        seg_of.append(seg)
    assert seg + 1 == len(traj.segments)
    for k in range(len(reqs) - 1):
        if seg_of[k + 1] == seg_of[k]:
            prev = reqs[k].prompt_ids + emitted[k]
            assert reqs[k + 1].prompt_ids[:len(prev)] == prev
    for s_idx, s in enumerate(traj.segments):
        last = max(k for k in range(len(reqs)) if seg_of[k] == s_idx)
        first = min(k for k in range(len(reqs)) if seg_of[k] == s_idx)
        full = np.concatenate([s.prompt_ids, s.completion_ids]).tolist()
        assert s.prompt_ids.tolist() == reqs[first].prompt_ids
        want = reqs[last].prompt_ids + emitted[last]
        assert full[:len(want)] == want and len(full) - len(want) <= 1  # +1: <|im_end|> closing a truncated turn


def test_scripted_episode_reads_edits_runs_tests_and_finishes(sb):
    fmt = chat_format()
    script = [
        Message("assistant", "Let me look.", [call("read_file", 0, target_file="pkg/calc.py"),
                                              call("run_terminal_cmd", 1, command="python run_tests.py")]),
        Message("assistant", "", [call("search_replace", 2, file_path="pkg/calc.py", old_string="a - b",
                                       new_string="a + b")], reasoning="the sign is wrong"),
        Message("assistant", "", [ToolCall("functions.nope:3", "nope", "{bad")]),  # unknown tool, bad JSON
        Message("assistant", "", [call("run_terminal_cmd", 4, command="python run_tests.py")]),
    ]
    pol = ScriptedPolicy(fmt, script, final="Fixed add.")
    ep = Harness(fmt, HarnessConfig()).run(pol, sb, "Fix the failing test", task_id="calc-1")
    assert ep.stop_reason == "finished" and ep.final_message == "Fixed add."
    assert "-    return a - b\n+    return a + b" in ep.diff
    t = Trajectory.from_json(ep.trajectory.to_json())  # serialisable, validates
    assert not t.truncated and not t.infra_failed and len(t.segments) == 1
    assert [(e.name, e.ok, e.malformed) for e in t.tool_events] == [
        ("read_file", True, False), ("run_terminal_cmd", False, False), ("search_replace", True, False),
        ("nope", False, True), ("run_terminal_cmd", True, False)]
    msgs = ep.messages[0]
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    assert "AssertionError: -1" in tool_msgs[1]["content"] and tool_msgs[4]["content"].startswith("all tests passed")
    assert tool_msgs[3]["tool_call_id"] == "functions.nope:3" and "does not exist" in tool_msgs[3]["content"]
    # the model sees the error: it is in the next turn's prompt
    assert "tool 'nope' does not exist" in fmt.tok.decode(pol.requests[3].prompt_ids)
    emitted = [fmt.assistant_body(m) for m in script] + [fmt.assistant_body(Message("assistant", "Fixed add."))]
    check_token_exact(pol, t, emitted)
    seg = t.segments[0]
    assert int(seg.loss_mask.sum()) == sum(map(len, emitted)) == t.num_policy_tokens
    e = t.effort
    assert (e.turns, e.tool_calls) == (5, 5)
    assert e.thinking_tokens == len(fmt.tok.encode("the sign is wrong")) + 2
    assert e.final_message_tokens == len(fmt.tok.encode("Fixed add."))
    assert e.tool_call_tokens == sum(token_counts(fmt, x)["tool_call"] for x in emitted)
    assert e.tool_output_tokens == sum(ev.output_tokens for ev in t.tool_events) > 0
    kinds = [ev["type"] for ev in ep.events]
    assert kinds.count("generate") == 5 and kinds.count("tool") == 5 and kinds[-1] == "stop"
    assert all(ev["duration_s"] >= 0 and ev["t"] >= 0 for ev in ep.events)


def test_token_in_token_out_with_non_canonical_segmentation(sb):
    fmt = chat_format()
    tok = fmt.tok

    def chars(s: str) -> list[int]:  # one token per character: valid, but not how encode() splits it
        return [i for ch in s for i in tok.encode(ch)]

    def weird_call(name: str, idx: int, args: dict) -> list[int]:
        return [fmt.calls_begin, fmt.call_begin, *chars(f"functions.{name}:{idx}"), fmt.call_arg,
                *chars(json.dumps(args)), fmt.call_end, fmt.calls_end, fmt.im_end]

    emitted = [chars("Looking around.") + weird_call("list_dir", 0, {"target_directory": "pkg"}),
               weird_call("read_file", 1, {"target_file": "pkg/text.py"}),
               chars("All read.") + [fmt.im_end]]
    for e in emitted:  # really non-canonical: re-tokenising the parsed message gives other ids
        assert fmt.assistant_body(fmt.parse_assistant(e).to_message()) != e
    pol = ScriptedPolicy(fmt, emitted)
    ep = Harness(fmt).run(pol, sb, "Look at the package", task_id="t")
    assert ep.stop_reason == "finished" and ep.final_message == "All read."
    assert [e.name for e in ep.trajectory.tool_events] == ["list_dir", "read_file"]
    assert "calc.py" in ep.messages[0][3]["content"] and "def shout" in ep.messages[0][5]["content"]
    check_token_exact(pol, ep.trajectory, emitted)
    # the emitted ids appear verbatim in the stored completion, with loss mask 1 exactly there
    seg = ep.trajectory.segments[0]
    comp, mask = seg.completion_ids.tolist(), seg.loss_mask
    assert comp[:len(emitted[0])] == emitted[0] and mask[:len(emitted[0])].all()
    assert int(mask.sum()) == sum(map(len, emitted))
    # the canonical OpenAI messages carry the exact ids of each generation
    gen_msgs = [m for m in ep.messages[0] if m["role"] == "assistant"]
    assert [m["token_ids"] for m in gen_msgs] == emitted


def test_malformed_section_and_truncation_budgets(sb):
    fmt = chat_format()
    tok = fmt.tok
    broken = [fmt.calls_begin, *tok.encode("junk"), fmt.im_end]  # a section with no call in it
    pol = ScriptedPolicy(fmt, [broken, tok.encode("no stop token")])
    ep = Harness(fmt, HarnessConfig(max_new_tokens=50)).run(pol, sb, "go", task_id="t")
    assert ep.stop_reason == "length" and ep.trajectory.truncated
    ev = ep.trajectory.tool_events
    assert len(ev) == 1 and ev[0].malformed and ev[0].error == "parse_error"
    assert "could not be parsed" in fmt.tok.decode(pol.requests[1].prompt_ids)
    seg = ep.trajectory.segments[0]
    assert seg.completion_ids[-1] == fmt.im_end and not seg.loss_mask[-1]  # closing token added, no loss

    forever = ScriptedPolicy(fmt, [Message("assistant", "", [call("list_dir", i, target_directory=".")])
                                   for i in range(10)])
    ep = Harness(fmt, HarnessConfig(max_turns=3)).run(forever, sb, "go", task_id="t")
    assert ep.stop_reason == "max_turns" and ep.trajectory.truncated and ep.trajectory.effort.turns == 3
    n0 = len(forever.requests)
    ep = Harness(fmt, HarnessConfig(max_policy_tokens=60)).run(forever, sb, "go", task_id="t")
    assert ep.stop_reason == "max_policy_tokens" and ep.trajectory.num_policy_tokens == 60
    budgets = [r.max_new_tokens for r in forever.requests[n0:]]
    assert budgets[0] == 60 and budgets[1] == 60 - len(fmt.assistant_body(forever.script[0]))  # what is left


def test_self_summarisation_exact_context_recursive(sb):
    from c2jax.agent.chat import AgentContext
    from c2jax.agent.tools import Toolbox

    fmt = chat_format()
    cfg0 = HarnessConfig()
    task = "Write a note, then check it"
    summaries = iter(["SUMMARY ONE: wrote note.txt", "SUMMARY TWO: checked the note"])
    acts = iter([
        Message("assistant", "", [call("todo_write", 0, merge=False, todos=[
            {"id": "1", "content": "write note", "status": "completed"},
            {"id": "2", "content": "check note", "status": "in_progress"}]),
            call("write_file", 1, file_path="note.txt", contents="kept across summaries\n")]),
        Message("assistant", "", [call("read_file", 0, target_file="note.txt")]),
        Message("assistant", "Done: the note is there."),
    ])
    pol = ScriptedPolicy(fmt, [lambda r: Message("assistant", next(summaries)) if r.purpose == "summarize"
                               else next(acts)] * 10)
    tools = Toolbox(sb).schemas()
    ctx = AgentContext(fmt, None, tools)
    ctx.add(Message("system", cfg0.system_prompt))
    ctx.add(Message("user", task))
    longest = fmt.render(post_summary_messages(cfg0.system_prompt, task, "SUMMARY TWO: checked the note", [
        {"id": "2", "content": "check note", "status": "in_progress"}], 2), tools, add_generation_prompt=True)
    trigger = max(len(ctx.prompt_ids()), len(longest)) + 10  # any tool turn crosses it, a fresh context does not
    ep = Harness(fmt, HarnessConfig(summary_trigger_tokens=trigger)).run(pol, sb, task, task_id="sum")
    assert ep.stop_reason == "finished", ep.events
    t = ep.trajectory
    assert t.metadata["summaries"] == 2 and len(t.segments) == 3
    assert [r.purpose for r in pol.requests] == ["act", "summarize", "act", "summarize", "act"]
    # it triggers at the configured length: every act request is below it; each summary request
    # follows a context at or above it (the request adds the summary-request user message)
    request_len = len(fmt.render([Message("user", cfg0.summary_request)]).ids)
    for r in pol.requests:
        if r.purpose == "act":
            assert len(r.prompt_ids) < trigger
        else:
            assert len(r.prompt_ids) - request_len >= trigger
    # the exact post-summary contexts: system, task prompt, summary + open to-dos + count
    todo_open = [{"id": "2", "content": "check note", "status": "in_progress"}]
    for k, (summary, n) in enumerate([("SUMMARY ONE: wrote note.txt", 1), ("SUMMARY TWO: checked the note", 2)]):
        want = fmt.render(post_summary_messages(cfg0.system_prompt, task, summary, todo_open, n),
                          tools, add_generation_prompt=True).ids.tolist()
        assert pol.requests[2 + 2 * k].prompt_ids == want
        assert t.segments[k + 1].prompt_ids.tolist() == want
        text = fmt.tok.decode(want)
        assert SUMMARY_HEADER.format(n=n) in text and "- [in_progress] 2: check note" in text
        assert "write note" not in text  # completed to-dos are not carried over
    # recursive: the second summary request saw the first summary, the last context only the second
    second = fmt.tok.decode(pol.requests[3].prompt_ids)
    assert "SUMMARY ONE" in second and "kept across summaries" in second
    assert "SUMMARY ONE" not in fmt.tok.decode(pol.requests[4].prompt_ids)
    # the sandbox kept its state across the summary: the note written before it was read after it
    assert ep.messages[1][4]["role"] == "tool" and "kept across summaries" in ep.messages[1][4]["content"]
    assert [e.segment for e in t.tool_events] == [0, 0, 1]
    # every generation is in the one trajectory with loss, summaries included
    assert all(s.loss_mask.any() for s in t.segments)
    assert "SUMMARY ONE" in fmt.tok.decode(t.segments[0].completion_ids[t.segments[0].loss_mask])
    assert sum(e["type"] == "summary" for e in ep.events) == 2 and t.effort.turns == 5
    check_token_exact(pol, t, _emitted(ep))


def _emitted(ep) -> list[list[int]]:
    return [m["token_ids"] for ctx in ep.messages for m in ctx if m["role"] == "assistant" and "token_ids" in m]


def test_oracle_policy_applies_gold_patch(sb):
    fmt = chat_format()
    ep = Harness(fmt).run(OraclePolicy(fmt, FIX_PATCH), sb, "fix it", task_id="oracle")
    assert ep.stop_reason == "finished" and ep.trajectory.tool_events[0].ok
    assert "+    return a + b" in ep.diff
    assert sb.exec("python run_tests.py").stdout == "all tests passed\n"


def test_concurrent_episodes_bounded_by_pool(repo_env):
    from c2jax.envs.pool import SandboxPool

    fmt = chat_format()
    active = []
    pool = SandboxPool(max_concurrency=2, max_queue=16)

    def probe(req):
        active.append(pool.metrics()["active"])
        return Message("assistant", "", [call("run_terminal_cmd", 1, command="sleep 0.3; python run_tests.py")])

    pol = ScriptedPolicy(fmt, [Message("assistant", "", [call("apply_patch", 0, patch=FIX_PATCH)]), probe])
    try:
        eps = asyncio.run(Harness(fmt).arun_many(pol, pool, [(repo_env[1], "fix", f"task{i}") for i in range(4)]))
    finally:
        pool.close()
    assert [e.stop_reason for e in eps] == ["finished"] * 4
    assert [e.trajectory.task_id for e in eps] == [f"task{i}" for i in range(4)]
    assert all("+    return a + b" in e.diff and e.trajectory.tool_events[1].ok for e in eps)
    assert max(active) == 2  # episodes overlapped, and never more than the pool's cap
    m = pool.metrics()
    assert m["active"] == 0 and m["started"] == 4


def test_context_budget_from_the_policy(sb):
    fmt = chat_format()
    pol = ScriptedPolicy(fmt, [Message("assistant", "", [call("list_dir", i, target_directory="pkg")])
                               for i in range(10)])
    Harness(fmt, HarnessConfig(max_turns=1)).run(pol, sb, "go", task_id="t")
    first = len(pol.requests[0].prompt_ids)
    pol.max_context_tokens = first + 150  # e.g. EnginePolicy: the engine's max_len
    pol.requests.clear()
    ep = Harness(fmt).run(pol, sb, "go", task_id="t")
    assert ep.stop_reason == "context" and ep.trajectory.truncated
    assert all(len(r.prompt_ids) + r.max_new_tokens <= first + 150 for r in pol.requests)


def test_message_only_policy_keeps_endpoint_call_ids(sb):
    """A policy that returns messages (a hosted endpoint) with its own call ids ('call_1'): the tools
    run, the results answer those ids, and the trajectory is marked evaluation-only."""
    from c2jax.agent.policies import Generation, Policy

    class Endpoint(Policy):
        def __init__(self):
            self.seen = []

        def generate(self, req):
            self.seen.append(req.messages)
            if req.turn == 0:
                return Generation(message=Message("assistant", "", [ToolCall("call_1", "list_dir",
                                                                             '{"target_directory": "pkg"}')]),
                                  trainable=False)
            return Generation(message=Message("assistant", "done"), trainable=False)

    fmt = chat_format()
    pol = Endpoint()
    ep = Harness(fmt).run(pol, sb, "list", task_id="t")
    assert ep.stop_reason == "finished" and ep.trajectory.tool_events[0].ok
    sent = pol.seen[1]
    assert sent[2]["tool_calls"][0]["id"] == "call_1" and sent[2]["tool_calls"][0]["function"]["name"] == "list_dir"
    assert sent[3] == {"role": "tool", "content": sent[3]["content"], "tool_call_id": "call_1"}
    assert "calc.py" in sent[3]["content"]
    assert not ep.trajectory.metadata["trainable"] and ep.trajectory.num_policy_tokens == 0
