"""Synthetic copy-heavy Python for continued pretraining of tiny models.

    text = synth_program(random.Random(0), TRAIN_WORDS)
    rows = synth_code_rows(tokenizer, n_rows=64, seq_len=256, seed=0)   # int32 [n_rows, seq_len + 1]

Each document is a small generated package module (functions whose names, parameters and locals are
drawn from a large word list) followed by code that USES it: an import by dotted module path, the
file path, calls and printed results. Nearly every name appears several times, at short and long
range, and a name can only be predicted by copying it from earlier in the document (the list has
~600 words). Natural code teaches that too, but far more slowly than a tiny model's CPU budget
allows; this source makes in-context copying (induction) appear within a few hundred steps, which
the agent needs to read a file and then edit the line it read.

Programs use only `TRAIN_WORDS`. Copy drills use `drill_words` (default `TRAIN_WORDS`); passing
`ALL_WORDS` teaches copying of every word of both lists. That carries no task, code, diff or constant
of the held-out split (a drill is a bare list of words, and every one of these words occurs >= 20
times in the CPython standard library that the pretraining corpus already contains); what it adds is
copy practice per token, which an untied-embedding model otherwise learns only for tokens it has
copied (measured: drills over TRAIN_WORDS alone reach loss 0.52, yet copy only 40% of EVAL_WORDS tokens).
"""
from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np

from c2jax.data.words import EVAL_WORDS, TRAIN_WORDS

ALL_WORDS: tuple[str, ...] = TRAIN_WORDS + EVAL_WORDS

_OPS = ("+", "-", "*")


def _func(rng: random.Random, words: Sequence[str]) -> tuple[str, list[str], str]:
    name = f"{rng.choice(words)}_{rng.choice(words)}"
    a, b, loc = rng.sample(list(words), 3)
    k = rng.randint(2, 9)
    shape = rng.randrange(4)
    if shape == 0:
        body = [f"    {loc} = {a} {rng.choice(_OPS)} {b}", f"    return {loc} * {k}"]
    elif shape == 1:
        body = [f"    return ({a} {rng.choice(_OPS)} {b}) + {k}"]
    elif shape == 2:
        body = [f"    {loc} = 0", f"    for {b} in range({a}):", f"        {loc} += {b} * {k}", f"    return {loc}"]
    else:
        body = [f"    if {a} < {b}:", f"        return {a} + {k}", f"    return {b}"]
    params = [a, b] if shape != 2 else [a]
    src = f"def {name}({', '.join(params)}):\n" + "\n".join(body) + "\n"
    return name, params, src


def synth_program(rng: random.Random, words: Sequence[str] = TRAIN_WORDS) -> str:
    """One document: a module of 2-3 functions, then code that imports and calls them by name."""
    pkg, mod = rng.sample(list(words), 2)
    funcs = [_func(rng, words) for _ in range(rng.randint(2, 3))]
    parts = [f"# {pkg}/{mod}.py\n"]
    for _, _, src in funcs:
        parts.append(src + "\n\n")
    names = [f for f, _, _ in funcs]
    parts.append(f"# usage\nfrom {pkg}.{mod} import {', '.join(names)}\n")
    for f, params, _ in funcs:
        args = ", ".join(str(rng.randint(0, 9)) for _ in params)
        parts.append(f"print({f}({args}))\n")
    f, params, src = rng.choice(funcs)
    line = src.splitlines()[rng.randint(1, len(src.splitlines()) - 1)]
    parts.append(f"# `from {pkg}.{mod} import {f}` is in {pkg}/{mod}.py; the line:\n# {line.strip()}\n")
    return "".join(parts)


def copy_drill(rng: random.Random, words: Sequence[str] = TRAIN_WORDS, n: int = 16) -> str:
    """A list of random words, then the same list again: the second copy is predictable only by
    copying (the cleanest signal for induction heads to form)."""
    ws = [rng.choice(words) for _ in range(n)]
    joined = ", ".join(ws)
    return f"names = [{joined}]\nsame = [{joined}]\n"


def synth_code_rows(tokenizer: Any, n_rows: int, seq_len: int, seed: int = 0,
                    words: Sequence[str] = TRAIN_WORDS, drill_share: float = 0.5,
                    drill_words: Sequence[str] | None = None) -> np.ndarray:
    """Documents (programs over `words`, and copy drills over `drill_words` (default: `words`) with
    probability `drill_share`) tokenized and packed back to back (EOS between) into int32
    [n_rows, seq_len + 1]."""
    drill_words = words if drill_words is None else drill_words
    rng = random.Random(seed)
    need = n_rows * (seq_len + 1)
    eos = getattr(tokenizer, "eos_id", None)
    ids: list[int] = []
    while len(ids) < need:
        doc = copy_drill(rng, drill_words) if rng.random() < drill_share else synth_program(rng, words)
        ids.extend(tokenizer.encode(doc))
        if eos is not None:
            ids.append(int(eos))
    return np.asarray(ids[:need], np.int32).reshape(n_rows, seq_len + 1)
