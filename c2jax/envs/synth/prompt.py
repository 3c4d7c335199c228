"""Terse, user-style prompts from failing test names and docstrings, never from the solution.

CursorBench prompts are short and underspecified; these state the goal (which behaviour is broken
or missing, in which module) from the names of the FAIL_TO_PASS tests and the first line of the
affected functions' docstrings. The gold patch's lines never appear: `leaks(prompt, patch)` checks
that no changed code line of the patch occurs in the prompt, and the writer drops the docstring
hint if it would.
"""
from __future__ import annotations

import random
import re

_BUG = (
    "{where} is misbehaving: {tests} {fail}{more}. Find and fix the bug in the library code; don't touch the tests.",
    "{Tests} {tests} {are} red{more}. Something in {where} regressed. Fix the implementation.",
    "Getting wrong results from {where}: {tests} {fail}{more}. Track it down and fix it.",
)
_MULTI = (
    "Several things broke in {where}: {tests} {fail}{more}. Fix the library code (there may be more than one bug).",
    "Regressions in {where}: {tests} {fail}{more}. Fix them all, leave the tests alone.",
)
_DELETE = (
    "{funcs} {verb} missing in {files}; {they} just {raise_} NotImplementedError. Implement {them}.{hint} "
    "Tests like {tests} should pass.",
    "Implement {funcs} ({files}): currently {stubs}.{hint} {tests} {exercise} {them}.",
)


def _short_test(tid: str) -> str:
    name = tid.split("::")[-1]
    return re.sub(r"\[.*\]$", "", name)


def _tests_phrase(f2p: list[str], rng: random.Random, k: int = 2) -> tuple[str, str]:
    names = sorted({_short_test(t) for t in f2p})
    pick = rng.sample(names, min(k, len(names)))
    more = f" (and {len(names) - len(pick)} more)" if len(names) > len(pick) else ""
    return ", ".join(f"`{n}`" for n in pick), more


def _module(path: str) -> str:
    p = path[:-3] if path.endswith(".py") else path
    p = p[4:] if p.startswith("src/") else p
    p = p.replace("/", ".")
    return p[:-9] if p.endswith(".__init__") else p


def bug_prompt(paths: list[str], f2p: list[str], rng: random.Random, multi: bool = False) -> str:
    mods = sorted({_module(p) for p in paths})
    where = " and ".join(f"`{m}`" for m in mods[:2])
    tests, more = _tests_phrase(f2p, rng)
    one = "," not in tests and not more  # a single failing test: singular verbs
    return rng.choice(_MULTI if multi else _BUG).format(where=where, tests=tests, more=more,
                                                        fail="fails" if one else "fail",
                                                        Tests="Test" if one else "Tests",
                                                        are="is" if one else "are")


def deletion_prompt(functions: list[tuple[str, str, str]], f2p: list[str], rng: random.Random,
                    patch: str = "") -> str:
    """functions: (path, qualified name, docstring)."""
    names = [q for _, q, _ in functions]
    shown = names[:4]
    funcs = ", ".join(f"`{n}`" for n in shown) + (f" and {len(names) - len(shown)} more" if len(names) > 4 else "")
    files = ", ".join(sorted({p for p, _, _ in functions}))
    hint = ""
    for _, q, doc in functions:
        first = doc.strip().splitlines()[0].strip() if doc.strip() else ""
        if first and len(first) < 120:
            cand = f" `{q.split('.')[-1]}`: {first.rstrip('.')}."
            if not leaks(cand, patch):
                hint = cand
                break
    tests, _ = _tests_phrase(f2p, rng)
    many = len(names) > 1
    exercise = "exercise" if "," in tests else "exercises"
    return rng.choice(_DELETE).format(funcs=funcs, verb="are" if many else "is", files=files, hint=hint,
                                      tests=tests, they="they" if many else "it",
                                      raise_="raise" if many else "raises", them="them" if many else "it",
                                      stubs="stubs" if many else "a stub", exercise=exercise)


def leaks(prompt: str, patch: str, min_len: int = 12) -> bool:
    """True if a changed code line of `patch` (stripped, >= min_len chars) appears in `prompt`."""
    for line in patch.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        code = line[1:].strip()
        if len(code) >= min_len and not code.startswith(("#", '"""', "'''", "raise NotImplementedError")) \
                and code in prompt:
            return True
    return False
