"""Property test: no model output, however malformed, makes an exception escape the tool-call parser
and argument checker; every malformed call becomes an error message (derandomised, >= 10,000 inputs).

Inputs mix (1) random id sequences biased towards the chat template's special tokens, (2) tool-call
sections with random headers, missing/duplicated markers and arbitrary argument text, and (3) calls
to real tools with schema-valid arguments or one mutation (missing required key, wrong type,
not an object, truncated JSON). For (3) the verdict is checked against the generator's intent.
A second test drives whole harness episodes in a real sandbox with such turns.
"""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _agent_common import chat_format, needs_bwrap  # noqa: F401
from c2jax.agent.tools import SCHEMAS, TOOL_NAMES, validate_call

FMT = chat_format()
SPECIALS = [FMT.im_end, FMT.calls_begin, FMT.calls_end, FMT.call_begin, FMT.call_arg, FMT.call_end,
            FMT.think_begin, FMT.think_end, FMT.im_middle, FMT.im_user, FMT.im_system, FMT.im_assistant, 0, 1, 2]
V = FMT.tok.vocab_size

def enc(s: str) -> list[int]:
    return FMT.tok.encode(s)


# Cheap generation (one bytes draw per example, interpreted below): hypothesis' per-draw overhead,
# not the parser, would otherwise dominate 10,000 examples.
_PIECES = [enc(x) for x in ["", " ", "text", "{", "}", '{"', '":', "functions", ".", ":", "0", "\\", '"', "\n",
                             "null", "[1,", "]", "functions.read_file:0", "functions.grep:1", "read_file",
                             "functions.nope:2", "functions.:3", "functions.run_terminal_cmd:x", "\u00e9\u4e2d"]]
_ARGS = [enc(x) for x in ['{"target_file": "a.py"}', '{"target_file": 3}', '{"target_file": "a.py"', "{}", "[]",
                           '"str"', "null", '{"pattern": "("}', '{"command": "ls", "timeout": "5"}', "{" * 50,
                           '{"todos": [{"id": 1}], "merge": "yes"}', '{"a": {"b": [1, {"c": null}]}}', "",
                           '{"target_file": "x", "offset": -1}', '{"target_file": "x", "limit": 1e309}']]


@st.composite
def random_ids(draw):
    """Any ids, biased towards the template's special tokens (one draw: bytes -> ids)."""
    raw = draw(st.binary(max_size=96))
    return [SPECIALS[raw[i + 1] % len(SPECIALS)] if raw[i] < 96 else (raw[i] * 256 + raw[i + 1]) % V
            for i in range(0, len(raw) - 1, 2)]


@st.composite
def broken_section(draw):
    """Tool-call sections assembled from markers, headers, argument texts and junk (one draw)."""
    prog = draw(st.binary(min_size=1, max_size=40))
    marks = [FMT.calls_begin, FMT.call_begin, FMT.call_arg, FMT.call_end, FMT.calls_end, FMT.im_end,
             FMT.think_begin, FMT.think_end]
    ids = [FMT.calls_begin] if prog[0] % 4 else []
    for b in prog[1:]:
        kind = b % 4
        if kind == 0:
            ids.append(marks[(b >> 2) % len(marks)])
        elif kind == 1:
            ids += _PIECES[(b >> 2) % len(_PIECES)]
        elif kind == 2:
            ids += _ARGS[(b >> 2) % len(_ARGS)]
        else:  # a well-formed call, so sections often mix good and bad calls
            ids += [FMT.call_begin, *_PIECES[17 + (b >> 2) % 2], FMT.call_arg, *_ARGS[(b >> 3) % len(_ARGS)],
                    FMT.call_end]
    return ids


def _value_for(schema: dict, draw):
    t = schema.get("type")
    if "enum" in schema:
        return draw(st.sampled_from(schema["enum"]))
    if t == "string":
        return draw(st.text(max_size=12))
    if t == "integer":
        return draw(st.integers(schema.get("minimum", -5), 10**6))
    if t == "number":
        return draw(st.floats(0.001, 1e4))
    if t == "boolean":
        return draw(st.booleans())
    if t == "array":
        return [_value_for(schema["items"], draw) for _ in range(draw(st.integers(0, 2)))]
    if t == "object":
        return {k: _value_for(v, draw) for k, v in schema["properties"].items()
                if k in schema.get("required", ()) or draw(st.booleans())}
    raise AssertionError(schema)


WRONG = {"string": 5, "integer": "many", "number": "x", "boolean": "maybe", "array": "notalist", "object": 7}


@st.composite
def real_call(draw):
    """(ids of one call to a real tool, expected malformed?)"""
    name = draw(st.sampled_from(list(TOOL_NAMES)))
    schema = SCHEMAS[name]["parameters"]
    args = _value_for(schema, draw)
    mutation = draw(st.sampled_from(["none", "none", "drop", "type", "not_object", "truncate"]))
    bad = True
    text = json.dumps(args)
    req = list(schema.get("required", ()))
    if mutation == "drop" and req:
        args.pop(draw(st.sampled_from(req)))
        text = json.dumps(args)
    elif mutation == "type" and args:
        k = draw(st.sampled_from(sorted(args)))
        args[k] = WRONG[schema["properties"][k]["type"]]
        text = json.dumps(args)
    elif mutation == "not_object":
        text = json.dumps(list(args.values()))
    elif mutation == "truncate" and len(text) > 2:
        text = text[:-1]
    else:
        bad = False
    ids = [FMT.calls_begin, FMT.call_begin, *enc(f"functions.{name}:0"), FMT.call_arg, *enc(text), FMT.call_end,
           FMT.calls_end, FMT.im_end]
    return ids, (name, args, bad)


completions = st.one_of(random_ids().map(lambda x: (x, None)), broken_section().map(lambda x: (x, None)), real_call())


def test_no_exception_escapes_the_parser_10k():
    seen = {"n": 0, "malformed": 0, "checked": 0}

    @settings(max_examples=10_000, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(completions)
    def prop(case):
        ids, expect = case
        seen["n"] += 1
        parsed = FMT.parse_assistant(ids)  # must not raise
        assert isinstance(parsed.errors, list)
        for c in parsed.tool_calls:
            args, bad = validate_call(c.name, c.arguments, TOOL_NAMES, strict=False)  # must not raise
            assert (args is None) == (bad is not None)
            if bad is not None:
                assert bad.malformed and not bad.ok and bad.content.startswith("Error:")
                seen["malformed"] += 1
            validate_call(c.name, c.arguments, TOOL_NAMES, strict=True)
        if expect is not None:
            name, args, should_fail = expect
            assert len(parsed.tool_calls) == 1 and parsed.tool_calls[0].name == name
            assert all("not valid JSON" in e for e in parsed.errors)  # the parser flags bad JSON too
            got, bad = validate_call(name, parsed.tool_calls[0].arguments, TOOL_NAMES, strict=True)
            assert (bad is not None) == should_fail, (name, parsed.tool_calls[0].arguments, bad)
            if not should_fail:
                assert got == args
            seen["checked"] += 1

    prop()
    assert seen["n"] >= 10_000
    assert seen["malformed"] > 1000 and seen["checked"] > 1000  # the mix really exercises both paths


@needs_bwrap
def test_malformed_turns_through_the_whole_harness(repo_env):
    """Random broken turns drive real episodes (one sandbox): the loop never raises, every malformed
    call is answered and counted, and the episode ends on the scripted final message."""
    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.policies import ScriptedPolicy
    from c2jax.envs import start

    h = Harness(FMT, HarnessConfig(max_turns=4, max_new_tokens=256))
    with start(repo_env[1]) as sb:
        @settings(max_examples=40, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(st.one_of(broken_section(), random_ids()), min_size=1, max_size=3))
        def prop(turns):
            pol = ScriptedPolicy(FMT, [t + [FMT.im_end] if FMT.calls_begin in t else t for t in turns])
            ep = h.run(pol, sb, "do something", task_id="fuzz")
            t = ep.trajectory
            assert not t.infra_failed and ep.stop_reason in ("finished", "length", "max_turns")
            assert t.effort.tool_calls == len(t.tool_events)
            for e in t.tool_events:
                assert e.malformed or e.name in TOOL_NAMES

        prop()
