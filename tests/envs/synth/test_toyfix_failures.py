"""`toyfix_failures.classify`: each failed `shell_locate` transcript gets the first step that went wrong.

Transcripts are built in the shape `bench run --transcripts` writes (the harness's OpenAI-shaped
messages: assistant tool calls with JSON arguments, tool outputs as `tool` messages).
"""
from __future__ import annotations

import json

import pytest

from c2jax.envs.synth.toyfix_failures import STEPS, classify, main, summarize

GLOB = "*/[!_]*.py"
LISTING = "4:        if e != 'n':\n5:            out += 1\nExit code: 0"


def _episode(calls, outputs, resolved=False, diff=""):
    msgs = [{"role": "system", "content": "Fix bugs."}, {"role": "user", "content": "In `a/b.py` ..."}]
    for i, c in enumerate(calls):
        args = c if isinstance(c, str) and c.startswith("{bad") else json.dumps({"command": c})
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "run_terminal_cmd", "arguments": args}}]})
        if i < len(outputs):
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": outputs[i]})
    msgs.append({"role": "assistant", "content": "Fixed line 5."})
    return {"instance_id": "t", "sample": 0, "resolved": resolved, "diff": diff, "messages": [msgs]}


def _protocol(op=" += ", printed="5:            out += 1\nExit code: 0", line=5, diff=""):
    calls = [f"grep -nE ' ([-+*/%<>]|//|[-+*/<>=!]=) ' {GLOB}", f"grep -nF '{op}' {GLOB}",
             f"sed -i '{line}s/+=/-=/' {GLOB}", f"sed -n '{line}p' {GLOB}"]
    return _episode(calls, [LISTING, printed, "Exit code: 0", "x\nExit code: 0"], diff=diff)


@pytest.mark.parametrize("record, step", [
    (_protocol(diff="-out += 1\n+out -= 1"), "wrong_edit"),
    (_protocol(), "sed_no_match"),
    (_protocol(op=" >= ", printed="Exit code: 1"), "op_not_listed"),
    (_episode([f"grep -nE . {GLOB}", f"grep -nF -e '-= ' {GLOB}", f"sed -i '6s/-=/+=/' {GLOB}"],
              ["6:    out -= 1\nExit code: 0", "6:    out -= 1\nExit code: 0", ""]), "sed_no_match"),
    (_protocol(line=7), "line_not_copied"),
    (_episode([f"grep -nE . {GLOB}", f"grep -nF ' += ' {GLOB}"], [LISTING, "5: x"]), "malformed"),
    (_episode([f"grep -nE . {GLOB}", "{bad json", f"sed -n '5p' {GLOB}"], [LISTING, "err", "x"]), "malformed"),
    (_episode([f"grep -nE . {GLOB}", f"cat {GLOB}", f"sed -i '5s/+/-/' {GLOB}"], [LISTING, "x", ""]), "no_grep_op"),
    (_episode([f"grep -nE . {GLOB}", f"grep -nF ' += ' {GLOB}", f"sed -n '5p' {GLOB}"], [LISTING, "5: x", ""]),
     "sed_malformed"),
])
def test_each_failure_gets_its_first_wrong_step(record, step):
    assert classify(record)[0] == step
    record = dict(record, resolved=True)
    assert classify(record)[0] == "resolved"  # the grader's verdict wins over the transcript


def test_line_not_copied_details_and_summary(capsys):
    from_listing = _protocol(line=4)  # 4 is a line of the first listing, not of the second grep's output
    nowhere = _protocol(line=7)
    assert classify(from_listing)[1] == {"written": "4", "printed": "5", "source": "first_listing"}
    assert classify(nowhere)[1]["source"] == "neither"
    s = summarize([from_listing, nowhere, _protocol(), _protocol(diff="d")])
    assert s["samples"] == 4 and set(s["steps"]) == set(STEPS)
    assert s["steps"]["line_not_copied"] == 2 and s["steps"]["sed_no_match"] == 1 and s["steps"]["wrong_edit"] == 1
    assert s["line_not_copied"] == {"source": {"first_listing": 1, "neither": 1}, "written": {"4": 1, "7": 1},
                                    "printed": {"5": 2}}


def test_cli_prints_a_table(tmp_path, capsys):
    p = tmp_path / "transcripts.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (_protocol(line=7), _protocol())) + "\n")
    assert main([str(p)]) == 0
    out = capsys.readouterr().out
    assert "line_not_copied  1 (50.0%)" in out and "sed_no_match     1 (50.0%)" in out
