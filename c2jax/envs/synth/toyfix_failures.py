"""Where `shell_locate` episodes go wrong: each transcript of `bench run --transcripts` gets one step.

    python -m c2jax.envs.synth.toyfix_failures runs/a/transcripts.jsonl [runs/b/transcripts.jsonl ...]

The `shell_locate` protocol (`toyfix_shell_demos`) is grep the operator lines -> grep -nF the operator
to change -> sed that line by the number just printed -> print it -> finish. A failed episode is
assigned the first step that went wrong:

    malformed          fewer than three tool calls, or one of the first three not parseable
    no_grep_op         the second call is not `grep -nF [-e] '<op>' ...`
    op_not_listed      the operator it greps is not in the first grep's output (a prior, not a read)
    sed_malformed      the third call is not `sed -i '<N>s/...`
    line_not_copied    the sed line N is not a line number the second grep printed
    sed_no_match       N was copied but the substitution matched nothing (empty diff)
    wrong_edit         a diff, but not the fix (the hidden tests fail)
    resolved           the hidden tests pass

For `line_not_copied` it also counts where N came from (a line of the first listing, or neither
listing) and which numbers were written against which were printed, the measurement that located
RL's held-out loss on the quickstart (docs/rl_experiments.md, "where RL's held-out loss is").
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Any, Iterable, Sequence

STEPS = ("resolved", "malformed", "no_grep_op", "op_not_listed", "sed_malformed", "line_not_copied",
         "sed_no_match", "wrong_edit")
_GREP_OP = re.compile(r"grep -nF (?:-e )?'(.*?)' ")  # demos add -e before a pattern that starts with -
_SED = re.compile(r"sed -i '(\d+)s/")
_LINE_NO = re.compile(r"^(\d+):", re.M)


def tool_steps(messages: Sequence[dict[str, Any]]) -> tuple[list[str | None], list[str]]:
    """(commands of the run_terminal_cmd calls in order, None where the arguments do not parse; the
    tool outputs in order) of one context's OpenAI-shaped messages."""
    calls: list[str | None] = []
    outputs: list[str] = []
    for m in messages:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                try:
                    cmd = json.loads(tc["function"]["arguments"]).get("command")
                    calls.append(cmd if isinstance(cmd, str) else None)
                except (KeyError, TypeError, ValueError, AttributeError):
                    calls.append(None)
        elif m.get("role") == "tool":
            outputs.append(str(m.get("content") or ""))
    return calls, outputs


def classify(record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(step, details) of one transcript line (`bench run --transcripts`)."""
    if record.get("resolved"):
        return "resolved", {}
    calls, outs = tool_steps(record["messages"][0] if record.get("messages") else [])
    if len(calls) < 3 or any(c is None for c in calls[:3]) or len(outs) < 2:
        return "malformed", {}
    m = _GREP_OP.match(calls[1])
    if not m:
        return "no_grep_op", {}
    if m.group(1) not in outs[0]:
        return "op_not_listed", {"op": m.group(1)}
    s = _SED.match(calls[2])
    if not s:
        return "sed_malformed", {}
    listed, printed = _LINE_NO.findall(outs[0]), _LINE_NO.findall(outs[1])
    if s.group(1) not in printed:
        src = "first_listing" if s.group(1) in listed else "neither"
        return "line_not_copied", {"written": s.group(1), "printed": ",".join(printed), "source": src}
    if record.get("diff"):
        return "wrong_edit", {}
    return "sed_no_match", {}


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts per step, and for `line_not_copied` the source of the number and the numbers written /
    printed (most common first)."""
    steps: collections.Counter = collections.Counter()
    source: collections.Counter = collections.Counter()
    written: collections.Counter = collections.Counter()
    printed: collections.Counter = collections.Counter()
    for r in records:
        step, d = classify(r)
        steps[step] += 1
        if step == "line_not_copied":
            source[d["source"]] += 1
            written[d["written"]] += 1
            printed[d["printed"] or "-"] += 1
    n = sum(steps.values())
    return {"samples": n, "steps": {k: steps.get(k, 0) for k in STEPS},
            "line_not_copied": {"source": dict(source), "written": dict(written.most_common()),
                                "printed": dict(printed.most_common())}}


def load(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def format_table(summaries: dict[str, dict[str, Any]]) -> str:
    names = list(summaries)
    rows = [["step"] + names]
    for k in STEPS:
        rows.append([k] + [f"{s['steps'][k]} ({s['steps'][k] / max(s['samples'], 1):.1%})"
                           for s in summaries.values()])
    rows.append(["samples"] + [str(s["samples"]) for s in summaries.values()])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for name, s in summaries.items():
        lc = s["line_not_copied"]
        lines.append(f"{name}: line_not_copied source {lc['source']}; written {lc['written']}; "
                     f"printed {dict(list(lc['printed'].items())[:8])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("transcripts", nargs="+", help="transcripts.jsonl of `python -m c2jax.bench run --transcripts`")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    a = ap.parse_args(argv)
    summaries = {p: summarize(load(p)) for p in a.transcripts}
    print(json.dumps(summaries, indent=1) if a.json else format_table(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
