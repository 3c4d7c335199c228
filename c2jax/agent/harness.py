"""The agent episode loop: the policy proposes, tools run in the sandbox, results return, until the
policy finishes or a budget ends it. One harness for RL rollouts, evaluation and deployment.

    h = Harness(fmt, HarnessConfig(max_turns=30, summary_trigger_tokens=8000))
    ep = h.run(policy, sandbox, "Fix the failing test in pkg/", task_id="t1")
    ep.trajectory        # c2jax.trajectory.Trajectory: segments (exact ids), tool events, effort
    ep.messages          # canonical OpenAI-shaped transcript per context
    ep.events            # every generation / tool call / summary / stop with timings
    eps = await h.arun_many(policy, pool, [(env_id, prompt, task_id), ...])   # bounded by the pool

Turn: the context's exact ids go to the policy; its ids are appended verbatim (token-in/token-out,
`chat.AgentContext`); every tool call in the turn runs in order and its result is appended as a
`tool` message. A turn without tool calls is the final answer. A malformed call (bad JSON, unknown
tool, bad arguments, a broken tool-call section) becomes an error message the model sees, is
counted (`ToolEvent.malformed`) and never raises. `SandboxError` (infrastructure) ends the episode
with `infra_failed=True` (the sample is masked, not scored).

Budgets: `max_turns` generations, `max_policy_tokens` sampled tokens in all, `max_wall_s` seconds,
`max_context_tokens` per context (prompt + new tokens). A budget stop sets `truncated=True`.

Self-summarisation (Composer 1.5/2): before a generation, when the context holds at least
`summary_trigger_tokens` ids (or the next turn would not fit in `max_context_tokens`), the harness
appends the user message `summary_request`; the policy writes a summary (same segment, loss mask
1). Generation then restarts from a context of exactly (`post_summary_messages`):

    [system prompt] [user: task prompt] [user: SUMMARY_HEADER.format(n=...) + summary + open to-dos]

(after the tool declarations every context starts with), where n counts the summaries so far,
while the sandbox keeps its state. Each context is one `Segment` of the same trajectory, so the
final reward credits every generation, summaries included. Summaries can repeat (recursive: the
next summary request sees the previous summary in its context); `n` counts the summaries so far.

Effort (the length-penalty inputs): thinking tokens (``<think>``..``</think>``), tool-call tokens
(the tool-call section), tool-output tokens (rendered tool messages), final-message tokens (content
of the last turn), tool calls, turns.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Sequence

from c2jax.agent.chat import AgentContext
from c2jax.agent.policies import Generation, Policy, TurnRequest
from c2jax.agent.tools import ToolConfig, Toolbox, format_todos
from c2jax.data.chat_format import ChatFormat, Message
from c2jax.envs.errors import SandboxError
from c2jax.trajectory import Effort, ToolEvent, Trajectory

DEFAULT_SYSTEM = (
    "You are a coding agent working in a repository at /workspace. Use the tools to read, search, edit "
    "and run code. Make the smallest correct change, run the relevant tests, and finish with a short "
    "summary of what you changed when the task is done.")
SUMMARY_REQUEST = (
    "Your context is full. Summarise the work so far for yourself: the task, what you found (files, "
    "functions, causes), what you changed, what remains and the next step. Be concise; do not call tools.")
SUMMARY_HEADER = "[Context summary: the earlier context was summarised {n} time(s). Summary of the work so far:]\n"


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    system_prompt: str = DEFAULT_SYSTEM
    tools: ToolConfig = ToolConfig()
    max_turns: int = 50
    max_policy_tokens: int = 65536
    max_new_tokens: int = 4096
    max_context_tokens: int | None = None
    max_wall_s: float = 3600.0
    summary_trigger_tokens: int | None = None  # None: no self-summarisation
    summary_max_new_tokens: int = 1024
    max_summaries: int = 16
    summary_request: str = SUMMARY_REQUEST

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_turns", "max_policy_tokens", "max_new_tokens", "summary_max_new_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.max_wall_s <= 0:
            problems.append("max_wall_s must be > 0")
        if self.summary_trigger_tokens is not None and self.summary_trigger_tokens < 1:
            problems.append("summary_trigger_tokens must be >= 1 or None")
        if problems:
            raise ValueError("invalid HarnessConfig: " + "; ".join(problems))


def post_summary_messages(system: str, task_prompt: str, summary: str, todos: Sequence[dict],
                          n_summaries: int) -> list[Message]:
    """The exact context generation restarts from after a summary (see the module docstring)."""
    text = SUMMARY_HEADER.format(n=n_summaries) + summary.strip()
    text += ("\n\nOpen to-dos:\n" + format_todos(todos)) if todos else "\n\nOpen to-dos: none"
    return [Message("system", system), Message("user", task_prompt), Message("user", text)]


@dataclasses.dataclass
class Episode:
    trajectory: Trajectory
    messages: list[list[dict]]  # canonical OpenAI messages, one list per context
    events: list[dict]
    stop_reason: str  # finished | max_turns | max_policy_tokens | max_wall_s | context | length | policy_error | infra
    diff: str | None = None
    final_message: str = ""

    @property
    def finished(self) -> bool:
        return self.stop_reason == "finished"


class _Run:
    """State of one episode."""

    def __init__(self, harness: "Harness", policy: Policy, sandbox: Any, prompt: str, sample_id: str = "") -> None:
        self.h, self.policy, self.sb, self.prompt = harness, policy, sandbox, prompt
        self.sample_id = sample_id
        self.cfg = harness.config
        self.box = Toolbox(sandbox, self.cfg.tools)
        self.tools = self.box.schemas()
        self.t0 = time.monotonic()
        self.events: list[dict] = []
        self.tool_events: list[ToolEvent] = []
        self.effort = Effort()
        self.contexts: list[AgentContext] = []
        self.policy_tokens = 0
        self.turns = 0
        self.summaries = 0
        self.trainable = True
        self.final_message = ""
        self.new_context([Message("system", self.cfg.system_prompt), Message("user", prompt)])

    def new_context(self, msgs: list[Message]) -> AgentContext:
        ctx = AgentContext(self.h.fmt, None, self.tools)
        for m in msgs:
            ctx.add(m)
        self.contexts.append(ctx)
        return ctx

    @property
    def ctx(self) -> AgentContext:
        return self.contexts[-1]

    def event(self, kind: str, t_start: float, **kw: Any) -> None:
        self.events.append({"type": kind, "t": round(t_start - self.t0, 6),
                            "duration_s": round(time.monotonic() - t_start, 6), **kw})

    def request(self, max_new: int, purpose: str) -> TurnRequest:
        return TurnRequest(prompt_ids=self.ctx.prompt_ids(), messages=self.ctx.openai_messages(), tools=self.tools,
                           max_new_tokens=max_new, turn=self.turns, purpose=purpose,
                           sample_id=self.sample_id)

    def record(self, gen: Generation, purpose: str, t_start: float):
        """Append a generation to the context; returns the parsed message."""
        message = None
        if gen.ids is None:  # a message-only endpoint: render it (evaluation only), keep its call ids
            message = gen.message if gen.message is not None else Message("assistant", "")
            gen = dataclasses.replace(gen, ids=self.h.fmt.assistant_body(message), logprobs=None, versions=None,
                                      trainable=False)
        self.trainable &= gen.trainable
        parsed = self.ctx.add_generation(gen.ids, gen.logprobs, gen.raw_logprobs, gen.versions, gen.routes,
                                         train=gen.trainable, message=message)
        n = len(gen.ids)
        self.policy_tokens += n
        self.turns += 1
        counts = token_counts(self.h.fmt, gen.ids)
        self.effort.thinking_tokens += counts["thinking"]
        self.effort.tool_call_tokens += counts["tool_call"]
        self.event("generate", t_start, purpose=purpose, tokens=n, segment=len(self.contexts) - 1,
                   finish_reason=gen.finish_reason, tool_calls=len(parsed.tool_calls), parse_errors=parsed.errors)
        return parsed, counts

    def budget_stop(self) -> str | None:
        if self.turns >= self.cfg.max_turns:
            return "max_turns"
        if self.policy_tokens >= self.cfg.max_policy_tokens:
            return "max_policy_tokens"
        if time.monotonic() - self.t0 >= self.cfg.max_wall_s:
            return "max_wall_s"
        return None

    @property
    def max_context(self) -> int | None:
        """The smaller of the configured context budget and the policy's own context length."""
        caps = [c for c in (self.cfg.max_context_tokens, getattr(self.policy, "max_context_tokens", None)) if c]
        return min(caps) if caps else None

    def room(self, want: int) -> int:
        """New tokens allowed for the next generation (0: it does not fit)."""
        n = min(want, self.cfg.max_policy_tokens - self.policy_tokens)
        if self.max_context is not None:
            n = min(n, self.max_context - len(self.ctx.prompt_ids()))
        return max(n, 0)

    def needs_summary(self) -> bool:
        c = self.cfg
        if c.summary_trigger_tokens is None or self.summaries >= c.max_summaries:
            return False
        if self.summaries and self.ctx.generations == 0:
            return False  # a fresh post-summary context: act at least once before summarising again
        n = len(self.ctx.prompt_ids())
        cap = self.max_context
        return n >= c.summary_trigger_tokens or (cap is not None and n + min(c.max_new_tokens, 256) > cap)

    async def summarize(self) -> str | None:
        """Ask for a summary and restart the context from it; returns a stop reason or None."""
        t = time.monotonic()
        self.ctx.add(Message("user", self.cfg.summary_request))
        max_new = self.room(self.cfg.summary_max_new_tokens)
        if max_new < 1:
            return "context"
        gen = await self.policy.agenerate(self.request(max_new, "summarize"))
        if gen.finish_reason == "error":
            self.event("policy_error", t, error=gen.info.get("error"))
            return "policy_error"
        parsed, _ = self.record(gen, "summarize", t)
        self.summaries += 1
        todos = self.box.open_todos()
        self.new_context(post_summary_messages(self.cfg.system_prompt, self.prompt, parsed.content, todos,
                                               self.summaries))
        self.event("summary", t, n=self.summaries, summary_tokens=len(gen.ids or []), ignored_tool_calls=len(
            parsed.tool_calls), context_tokens=len(self.ctx.prompt_ids()))
        return None

    async def run_tools(self, parsed) -> None:
        fmt = self.h.fmt
        seg = len(self.contexts) - 1
        if not parsed.tool_calls and parsed.errors:  # a broken tool-call section with no call in it
            t = time.monotonic()
            text = "Error: your tool call could not be parsed: " + "; ".join(parsed.errors)[:1000]
            before = len(self.ctx)
            self.ctx.add(Message("user", text))
            out = len(self.ctx) - before
            self.tool_events.append(ToolEvent(name="", ok=False, malformed=True, error="parse_error", turn=self.turns - 1,
                                              segment=seg, output_tokens=out))
            self.effort.tool_calls += 1
            self.effort.tool_output_tokens += out
            self.event("tool", t, name="", malformed=True, error="parse_error")
            return
        for call in parsed.tool_calls:
            t = time.monotonic()
            res = await asyncio.to_thread(self.box.call, call.name, call.arguments)  # runs in a worker thread
            before = len(self.ctx)
            self.ctx.add(Message("tool", res.content, tool_call_id=call.id))
            out = len(self.ctx) - before
            call_tokens = len(fmt.tok.encode(call.id)) + len(fmt.tok.encode(call.arguments)) + 3
            self.tool_events.append(ToolEvent(name=call.name if isinstance(call.name, str) else "", ok=res.ok,
                                              malformed=res.malformed, error=res.error, turn=self.turns - 1,
                                              segment=seg, call_tokens=call_tokens, output_tokens=out))
            self.effort.tool_calls += 1
            self.effort.tool_output_tokens += out
            self.event("tool", t, name=call.name, id=call.id, ok=res.ok, malformed=res.malformed, error=res.error,
                       output_tokens=out)

    async def loop(self) -> str:
        while True:
            stop = self.budget_stop()
            if stop:
                return stop
            if self.needs_summary():
                stop = await self.summarize()
                if stop:
                    return stop
                continue
            max_new = self.room(self.cfg.max_new_tokens)
            if max_new < 1:
                return "max_policy_tokens" if self.policy_tokens >= self.cfg.max_policy_tokens else "context"
            t = time.monotonic()
            gen = await self.policy.agenerate(self.request(max_new, "act"))
            if gen.finish_reason == "error":
                self.event("policy_error", t, error=gen.info.get("error"))
                return "policy_error"
            parsed, counts = self.record(gen, "act", t)
            if not parsed.tool_calls and not (parsed.errors and counts["tool_call"]):
                self.final_message = parsed.content
                self.effort.final_message_tokens += counts["content"]
                return "finished" if parsed.finished else "length"
            await self.run_tools(parsed)

    def trajectory(self, task_id: str, group_id: str, sample_id: str, stop: str, infra: bool) -> Trajectory:
        segs = [s for s in (c.segment() for c in self.contexts) if s is not None]
        self.effort.turns = self.turns
        return Trajectory(
            segments=segs, task_id=task_id, group_id=group_id, effort=self.effort, tool_events=self.tool_events,
            infra_failed=infra or not segs, truncated=stop not in ("finished",) and not infra, sample_id=sample_id,
            metadata={"stop_reason": stop, "events": self.events, "summaries": self.summaries,
                      "trainable": self.trainable, "policy": getattr(self.policy, "name", ""),
                      "wall_s": round(time.monotonic() - self.t0, 6)})


def token_counts(fmt: ChatFormat, ids: Sequence[int]) -> dict[str, int]:
    """Split one generation's ids into thinking / tool-call section / content / stop tokens."""
    ids = list(ids)
    thinking = tool_call = 0
    if ids and ids[0] == fmt.think_begin:
        thinking = (ids.index(fmt.think_end) + 1) if fmt.think_end in ids else len(ids)
    if fmt.calls_begin in ids[thinking:]:
        s = ids.index(fmt.calls_begin, thinking)
        e = ids.index(fmt.calls_end, s) + 1 if fmt.calls_end in ids[s:] else len(ids)
        tool_call = e - s
    stop = 1 if ids and ids[-1] == fmt.im_end else 0
    return {"thinking": thinking, "tool_call": tool_call, "content": max(len(ids) - thinking - tool_call - stop, 0),
            "stop": stop}


class Harness:
    """Runs episodes of a policy in sandboxes (see the module docstring)."""

    def __init__(self, fmt: ChatFormat, config: HarnessConfig | None = None) -> None:
        self.fmt = fmt
        self.config = config or HarnessConfig()

    async def arun(self, policy: Policy, sandbox: Any, prompt: str, *, task_id: str = "task",
                   group_id: str | None = None, sample_id: str = "", diff: bool = True) -> Episode:
        run = _Run(self, policy, sandbox, prompt, sample_id)
        infra = False
        try:
            stop = await run.loop()
        except SandboxError as e:
            run.event("infra_error", time.monotonic(), error=f"{type(e).__name__}: {e}")
            stop, infra = "infra", True
        finally:
            await asyncio.to_thread(run.box.close)
        run.event("stop", time.monotonic(), reason=stop)
        patch = None
        if diff and not infra:
            try:
                patch = await asyncio.to_thread(sandbox.diff)
            except SandboxError as e:
                run.event("infra_error", time.monotonic(), error=f"diff: {e}")
                infra, stop = True, "infra"
        traj = run.trajectory(task_id, group_id or task_id, sample_id, stop, infra)
        return Episode(traj, [c.openai_messages() for c in run.contexts], run.events, stop, patch, run.final_message)

    def run(self, policy: Policy, sandbox: Any, prompt: str, **kw: Any) -> Episode:
        """Synchronous `arun` (not from inside a running event loop)."""
        return asyncio.run(self.arun(policy, sandbox, prompt, **kw))

    async def arun_many(self, policy: Policy, pool: Any, jobs: Sequence[tuple[str, str, str]],
                        samples: int = 1, diff: bool = True, **lease_kw: Any) -> list[Episode]:
        """Run (env_id, prompt, task_id) jobs x `samples` concurrently; the pool bounds how many
        sandboxes run at once (its queue blocks the rest). Results in job order."""

        async def one(env_id: str, prompt: str, task_id: str, k: int) -> Episode:
            lease = await asyncio.to_thread(pool.acquire, env_id, None, **lease_kw)
            try:
                return await self.arun(policy, lease, prompt, task_id=task_id, group_id=task_id,
                                       sample_id=f"{task_id}#{k}", diff=diff)
            finally:
                await asyncio.to_thread(lease.close)

        return list(await asyncio.gather(*(one(e, p, t, k) for e, p, t in jobs for k in range(samples))))
