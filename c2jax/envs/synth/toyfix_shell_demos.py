"""Shell-style scripted demonstrations for toyfix: edits by line number, no names to copy.

The `read_replace` demonstrations (`toyfix.demo_messages`) read the module named in the statement and
`search_replace` the buggy line: the policy must copy the module path and the whole buggy line, names
included, and a tiny model trained on CPU does not learn that copying (measured: held-out pass@1 0.00).
This style does the same work with what a tiny model can copy, digits and operators:

    run_terminal_cmd  grep -n . */[!_]*.py                 explore: the module, lines numbered
    run_terminal_cmd  sed -i '5s/ - / + /' */[!_]*.py      edit: line 5, the smallest unique change
    run_terminal_cmd  sed -n '5p' */[!_]*.py               check: show the edited line
    final message     Fixed line 5.

The glob names the package's single non-dunder module, so it holds at difficulties 0 and 1 only (one
module); `shell_demo_messages` refuses other tasks.

Three styles differ in the explore / locate steps only:
- `shell_lines` lists every line (`grep -n .`): the policy must find the buggy line among all of them
  and copy its number from the middle of the listing (two hops: the operator, then its line's number).
- `shell_ops` lists the lines holding a binary operator (`grep -nE` with `OPS_REGEX`): at difficulty 0
  one or two lines, the buggy one always among them, its number at the start of its output line. The
  policy still reads the code (the number and the operator come from the tool output only) but copies
  from a short listing. Measured on the tiny CPU model: see README, "the task family's difficulty".
- `shell_locate` splits that read in two one-hop steps: the operator grep, then `grep -nF ' - '` for
  the operator it will change, whose output starts with the line number the sed copies (the
  first token of the last tool output, not a number four tokens before an operator in a listing):

    run_terminal_cmd  grep -nE ' ([-+*/%<>]|//|[-+*/<>=!]=) ' */[!_]*.py    the operator lines
    run_terminal_cmd  grep -nF ' - ' */[!_]*.py                              the line(s) with ` - `
    run_terminal_cmd  sed -i '5s/-/+/' */[!_]*.py                            edit (number copied)
    run_terminal_cmd  sed -n '5p' */[!_]*.py                                  check
- `shell_locate_qf` is `shell_locate` with quote-free spans: where the leftward span needs a single
  quote (a repeated operator after a string literal, `s + '#' + 3` -> `s + '#' * 3`: `'#' +`), the
  span widens rightward instead (`s/+ 3/* 3/`), so those tasks get demonstrations too;
  `shell_locate` skips them.

- `shell_locate_nth` is `shell_locate` whose edit, where the leftward span needs a quote, substitutes
  the changed span's Nth occurrence on the line (sed's numeric flag) instead of widening it:
  `s + '#' + 3` -> `s + '#' * 3` is `s/+/*/2`, with no quote and no constant to copy (`shell_locate_qf`'s
  `s/+ 3/* 3/` copies the held-out constant `3`, a copy the tiny model does not make on unseen constants).
  Every other edit is `shell_locate`'s.

- `shell_retry` (tasks built with `repro=True`) is a search that knows no fix: the explore step also
  saves the workspace, each attempt is `shell_locate_qf`'s grep and sed with the task's repro.py run
  in the same call, and a failed check restores the workspace before the next attempt; edits are tried
  in the order of the fixes most frequent on the training tasks (`change_prior`, `search_order`), at
  most `MAX_ATTEMPTS`, and a task the search does not solve within them is not demonstrated:

    run_terminal_cmd  cp -r . /tmp/base && grep -nE '<ops>' */[!_]*.py
    run_terminal_cmd  grep -nF ' + ' */[!_]*.py
    run_terminal_cmd  sed -i '3s/+/*/' */[!_]*.py && python repro.py     -> got 4, want 20, exit 1
    run_terminal_cmd  cp -r /tmp/base/. . && grep -nF ' - ' */[!_]*.py
    run_terminal_cmd  sed -i '5s/-/+/' */[!_]*.py && python repro.py     -> ok
    final message     Fixed line 5.

 The edit is the smallest span around the first difference
between the buggy and the fixed line, widened to whole words until its first occurrence in the line is
the one to change, so the sed substitution (first match on that line) reproduces the gold line exactly.

    from c2jax.envs.synth.toyfix_shell_demos import shell_demo_messages, sed_edit
    sed_edit("    return x - y", "    return x + y")      # -> "s/ - / + /"
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from typing import Any, NamedTuple, Sequence

from c2jax.envs.synth.toyfix_programs import OPERATOR_SWAPS, REPRO_OK, REPRO_PATH, run_repro

MODULE_GLOB = "*/[!_]*.py"  # the package's only module at difficulties 0-1 (not __init__.py)
# A binary operator between spaces: arithmetic, comparison, augmented assignment (not `=` alone, not a
# unary minus). GNU grep extended syntax, single-quoted in the command.
OPS_REGEX = " ([-+*/%<>]|//|[-+*/<>=!]=) "
STYLES = ("shell_lines", "shell_ops", "shell_locate", "shell_locate_qf", "shell_locate_nth", "shell_retry",
          "shell_retry_addr")
_EXPLORE = {"shell_lines": f"grep -n . {MODULE_GLOB}", "shell_ops": f"grep -nE '{OPS_REGEX}' {MODULE_GLOB}",
            "shell_locate": f"grep -nE '{OPS_REGEX}' {MODULE_GLOB}"}
_EXPLORE["shell_locate_qf"] = _EXPLORE["shell_locate_nth"] = _EXPLORE["shell_locate"]
_LOCATE = ("shell_locate", "shell_locate_qf", "shell_locate_nth", "shell_retry",
           "shell_retry_addr")  # the styles with the fixed-string operator grep
NTH_STYLES = ("shell_locate_nth",)  # substitute the span's Nth occurrence where the leftward span needs a quote
_QUOTE_FREE = ("shell_locate_qf", "shell_retry", "shell_retry_addr")  # widen the sed span rightward where the leftward one needs a quote
_BRE_SPECIAL = re.compile(r"([\\.*\[\]^$/])")
_REPL_SPECIAL = re.compile(r"([\\&/])")


def _escape_pattern(s: str) -> str:
    """A literal string as a sed basic regular expression (GNU sed: `+ ? ( ) { } |` are literal)."""
    return _BRE_SPECIAL.sub(r"\\\1", s)


def _escape_replacement(s: str) -> str:
    return _REPL_SPECIAL.sub(r"\\\1", s)


def _widen(line: str, lo: int, hi: int) -> tuple[int, int]:
    """Widen [lo, hi) to whole words: to the previous / next space (or the line's ends)."""
    while lo > 0 and line[lo - 1] != " ":
        lo -= 1
    while hi < len(line) and line[hi] != " ":
        hi += 1
    return lo, hi


def _nth_occurrence(line: str, pat: str, at: int) -> int | None:
    """1-based N such that the Nth of `pat`'s non-overlapping left-to-right matches in `line` (the ones
    sed's `s/PAT/REP/N` counts) starts at `at`; None if no match starts there."""
    n, i = 0, line.find(pat)
    while i != -1 and i <= at:
        n += 1
        if i == at:
            return n
        i = line.find(pat, i + len(pat))
    return None


def sed_edit(old: str, new: str, quote_free: bool = False, nth: bool = False) -> str:
    """The sed substitution `s/PAT/REP/` turning line `old` into `new` with the smallest whole-word
    span whose first occurrence in `old` is the changed one, widened leftward. Raises ValueError if
    old == new, or if the span needs a single quote (it goes inside a single-quoted shell argument).

    ``quote_free=True``: where the leftward span needs a quote, widen rightward instead (whole words)
    until the first occurrence is the changed one: `s + '#' + 3` -> `s + '#' * 3` gives
    `s/+ 3/* 3/`, where leftward widening needs `'#' +`. Spans that need no quote are unchanged.

    ``nth=True``: where the leftward span needs a quote, the smallest whole-word span with sed's
    occurrence flag instead: `s + '#' + 3` -> `s + '#' * 3` gives `s/+/*/2` (no quote, no constant).
    Spans that need no quote are unchanged."""
    try:
        return _sed_edit_left(old, new)
    except ValueError as e:
        if not (quote_free or nth) or old == new:
            raise
        left_error = e
    lo, ho, hn = _word_span(old, new)
    if nth:
        pat, rep = old[lo:ho], new[lo:hn]
        n = _nth_occurrence(old, pat, lo) if pat else None
        if n is None or "'" in pat or "'" in rep:
            raise left_error
        return f"s/{_escape_pattern(pat)}/{_escape_replacement(rep)}/{n if n > 1 else ''}"
    while True:
        pat, rep = old[lo:ho], new[lo:hn]
        if pat and old.find(pat) == lo and "'" not in pat and "'" not in rep:
            return f"s/{_escape_pattern(pat)}/{_escape_replacement(rep)}/"
        if ho >= len(old) or "'" in pat or "'" in rep:
            raise left_error
        _, wider = _widen(old, lo, ho + 1)  # the separating space, then the next word
        ho, hn = wider, hn + wider - ho  # (the shared suffix: both lines alike)


def _word_span(old: str, new: str) -> tuple[int, int, int]:
    """(lo, ho, hn): old[lo:ho] -> new[lo:hn] is the changed region widened to whole words."""
    p = 0  # common prefix
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0  # common suffix (not overlapping the prefix)
    while s < min(len(old), len(new)) - p and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
        s += 1
    lo, ho, hn = p, len(old) - s, len(new) - s  # old[lo:ho] -> new[lo:hn]; old[:lo] == new[:lo]
    while lo > 0 and old[lo - 1] != " ":  # widen to whole words (the prefix is shared: same on both)
        lo -= 1
    while ho < len(old) and old[ho] != " ":  # (the suffix is shared: widen both ends alike)
        ho, hn = ho + 1, hn + 1
    return lo, ho, hn


def _sed_edit_left(old: str, new: str) -> str:
    """`sed_edit` with leftward widening only (the `shell_*` styles' edit)."""
    if old == new:
        raise ValueError("sed_edit: the lines are equal")
    lo, ho, hn = _word_span(old, new)
    while True:
        pat, rep = old[lo:ho], new[lo:hn]
        if pat and old.find(pat) == lo:
            break
        if lo == 0:
            raise ValueError(f"sed_edit: no unique span for {old!r} -> {new!r}")
        lo -= 1
        while lo > 0 and old[lo - 1] != " ":
            lo -= 1
    if "'" in pat or "'" in rep:
        raise ValueError(f"sed_edit: the span {pat!r} needs a single quote")
    return f"s/{_escape_pattern(pat)}/{_escape_replacement(rep)}/"


def applies(task: Any, style: str = "shell_lines") -> bool:
    """Whether `style` can demonstrate `task`: one module, one bug, a quote-free edit, and for
    `shell_ops` a buggy line that the operator grep lists."""
    if style not in STYLES:
        raise ValueError(f"shell demo style must be one of {STYLES}, got {style!r}")
    bugs = task.provenance.get("bugs", [])
    repo = task.provenance.get("repo", {})
    modules = [p for p in repo if "/" in p and not p.rsplit("/", 1)[-1].startswith("_")]  # (not repro.py)
    if len(bugs) != 1 or len(modules) != 1 or "line" not in _bug_line(task, bugs[0]):
        return False
    if style in ("shell_ops",) + _LOCATE and not re.search(OPS_REGEX, bugs[0]["old"]):
        return False
    if style in RETRY_STYLES and REPRO_PATH not in repo:
        return False
    try:
        sed_edit(bugs[0]["old"], bugs[0]["new"], quote_free=style in _QUOTE_FREE, nth=style in NTH_STYLES)
    except ValueError:
        return False
    return True


def locate_pattern(old: str, edit: str) -> str:
    """The fixed string `shell_locate` greps for: the sed pattern of `edit` (unescaped), with the spaces
    around it where the line has them (` - ` lists the lines holding that operator, not `->` or `-1`)."""
    m = re.fullmatch(r"s/((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/\d*", edit)
    if m is None:
        raise ValueError(f"not a sed_edit substitution: {edit!r}")
    pat = re.sub(r"\\(.)", r"\1", m.group(1))
    return f" {pat} " if f" {pat} " in old else pat


def _locate_grep(pat: str) -> str:
    """The fixed-string grep for `pat` (`-e` before a pattern that starts with `-`)."""
    return f"grep -nF {'-e ' if pat.startswith('-') else ''}'{pat}' {MODULE_GLOB}"


def operator_lines(source: str) -> list[int]:
    """1-based numbers of the lines `grep -nE OPS_REGEX` lists (Python `re` agrees with GNU ERE here)."""
    return [i + 1 for i, ln in enumerate(source.splitlines()) if re.search(OPS_REGEX, ln)]


def _bug_line(task: Any, bug: dict) -> dict:
    """{'line': 1-based line number of the buggy line in its module} (empty if not found once)."""
    src = task.provenance.get("repo", {}).get(bug["path"], "")
    hits = [i + 1 for i, ln in enumerate(src.splitlines()) if ln == bug["old"]]
    return {"line": hits[0]} if len(hits) == 1 else {}


def shell_demo_messages(task: Any, style: str = "shell_lines", prior: Counter | None = None) -> list:
    """Assistant turns of the shell-style expert episode on `task` (see the module docstring)."""
    from c2jax.data.chat_format import Message, ToolCall, make_call_id

    if style in RETRY_STYLES:
        return retry_demo_messages(task, prior, by_address=style == "shell_retry_addr")
    if not applies(task, style):
        raise ValueError(f"{style} demos need one module with one bug and a quote-free edit"
                         f"{' on a line with a binary operator' if style == 'shell_ops' else ''}: {task.instance_id}")
    bug = task.provenance["bugs"][0]
    n = _bug_line(task, bug)["line"]
    edit = sed_edit(bug["old"], bug["new"], quote_free=style in _QUOTE_FREE, nth=style in NTH_STYLES)
    cmds = [_EXPLORE[style], f"sed -i '{n}{edit}' {MODULE_GLOB}", f"sed -n '{n}p' {MODULE_GLOB}"]
    if style in _LOCATE:
        pat = locate_pattern(bug["old"], edit)
        cmds.insert(1, _locate_grep(pat))
    turns = [Message("assistant", "", [ToolCall(make_call_id("run_terminal_cmd", i), "run_terminal_cmd",
                                                json.dumps({"command": c}))]) for i, c in enumerate(cmds)]
    return turns + [Message("assistant", f"Fixed line {n}.")]


def edit_key(task: Any) -> tuple[int, str] | None:
    """(line number, sed substitution) of the shell-style fix of `task`, or None if it does not apply."""
    if not applies(task):
        return None
    bug = task.provenance["bugs"][0]
    return _bug_line(task, bug)["line"], sed_edit(bug["old"], bug["new"])


def _apply_sed(line: str, sub: str) -> str:
    """`line` after the literal substitution `s/PAT/REP/N` of `sed_edit` (the Nth match, the first
    without N)."""
    m = re.fullmatch(r"s/((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/(\d*)", sub)
    if m is None:
        raise ValueError(f"not a sed_edit substitution: {sub!r}")
    pat, rep = (re.sub(r"\\(.)", r"\1", g) for g in m.groups()[:2])
    i = line.find(pat)
    for _ in range(int(m.group(3) or 1) - 1):  # sed's occurrence flag: the Nth non-overlapping match
        i = line.find(pat, i + len(pat)) if i != -1 else -1
    return line if i == -1 else line[:i] + rep + line[i + len(pat):]


def blind_edit_baseline(train: Sequence[Any], held_out: Sequence[Any]) -> dict:
    """The policy that never reads: the most common training fix (line number + substitution) applied to
    every held-out task. `resolved_share` is the share of held-out tasks whose buggy line it turns into
    the gold line (host-side; a floor for what guessing alone earns on the family)."""
    keys = Counter(k for k in map(edit_key, train) if k is not None)
    if not keys or not held_out:
        return {"edit": None, "resolved_share": 0.0, "held_out": len(held_out)}
    (n, sub), _ = keys.most_common(1)[0]
    hits = 0
    for t in held_out:
        bug = t.provenance["bugs"][0]
        lines = t.provenance.get("repo", {}).get(bug["path"], "").splitlines()
        if 0 < n <= len(lines) and len(t.provenance["bugs"]) == 1 and lines[n - 1] == bug["old"]:
            hits += _apply_sed(lines[n - 1], sub) == bug["new"]
    return {"edit": f"{n}{sub}", "resolved_share": hits / len(held_out), "held_out": len(held_out),
            "train_share_of_edit": keys.most_common(1)[0][1] / sum(keys.values())}


# ---- shell_retry: a search that checks each edit with repro.py and undoes the failed ones ----------

BACKUP = "cp -r . /tmp/base"  # the explore step saves the workspace ...
RESTORE = "cp -r /tmp/base/. ."  # ... and a failed attempt is undone by copying it back (nothing to copy)
CHECK = f"python {REPRO_PATH}"
RETRY_STYLES = ("shell_retry", "shell_retry_addr")
MAX_ATTEMPTS = 3  # explore + 3 x (grep, sed + check) + finish = 8 turns (the quickstart's agent.max_turns)


class Edit(NamedTuple):
    """One candidate edit: the 1-based line, its sed substitution, the line after it, (old op, new op)."""

    line: int
    sed: str
    new_line: str
    change: tuple[str, str]


def candidate_edits(task: Any) -> list[Edit]:
    """Every one-operator edit the policy could make on the module's operator lines, in line order:
    each swaps one spaced binary operator for another that the generator's mutation table (`OPERATOR_SWAPS`)
    pairs with it, the edits a bug of this family is undone by."""
    bug = task.provenance["bugs"][0]
    lines = task.provenance["repo"][bug["path"]].splitlines()
    out = []
    for n in operator_lines("\n".join(lines)):
        old = lines[n - 1]
        for m in re.finditer(OPS_REGEX, old):
            op = m.group(1)
            for new_op in sorted({OPERATOR_SWAPS.get(op), *(k for k, v in OPERATOR_SWAPS.items() if v == op)} - {None, op}):
                new = old[:m.start(1)] + new_op + old[m.end(1):]
                try:
                    out.append(Edit(n, sed_edit(old, new, quote_free=True), new, (op, new_op)))
                except ValueError:
                    continue
    return out


def gold_change(task: Any) -> tuple[str, str] | None:
    """The (old, new) operator of `task`'s fix, or None if no candidate edit is the fix."""
    bug = task.provenance["bugs"][0]
    n = _bug_line(task, bug).get("line")
    return next((e.change for e in candidate_edits(task) if e.line == n and e.new_line == bug["new"]), None)


def change_prior(tasks: Sequence[Any]) -> Counter:
    """How often each operator change fixes one of `tasks` (the demonstrator's experience: the
    training tasks it searches on); `search_order` tries frequent changes first."""
    return Counter(c for c in map(gold_change, tasks) if c is not None)


def search_order(task: Any, prior: Counter) -> list[Edit]:
    """The candidate edits in the order the demonstrator tries them: most frequent change first,
    then line order."""
    return sorted(candidate_edits(task), key=lambda e: (-prior.get(e.change, 0), e.line, e.change))


def _repro_after(task: Any, n: int, new_line: str) -> str:
    """What repro.py prints after line `n` of the bug's module becomes `new_line` (host-side)."""
    bug = task.provenance["bugs"][0]
    lines = task.provenance["repo"][bug["path"]].splitlines()
    lines[n - 1] = new_line
    mod = bug["path"][:-3].replace("/", ".")
    return run_repro(task.provenance["repo"][REPRO_PATH], {mod: "\n".join(lines) + "\n"})


def search_attempts(task: Any, prior: Counter, max_attempts: int = MAX_ATTEMPTS) -> list[Edit] | None:
    """The edits a `shell_retry` demonstration makes: `search_order` up to the first edit repro.py
    accepts, if that is the fix and within `max_attempts`; else None (the search fails on this task, so
    it is not demonstrated: a wrong edit that passes the check, or the fix too far down the order)."""
    if not applies(task, "shell_retry"):
        return None
    bug = task.provenance["bugs"][0]
    n = _bug_line(task, bug)["line"]
    order = search_order(task, prior)[:max_attempts]
    for k, e in enumerate(order):
        if _repro_after(task, e.line, e.new_line) == REPRO_OK:
            return order[:k + 1] if (e.line, e.new_line) == (n, bug["new"]) else None
    return None


def _attempt(n: int, edit: str, old_line: str, lines: Sequence[str] | None = None) -> list[str]:
    """The two calls of one attempt: grep the operator to change, then sed line n and run repro.py.
    With the module's `lines` (`shell_retry_addr`), the sed addresses the line by the grepped string
    instead of its number where that string is on this line only (`sed -i '/ + /s/+/*/'`): the call
    then copies the string of the call before it, not a number from a tool output."""
    pat = locate_pattern(old_line, edit)
    addr = str(n)
    if lines is not None and sum(pat in ln for ln in lines) == 1:
        addr = f"/{_escape_pattern(pat)}/"
    return [_locate_grep(pat), f"sed -i '{addr}{edit}' {MODULE_GLOB} && {CHECK}"]


def retry_demo_messages(task: Any, prior: Counter | None = None, by_address: bool = False) -> list:
    """Assistant turns of a `shell_retry` episode, a scripted search that knows no fix: save the
    workspace and list the operator lines; then per attempt (`search_order`: the most frequent fix of
    the training tasks first) grep the operator, sed the line and run repro.py in the same call; after
    a failed check restore the workspace (in the same call as the next attempt's grep); finish after
    the check prints ok. `prior` defaults to this task's own fix only (its first attempt is the fix).
    `by_address` (`shell_retry_addr`): each sed addresses its line by the grepped string where it is
    unique (`_attempt`), and the final message names no line.

        run_terminal_cmd  cp -r . /tmp/base && grep -nE '<ops>' */[!_]*.py
        run_terminal_cmd  grep -nF ' + ' */[!_]*.py
        run_terminal_cmd  sed -i '3s/+/*/' */[!_]*.py && python repro.py     -> got 4, want 20
        run_terminal_cmd  cp -r /tmp/base/. . && grep -nF ' - ' */[!_]*.py
        run_terminal_cmd  sed -i '5s/-/+/' */[!_]*.py && python repro.py     -> ok
        final message     Fixed line 5.
    """
    from c2jax.data.chat_format import Message, ToolCall, make_call_id

    if prior is None:
        prior = change_prior([task])
    attempts = search_attempts(task, prior)
    if attempts is None:
        raise ValueError(f"shell_retry: the search does not find the fix of {task.instance_id} within "
                         f"{MAX_ATTEMPTS} checked attempts (or the task is not demonstrable)")
    lines = task.provenance["repo"][task.provenance["bugs"][0]["path"]].splitlines()
    cmds = [f"{BACKUP} && {_EXPLORE['shell_locate']}"]
    for k, e in enumerate(attempts):
        grep, sed = _attempt(e.line, e.sed, lines[e.line - 1], lines if by_address else None)
        cmds += [f"{RESTORE} && {grep}" if k else grep, sed]
    turns = [Message("assistant", "", [ToolCall(make_call_id("run_terminal_cmd", i), "run_terminal_cmd",
                                                json.dumps({"command": c}))]) for i, c in enumerate(cmds)]
    return turns + [Message("assistant", "Fixed." if by_address else f"Fixed line {attempts[-1].line}.")]
