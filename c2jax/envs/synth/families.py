"""Task families of the synthesis build: how a candidate of each category is made from a codebase
and how its prompt is written, registered by category name in `TASK_FAMILIES`.

    bug_injection     one mutation (`mutate.KINDS`) in a tested function; a symptom-only prompt
    multi_bug         two or three mutations in different functions
    feature_deletion  whole functions deleted over >= `Targets.deletion_min_files` files; the prompt
                      describes the missing behaviour

The build (`c2jax.envs.synth.build`) asks the registry for every category it makes, in
registration order, and for the prompt of each validated candidate; a new family is one
`TASK_FAMILIES.register` call here (plus its count in `Targets`).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
from typing import Callable

from c2jax.envs.synth import mutate, prompt
from c2jax.envs.synth.sources import Codebase
from c2jax.registry import Registry


@dataclasses.dataclass
class Targets:
    """How many tasks of each category to make from one codebase (and how hard to try)."""

    bug: int = 4
    multi_bug: int = 1
    feature_deletion: int = 2
    max_attempts: int = 60
    deletion_min_lines: int = 50
    deletion_min_files: int = 2
    deletion_max_lines: int = 400
    max_test_file_s: float = 20.0  # test files slower than this per gold run are not used


def read_source(cb: Codebase, rel: str) -> str:
    """The text of the codebase's file `rel`, exactly as stored (no newline translation)."""
    with open(os.path.join(cb.root, rel), encoding="utf-8", newline="") as f:
        return f.read()


@dataclasses.dataclass
class Candidate:
    category: str
    subcategory: str
    new_texts: dict[str, str]  # path -> broken text
    functions: list[tuple[str, str, str]]  # (path, qualname, docstring)
    seed: int


def _tested_sources(cb: Codebase, gold: dict) -> list[str]:
    return [s for s in cb.source_files if any(gold.get(t, {}).get("stable") for t in cb.tests_for(s))]



# Makes a candidate: (codebase, category, rng, targets, tested source files, seed) -> Candidate | None.
MakeCandidate = Callable[[Codebase, str, random.Random, Targets, list, int], "Candidate | None"]
# Writes the prompt: (candidate, FAIL_TO_PASS ids, rng, gold patch) -> problem statement.
WritePrompt = Callable[["Candidate", list, random.Random, str], str]


@dataclasses.dataclass(frozen=True)
class TaskFamily:
    """One task category: its candidate maker, its prompt writer, and its count in `Targets`."""

    make: MakeCandidate
    prompt: WritePrompt
    count: Callable[[Targets], int]


TASK_FAMILIES: Registry[TaskFamily] = Registry("task_family")


def make_candidate(cb: Codebase, category: str, rng: random.Random, targets: Targets, gold: dict,
                   seed: int) -> Candidate | None:
    """A candidate of `category` (a `TASK_FAMILIES` name) over the sources the gold run tests."""
    family = TASK_FAMILIES.get(category)
    srcs = _tested_sources(cb, gold)
    if not srcs:
        return None
    return family.make(cb, category, rng, targets, srcs, seed)


def _mutation_candidate(cb: Codebase, category: str, rng: random.Random, targets: Targets, srcs: list[str],
                        seed: int, n_bugs: Callable[[random.Random], int]) -> Candidate | None:
    n = n_bugs(rng)
    chosen: list[mutate.Mutation] = []
    for _ in range(n * 6):
        path = rng.choice(srcs)
        muts = mutate.candidates(path, read_source(cb, path))
        m = mutate.sample(muts, rng, rng.choice(mutate.KINDS))
        if m is None or any(c.function == m.function and c.path == m.path for c in chosen):
            continue
        chosen.append(m)
        if len(chosen) == n:
            break
    if len(chosen) < n:
        return None
    by_file: dict[str, list[mutate.Edit]] = {}
    for m in chosen:
        by_file.setdefault(m.path, []).extend(m.edits)
    new = {p: mutate.apply_edits(read_source(cb, p), es) for p, es in by_file.items()}
    sub = "+".join(sorted({m.kind for m in chosen}))
    return Candidate(category, sub, new, [(m.path, m.function, "") for m in chosen], seed)


def _deletion_candidate(cb: Codebase, category: str, rng: random.Random, targets: Targets, srcs: list[str],
                        seed: int) -> Candidate | None:
    files = list(srcs)
    rng.shuffle(files)
    pool: list[mutate.Deletable] = []
    for p in files:
        try:
            ds = mutate.deletable_functions(p, read_source(cb, p))
        except SyntaxError:
            continue
        rng.shuffle(ds)
        pool.extend(ds)
    chosen_d: list[mutate.Deletable] = []
    total = 0
    used_files: set[str] = set()
    # first make sure of >= min_files distinct files, then fill to the line target
    for want_new_file in (True, False):
        for d in pool:
            if d in chosen_d or total >= targets.deletion_min_lines and len(used_files) >= targets.deletion_min_files:
                continue
            if want_new_file and d.path in used_files:
                continue
            if total + d.lines > targets.deletion_max_lines:
                continue
            if any(o.path == d.path and not (d.edit.end <= o.edit.start or o.edit.end <= d.edit.start) for o in chosen_d):
                continue
            chosen_d.append(d)
            used_files.add(d.path)
            total += d.lines
            if want_new_file and len(used_files) >= targets.deletion_min_files:
                break
    if total < targets.deletion_min_lines or len(used_files) < targets.deletion_min_files:
        return None
    by_file2: dict[str, list[mutate.Edit]] = {}
    for d in chosen_d:
        by_file2.setdefault(d.path, []).append(d.edit)
    new = {p: mutate.apply_edits(read_source(cb, p), es) for p, es in by_file2.items()}
    return Candidate("feature_deletion", f"{len(chosen_d)}_functions", new,
                     [(d.path, d.function, d.docstring) for d in chosen_d], seed)


def _bug_prompt(cand: Candidate, f2p: list, rng: random.Random, gold_patch: str) -> str:
    return prompt.bug_prompt(sorted(cand.new_texts), f2p, rng, multi=cand.category == "multi_bug")


def _deletion_prompt(cand: Candidate, f2p: list, rng: random.Random, gold_patch: str) -> str:
    return prompt.deletion_prompt(cand.functions, f2p, rng, gold_patch)


# Registration order is the build's order of categories (it decides which seeds each one gets).
TASK_FAMILIES.register("bug_injection", TaskFamily(
    functools.partial(_mutation_candidate, n_bugs=lambda rng: 1), _bug_prompt, lambda t: t.bug))
TASK_FAMILIES.register("multi_bug", TaskFamily(
    functools.partial(_mutation_candidate, n_bugs=lambda rng: rng.choice((2, 3))), _bug_prompt,
    lambda t: t.multi_bug))
TASK_FAMILIES.register("feature_deletion", TaskFamily(_deletion_candidate, _deletion_prompt,
                                                      lambda t: t.feature_deletion))
