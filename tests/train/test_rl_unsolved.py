"""`c2jax.train.rl_unsolved`: never-solved tasks grouped by bug kind, with the demonstrator's coverage
and a resampled run's per-task successes."""
from __future__ import annotations

from types import SimpleNamespace

from c2jax.train.rl_unsolved import bug_kind, format_table, unsolved_table


def _task(iid: str, old: str, new: str, extra: str = "") -> SimpleNamespace:
    src = f"# pkg/m.py\ndef f(s, x):\n{extra}{old}\n"
    return SimpleNamespace(instance_id=iid, provenance={
        "bugs": [{"path": "pkg/m.py", "old": old, "new": new}],
        "repo": {"pkg/m.py": src, "pkg/__init__.py": ""}})


def _row(iid: str, resolved: list[bool], masked: list[bool] | None = None) -> dict:
    masked = masked or [False] * len(resolved)
    return {"instance_id": iid, "samples": [{"resolved": r, "masked": m} for r, m in zip(resolved, masked)]}


TASKS = [
    _task("aug", "    x -= 1", "    x += 1"),
    _task("rep", "    return s + '#' + 3", "    return s + '#' * 3"),  # the sed span would need a quote
    _task("rep2", "    return s + '~' + 4", "    return s + '~' * 4"),
    _task("ok", "    return x - 1", "    return x + 1"),
]


def test_bug_kind_is_the_changed_token():
    assert bug_kind(TASKS[0]) == "-= -> +="
    assert bug_kind(TASKS[1]) == "+ -> *"
    assert bug_kind(SimpleNamespace(instance_id="z", provenance={"bugs": []})) == "?"


def test_table_groups_never_solved_tasks_and_counts_masked_as_failures():
    rows = [_row("aug", [False, False]), _row("rep", [False, False]), _row("rep2", [False, True], [False, True]),
            _row("ok", [True, False])]
    resampled = [_row("aug", [True] + [False] * 7), _row("rep", [False] * 8)]
    table = unsolved_table(TASKS, rows, resampled)
    by = {e["kind"]: e for e in table}
    assert set(by) == {"+ -> *", "-= -> +="}  # "ok" was solved once: not listed
    assert by["+ -> *"]["n"] == 2 and by["+ -> *"]["demonstrable"] == 0  # quoted spans: no shell demo
    assert by["-= -> +="]["n"] == 1 and by["-= -> +="]["demonstrable"] == 1
    assert by["-= -> +="]["resampled"] == [(1, 8)] and by["+ -> *"]["resampled"] == [(0, 8)]
    assert table[0]["kind"] == "+ -> *"  # largest group first
    text = format_table(table)
    assert "| `+ -> *` | 2 | 0 | 0/8 |" in text and "| `-= -> +=` | 1 | 1 | 1/8 |" in text
