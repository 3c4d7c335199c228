"""Shell-style toyfix demonstrations: the sed edit reproduces the gold line exactly (checked with the
real `sed` on generated tasks), and tasks it cannot demonstrate are refused, not mis-demonstrated."""
import json
import os
import shutil
import subprocess

import pytest

from c2jax.envs.synth import toyfix
from c2jax.envs.synth.toyfix_shell_demos import MODULE_GLOB, applies, sed_edit, shell_demo_messages

pytestmark = pytest.mark.skipif(shutil.which("sed") is None, reason="needs GNU sed")


def _real_sed(tmp_path, line: str, edit: str) -> str:
    """`line` after GNU sed applies `edit` to it in a file."""
    f = tmp_path / "m.py"
    f.write_text(line + "\n")
    subprocess.run(["sed", "-i", f"1{edit}", str(f)], check=True)
    return f.read_text()[:-1]


@pytest.mark.parametrize("old,new,want", [
    ("    return x - y", "    return x + y", "s/-/+/"),
    ("    if a < 5:", "    if a <= 5:", "s/</<=/"),
    ("    return acc", "    return x", "s/acc/x/"),
    ("    return n * 3 + 3", "    return n * 3 + 4", None),  # second '3': the span must grow until unique
    ("    return v[:2]", "    return v[:3]", None),  # BRE specials escaped
])
def test_sed_edit_turns_old_into_new(tmp_path, old, new, want):
    e = sed_edit(old, new)
    if want is not None:
        assert e == want
    assert _real_sed(tmp_path, old, e) == new


def test_sed_edit_rejects_equal_and_quoted_spans():
    with pytest.raises(ValueError):
        sed_edit("x = 1", "x = 1")
    with pytest.raises(ValueError):
        sed_edit("    return a + '#' * 3", "    return a + '~' * 3")


def test_demos_fix_generated_tasks_exactly(tmp_path):
    """Every demonstrable candidate of a few seeds: running the demo's commands on the broken package
    gives the pristine package; a task with two modules is refused."""
    checked = 0
    for seed in range(40):
        c = toyfix.make_candidate("train", 1000 + seed, 1)
        if c is None:
            continue
        task = type("T", (), {"instance_id": f"t{seed}", "provenance": {"bugs": c.bugs, "repo": c.broken}})()
        if not applies(task):
            continue
        root = tmp_path / f"s{seed}"
        for p, text in c.broken.items():
            os.makedirs(root / os.path.dirname(p), exist_ok=True)
            (root / p).write_text(text)
        msgs = shell_demo_messages(task)
        assert [m.tool_calls[0].name for m in msgs[:3]] == ["run_terminal_cmd"] * 3 and not msgs[3].tool_calls
        for m in msgs[:2]:
            subprocess.run(json.loads(m.tool_calls[0].arguments)["command"], shell=True, cwd=root, check=True,
                           capture_output=True)
        assert {p: (root / p).read_text() for p in c.pristine} == c.pristine
        checked += 1
    assert checked >= 20
    c2 = next(c for s in range(50) if (c := toyfix.make_candidate("train", 2000 + s, 2)) is not None)
    t2 = type("T", (), {"instance_id": "d2", "provenance": {"bugs": c2.bugs, "repo": c2.broken}})()
    assert not applies(t2)
    with pytest.raises(ValueError):
        shell_demo_messages(t2)
    assert MODULE_GLOB == "*/[!_]*.py"


def test_docstrings_knob_documents_every_function_at_difficulty_1():
    c = next(c for s in range(50) if (c := toyfix.make_candidate("train", 3000 + s, 1, docstrings=True)) is not None)
    plain = toyfix.make_candidate("train", 3000 + [s for s in range(50)
                                                   if toyfix.make_candidate("train", 3000 + s, 1) is not None][0], 1)
    src = "".join(t for p, t in c.broken.items() if "/" in p)  # the package (not repro.py)
    assert src.count("def ") == src.count('"""') // 2 > 0
    assert '"""' not in "".join(t for p, t in plain.broken.items() if "/" in p)


def _d0_tasks(stream: str, n: int, repro: bool = False) -> list:
    import types

    out, i = [], 0
    while len(out) < n:
        c = toyfix.make_candidate(stream, toyfix._seed(0, stream, 0, i), 0, repro=repro)
        i += 1
        if c is not None:
            out.append(types.SimpleNamespace(instance_id=f"{stream}{i}",
                                             provenance={"bugs": c.bugs, "repo": dict(c.broken)}))
    return out


@pytest.mark.parametrize("old,new", [("    return x - y", "    return x + y"), ("    return v[:2]", "    return v[:3]"),
                                     ("        acc //= 2", "        acc *= 2")])
def test_apply_sed_matches_real_sed(tmp_path, old, new):
    from c2jax.envs.synth.toyfix_shell_demos import _apply_sed

    e = sed_edit(old, new)
    f = tmp_path / "m.py"
    f.write_text(old + "\n")
    subprocess.run(["sed", "-i", f"1{e}", str(f)], check=True)
    assert _apply_sed(old, e) == f.read_text()[:-1] == new


def test_blind_edit_baseline_is_a_floor_not_a_solution():
    """Difficulty 0 scatters the edit's line (module headers) so that the most common training fix,
    replayed blind on held-out tasks, resolves few of them; a task set made only of that fix is a
    positive control (the baseline then resolves every task)."""
    from c2jax.envs.synth.toyfix_shell_demos import blind_edit_baseline, edit_key

    train, held = _d0_tasks("train", 120), _d0_tasks("eval", 60)
    assert len({edit_key(t)[0] for t in train if edit_key(t)}) >= 3  # the line to edit varies
    base = blind_edit_baseline(train, held)
    assert base["edit"] and base["resolved_share"] < 0.2 and base["train_share_of_edit"] < 0.2
    top = base["edit"]
    same = [t for t in held if edit_key(t) and f"{edit_key(t)[0]}{edit_key(t)[1]}" == top]
    assert same and blind_edit_baseline(train, same)["resolved_share"] == 1.0


def _d0_workspaces(tmp_path, style: str, n_seeds: int = 60):
    """(candidate, task stub, workspace dir) for generated difficulty-0 demo candidates `style` applies to;
    each workspace holds the candidate's broken package, as a sandbox's /workspace would."""
    for seed in range(n_seeds):
        c = toyfix.make_candidate("demo", toyfix._seed(0, "demo", 0, seed), 0)
        if c is None:
            continue
        task = type("T", (), {"instance_id": f"{style}{seed}", "provenance": {"bugs": c.bugs, "repo": c.broken}})()
        if not applies(task, style):
            continue
        root = tmp_path / f"{style}{seed}"
        for p, text in c.broken.items():
            os.makedirs(root / os.path.dirname(p), exist_ok=True)
            (root / p).write_text(text)
        yield c, task, root


def test_shell_ops_demos_list_the_buggy_line_and_fix_it_with_real_grep_and_sed(tmp_path):
    """`shell_ops` explores with the operator grep: run for real on generated difficulty-0 tasks, it
    lists the lines `operator_lines` predicts, the buggy line always among them (one or two lines),
    and the demo's sed restores the pristine module."""
    from c2jax.envs.synth.toyfix_shell_demos import OPS_REGEX, operator_lines

    if shutil.which("grep") is None:
        pytest.skip("needs GNU grep")
    listed = []
    for c, task, root in _d0_workspaces(tmp_path, "shell_ops"):
        msgs = shell_demo_messages(task, style="shell_ops")
        cmds = [json.loads(m.tool_calls[0].arguments)["command"] for m in msgs[:3]]
        assert OPS_REGEX in cmds[0]
        out = subprocess.run(cmds[0], shell=True, cwd=root, capture_output=True, text=True, check=True).stdout
        got = [int(ln.split(":", 1)[0]) for ln in out.splitlines()]
        path = c.bugs[0]["path"]
        assert got == operator_lines(c.broken[path])
        line = int(cmds[1].split("'")[1].split("s/")[0])
        assert line in got and 1 <= len(got) <= 2
        subprocess.run(cmds[1], shell=True, cwd=root, check=True)
        assert {p: (root / p).read_text() for p in c.pristine} == c.pristine
        listed.append(len(got))
    assert len(listed) >= 30 and 1 in listed
    with pytest.raises(ValueError):
        applies(task, "no_such_style")


def test_shell_locate_demos_grep_the_operator_then_sed_the_number_it_printed(tmp_path):
    """`shell_locate` adds a fixed-string grep for the operator it will change: run for real on
    generated difficulty-0 tasks, its output lists the buggy line (mostly alone, so the sed's line
    number is the first token of that output), the sed pattern is the grepped string, and the demo's
    sed restores the pristine module."""
    from c2jax.envs.synth.toyfix_shell_demos import OPS_REGEX

    if shutil.which("grep") is None:
        pytest.skip("needs GNU grep")
    firsts = []
    for c, task, root in _d0_workspaces(tmp_path, "shell_locate"):
        msgs = shell_demo_messages(task, style="shell_locate")
        assert len(msgs) == 5 and not msgs[-1].tool_calls and all(m.tool_calls for m in msgs[:4])
        cmds = [json.loads(m.tool_calls[0].arguments)["command"] for m in msgs[:4]]
        assert OPS_REGEX in cmds[0] and cmds[1].startswith("grep -nF ")
        out = subprocess.run(cmds[1], shell=True, cwd=root, capture_output=True, text=True, check=True).stdout
        got = [int(ln.split(":", 1)[0]) for ln in out.splitlines()]
        line = int(cmds[2].split("'")[1].split("s/")[0])
        assert line in got
        firsts.append(got[0] == line)
        grepped = cmds[1].split("'")[1]
        assert grepped.strip() in cmds[2].replace("\\", "")  # the sed pattern is the grepped string
        subprocess.run(cmds[2], shell=True, cwd=root, check=True)
        assert {p: (root / p).read_text() for p in c.pristine} == c.pristine
        assert subprocess.run(cmds[3], shell=True, cwd=root, capture_output=True, text=True,
                              check=True).stdout.rstrip("\n") == c.bugs[0]["new"]
    assert len(firsts) >= 30 and sum(firsts) / len(firsts) >= 0.8


@pytest.mark.parametrize("old,new,want", [
    ("    return s + '#' + 3", "    return s + '#' * 3", "s/+ 3/* 3/"),
    ("    return word + '*' + 7", "    return word + '*' * 7", "s/+ 7/* 7/"),
])
def test_quote_free_spans_widen_right_where_left_needs_a_quote(tmp_path, old, new, want):
    with pytest.raises(ValueError):
        sed_edit(old, new)  # the shell_locate span (`'#' +`) needs a quote
    e = sed_edit(old, new, quote_free=True)
    assert e == want
    assert _real_sed(tmp_path, old, e) == new


def test_quote_free_leaves_quote_free_spans_alone_and_still_refuses_quoted_changes():
    for old, new in (("    return x - y", "    return x + y"), ("    return n * 3 + 3", "    return n * 3 + 4"),
                     ("        acc //= 2", "        acc *= 2")):
        assert sed_edit(old, new, quote_free=True) == sed_edit(old, new)
    with pytest.raises(ValueError):  # the change itself is inside the quotes
        sed_edit("    return a + '#' * 3", "    return a + '~' * 3", quote_free=True)


def _beyond_shell_locate(tmp_path, style: str):
    """(candidate, first four commands, workspace) of the generated difficulty-0 demo tasks `style`
    demonstrates and `shell_locate` does not; on the tasks both demonstrate, asserts the same commands."""
    for c, task, root in _d0_workspaces(tmp_path, style, n_seeds=400):
        cmds = [json.loads(m.tool_calls[0].arguments)["command"] for m in shell_demo_messages(task, style=style)[:4]]
        if applies(task, "shell_locate"):
            assert [json.loads(m.tool_calls[0].arguments)["command"]
                    for m in shell_demo_messages(task, style="shell_locate")[:4]] == cmds
            continue
        yield c, cmds, root


def test_shell_locate_qf_demonstrates_string_repeats_that_shell_locate_skips(tmp_path):
    """On generated difficulty-0 train tasks, `shell_locate_qf` demonstrates a superset of
    `shell_locate`'s tasks, with the same commands where both apply, and its extra demonstrations
    (string repeats) restore the pristine module with the real grep and sed."""
    if shutil.which("grep") is None:
        pytest.skip("needs GNU grep")
    extra = 0
    for c, cmds, root in _beyond_shell_locate(tmp_path, "shell_locate_qf"):
        extra += 1
        out = subprocess.run(cmds[1], shell=True, cwd=root, capture_output=True, text=True, check=True).stdout
        assert int(cmds[2].split("'")[1].split("s/")[0]) in [int(ln.split(":", 1)[0]) for ln in out.splitlines()]
        subprocess.run(cmds[2], shell=True, cwd=root, check=True)
        assert {p: (root / p).read_text() for p in c.pristine} == c.pristine
    assert extra >= 3  # string repeats are ~5% of d0 tasks


def test_shell_retry_search_holds_the_fix_checks_every_edit_and_knows_no_answer():
    """`candidate_edits` lists the gold fix of every demonstrable difficulty-0 task; the search tries
    edits in the prior's order, every attempt before the last fails repro.py (run on the host) and the
    last is the fix, which it accepts; each sed is followed by repro.py and each later attempt starts by
    restoring the workspace. The search knows no answer: two tasks with the same operator lines get the
    same first attempt whatever their fix (positive control: `prior=None` demonstrates the task's own
    fix first, so there the first attempts differ)."""
    from collections import Counter

    from c2jax.envs.synth.toyfix_programs import REPRO_OK
    from c2jax.envs.synth.toyfix_shell_demos import (CHECK, MAX_ATTEMPTS, RESTORE, _bug_line, _repro_after,
                                                     candidate_edits, change_prior, search_attempts)

    assert not any(applies(t, "shell_retry") for t in _d0_tasks("demo", 20))  # needs repro.py
    tasks = [t for t in _d0_tasks("demo", 200, repro=True) if applies(t, "shell_retry")]
    prior = change_prior(tasks)
    assert len(tasks) >= 150 and prior.most_common(1)[0][1] < len(tasks)
    lengths: Counter = Counter()
    for t in tasks:
        bug = t.provenance["bugs"][0]
        n = _bug_line(t, bug)["line"]
        assert (n, bug["new"]) in {(e.line, e.new_line) for e in candidate_edits(t)}
        att = search_attempts(t, prior)
        lengths[None if att is None else len(att)] += 1
        if att is None:
            continue
        assert (att[-1].line, att[-1].new_line) == (n, bug["new"]) and _repro_after(t, n, bug["new"]) == REPRO_OK
        assert all(_repro_after(t, e.line, e.new_line) != REPRO_OK for e in att[:-1])
        cmds = [json.loads(m.tool_calls[0].arguments)["command"]
                for m in shell_demo_messages(t, "shell_retry", prior=prior)[:-1]]
        seds = [c for c in cmds if c.startswith("sed -i")]
        assert len(seds) == len(att) <= MAX_ATTEMPTS and all(c.endswith(" && " + CHECK) for c in seds)
        assert sum(c.startswith(RESTORE) for c in cmds) == len(att) - 1
    assert lengths[1] > lengths[2] > 0 and lengths[3] > 0, lengths
    # the same operator lines, different fixes: the search's first attempt does not depend on the fix
    by_lines: dict = {}
    for t in tasks:
        by_lines.setdefault(tuple(sorted(e.change for e in candidate_edits(t))), []).append(t)
    pairs = [(a, b) for ts in by_lines.values() for a in ts for b in ts if _gold(a) != _gold(b)]
    assert pairs
    a, b = pairs[0]
    first = lambda t, p: search_attempts(t, p, max_attempts=8)[0].change  # noqa: E731
    assert first(a, prior) == first(b, prior)
    assert first(a, change_prior([a])) != first(b, change_prior([b]))


def _gold(t):
    from c2jax.envs.synth.toyfix_shell_demos import gold_change

    return gold_change(t)


def test_shell_retry_addr_seds_address_the_line_by_the_grepped_string_with_real_sed(tmp_path):
    """`shell_retry_addr` addresses each sed by the string its grep looked for where that string is on
    one line only (most attempts), else by the number; run with the real GNU sed on the module, every
    attempt turns exactly its line into the edit's new line and leaves the others alone."""
    from c2jax.envs.synth.toyfix_shell_demos import change_prior, search_attempts

    tasks = [t for t in _d0_tasks("demo", 150, repro=True) if applies(t, "shell_retry_addr")]
    prior = change_prior(tasks)
    by_addr = by_number = 0
    for t in tasks:
        att = search_attempts(t, prior)
        if att is None:
            continue
        path = t.provenance["bugs"][0]["path"]
        src = t.provenance["repo"][path]
        cmds = [json.loads(m.tool_calls[0].arguments)["command"]
                for m in shell_demo_messages(t, "shell_retry_addr", prior=prior)[:-1]]
        seds = [c.split(" && ")[0] for c in cmds if c.startswith("sed -i")]
        for e, sed in zip(att, seds):
            f = tmp_path / "m.py"
            f.write_text(src)
            script = sed.split("'")[1]
            by_addr += script.startswith("/")
            by_number += not script.startswith("/")
            subprocess.run(["sed", "-i", script, str(f)], check=True)
            want = src.splitlines()
            want[e.line - 1] = e.new_line
            assert f.read_text().splitlines() == want, (sed, src)
    assert by_addr > 5 * by_number > 0, (by_addr, by_number)


@pytest.mark.parametrize("old,new,want", [
    ("    return s + '#' + 3", "    return s + '#' * 3", "s/+/*/2"),
    ("    return word + '*' + 7", "    return word + '*' * 7", "s/+/*/2"),
    ("    return a + '+' + b + 'c' + 2", "    return a + '+' + b + 'c' * 2", "s/+/*/5"),  # the '+' inside the quotes counts too
])
def test_nth_edits_substitute_the_changed_occurrence_without_quote_or_constant(tmp_path, old, new, want):
    """`nth=True`: where the leftward span needs a quote, the edit is the changed span with sed's
    occurrence flag; GNU sed and `_apply_sed` both turn the line into the gold one."""
    from c2jax.envs.synth.toyfix_shell_demos import _apply_sed

    with pytest.raises(ValueError):
        sed_edit(old, new)  # the shell_locate span (`'#' +`) needs a quote
    e = sed_edit(old, new, nth=True)
    assert e == want
    assert _real_sed(tmp_path, old, e) == new == _apply_sed(old, e)


def test_nth_leaves_quote_free_spans_alone_and_still_refuses_quoted_changes():
    for old, new in (("    return x - y", "    return x + y"), ("    return n * 3 + 3", "    return n * 3 + 4"),
                     ("        acc //= 2", "        acc *= 2")):
        assert sed_edit(old, new, nth=True) == sed_edit(old, new)
    with pytest.raises(ValueError):  # the change itself is inside the quotes
        sed_edit("    return a + '#' * 3", "    return a + '~' * 3", nth=True)


def test_shell_locate_nth_demonstrates_string_repeats_without_copying_a_constant(tmp_path):
    """On generated difficulty-0 demo tasks, `shell_locate_nth` demonstrates a superset of
    `shell_locate`'s tasks with the same commands where both apply; each extra demonstration (a string
    repeat) edits with an occurrence flag and no digit from the code, and restores the pristine module
    with the real grep and sed (positive control: the same sed without its flag changes the first `+`,
    which is not the fix)."""
    if shutil.which("grep") is None:
        pytest.skip("needs GNU grep")
    import re

    extra = 0
    for c, cmds, root in _beyond_shell_locate(tmp_path, "shell_locate_nth"):
        extra += 1
        line, sub = re.fullmatch(r"sed -i '(\d+)(s/.*/\d+)' .*", cmds[2]).groups()
        assert not re.search(r"\d", sub.rsplit("/", 1)[0])  # no constant in the substitution
        out = subprocess.run(cmds[1], shell=True, cwd=root, capture_output=True, text=True, check=True).stdout
        assert int(line) in [int(ln.split(":", 1)[0]) for ln in out.splitlines()]
        bug = c.bugs[0]
        assert _real_sed(tmp_path, bug["old"], sub.rsplit("/", 1)[0] + "/") != bug["new"]  # the flag matters
        subprocess.run(cmds[2], shell=True, cwd=root, check=True)
        assert {p: (root / p).read_text() for p in c.pristine} == c.pristine
    assert extra >= 3  # string repeats are ~5% of d0 tasks
