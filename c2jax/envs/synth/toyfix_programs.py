"""The programs of toyfix tasks: the train/held-out vocabularies, function archetypes, the bugs
injected into them, and candidate tasks (`make_candidate`). Moved whole out of `toyfix.py`, which
validates, records and builds them (and re-exports these names).
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Sequence


# ---- vocabularies: the training distribution and the held-out split never share a name ---------

VOCAB: dict[str, dict[str, tuple]] = {
    "train": {
        "package": ("geometry", "billing", "inventory", "grades", "weather", "recipes", "travel", "garden",
                    "payroll", "fitness", "music", "orders", "pets", "school"),
        "module": ("shapes", "totals", "helpers", "units", "prices", "counts", "labels", "tools", "rules",
                   "stats"),
        "verb": ("compute", "get", "make", "count", "find", "build"),
        "noun": ("total", "area", "score", "price", "size", "level", "rate", "width"),
        "num": ("x", "y", "n", "width", "weight", "value"),
        "list": ("items", "values", "nums"),
        "str": ("text", "word", "name"),
        # 3 item x 6 accumulator names: 24 distinct `-=` fixes, so the train split (generated first)
        # does not take them all and the demonstration split gets the kind too (with 2 x 3: 9, all
        # taken by train tasks, and no demonstration of the kind at all)
        "item": ("item", "v", "piece"),
        "acc": ("total", "result", "acc", "agg", "running", "subtotal"),
        "const": (2, 3, 5, 7),
        "symbol": ("*", "+"),
        "letter": ("a", "e", "r"),
    },
    "eval": {
        "package": ("physics", "banking", "warehouse", "scoring", "climate", "kitchen", "transit", "archive",
                    "farming", "salary", "sports", "audio", "shipping", "hotel"),
        "module": ("forms", "sums", "utils", "measures", "costs", "tallies", "names", "ops", "checks",
                   "metrics"),
        "verb": ("calc", "fetch", "produce", "tally", "locate", "form"),
        "noun": ("amount", "volume", "points", "cost", "length", "grade", "speed", "height"),
        "num": ("p", "q", "m", "length", "depth", "amount"),
        "list": ("elems", "entries", "data"),
        "str": ("s", "label", "title"),
        "item": ("e", "el"),
        "acc": ("out", "res", "tally"),
        "const": (4, 6, 8, 9),
        "symbol": ("#", "~"),
        "letter": ("o", "i", "n"),
    },
}
# Package, module and function-name parts come from disjoint lists of ~600 words each
# (`c2jax.data.words`): far too many to memorise, so a model must COPY names from the statement and
# from the code it reads; held-out tasks use only EVAL_WORDS, everything trained on only TRAIN_WORDS.
from c2jax.data.words import EVAL_WORDS, TRAIN_WORDS  # noqa: E402

_FIXED = {sp: {str(x) for k, v in VOCAB[sp].items() for x in v} for sp in VOCAB}  # variable names etc.
for _split, _other, _words in (("train", "eval", TRAIN_WORDS), ("eval", "train", EVAL_WORDS)):
    for _pool in ("package", "module", "verb", "noun"):
        VOCAB[_split][_pool] = tuple(w for w in _words if w not in _FIXED[_other] and w not in _FIXED[_split])

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "orbit", "candle")


def vocab_overlap() -> dict[str, list]:
    """Names/constants shared by the two vocabularies (must be empty), per pool and across pools."""
    out = {k: sorted(set(VOCAB["train"][k]) & set(VOCAB["eval"][k]), key=str) for k in VOCAB["train"]}
    names = {s: {str(x) for k, v in VOCAB[s].items() for x in v if k not in ("symbol", "letter", "const")}
             for s in VOCAB}
    out["any_identifier"] = sorted(names["train"] & names["eval"])
    return {k: v for k, v in out.items() if v}


# ---- function archetypes --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Archetype:
    name: str
    args: tuple[str, ...]  # kinds: num | list | str
    body: tuple[str, ...]  # lines, 4-space relative indentation, format slots
    doc: str


ARCHETYPES: tuple[Archetype, ...] = (
    Archetype("lin", ("num", "num"), ("return {a} * {k} + {b}",), "Return {a} times {k} plus {b}."),
    Archetype("diffk", ("num", "num"), ("return ({a} - {b}) * {k}",), "Return {a} minus {b}, times {k}."),
    Archetype("sum_above", ("list",), ("{acc} = 0", "for {it} in {a}:", "    if {it} > {k}:",
                                       "        {acc} += {it}", "return {acc}"),
              "Return the sum of the items of {a} greater than {k}."),
    Archetype("count_below", ("list",), ("{acc} = 0", "for {it} in {a}:", "    if {it} < {k}:",
                                         "        {acc} += 1", "return {acc}"),
              "Return how many items of {a} are less than {k}."),
    Archetype("scale_list", ("list",), ("return [{it} * {k} for {it} in {a}]",),
              "Return the items of {a}, each times {k}."),
    Archetype("pad", ("str",), ("return {a} + '{sym}' * {k}",), "Return {a} followed by {k} copies of '{sym}'."),
    Archetype("head", ("list",), ("return {a}[:{k}]",), "Return the first {k} items of {a}."),
    Archetype("cap", ("num",), ("if {a} > {k}:", "    return {k}", "return {a}"), "Return {a}, but at most {k}."),
    Archetype("steps", ("num",), ("{acc} = []", "for {it} in range({a}):", "    {acc}.append({it} * {k})",
                                  "return {acc}"), "Return [i * {k} for i in range({a})]."),
    Archetype("smaller", ("num", "num"), ("if {a} < {b}:", "    return {a}", "return {b}"),
              "Return the smaller of {a} and {b}."),
    Archetype("wlen", ("str", "num"), ("{acc} = len({a}) + {b}", "return {acc} * {k}"),
              "Return (the length of {a} plus {b}) times {k}."),
    Archetype("halfsum", ("num", "num"), ("{acc} = {a} + {b}", "return {acc} // {k}"),
              "Return {a} plus {b}, divided by {k} (rounded down)."),
    Archetype("count_char", ("str",), ("{acc} = 0", "for {it} in {a}:", "    if {it} == '{let}':",
                                       "        {acc} += 1", "return {acc}"),
              "Return how many times '{let}' occurs in {a}."),
    Archetype("total_plus", ("list",), ("{acc} = {k}", "for {it} in {a}:", "    {acc} += {it}", "return {acc}"),
              "Return {k} plus the sum of the items of {a}."),
)


@dataclasses.dataclass
class Func:
    name: str
    params: list[str]
    locals: list[str]  # names a wrong-variable bug may return
    lines: list[str]  # full source lines (def, optional docstring, body)
    doc: str
    arch: str
    cases: list[tuple] = dataclasses.field(default_factory=list)  # argument tuples for the tests


def _func_name(rng: random.Random, vocab: dict, used_names: set[str]) -> str:
    """A `verb_noun` function name not yet used in the package (recorded in `used_names`)."""
    for _ in range(100):
        fname = f"{rng.choice(vocab['verb'])}_{rng.choice(vocab['noun'])}"
        if fname not in used_names:
            break
    used_names.add(fname)
    return fname


def _make_func(rng: random.Random, vocab: dict, used_names: set[str], docstring: bool) -> Func:
    arch = rng.choice(ARCHETYPES)
    fname = _func_name(rng, vocab, used_names)
    params: list[str] = []
    for kind in arch.args:
        params.append(rng.choice([n for n in vocab[kind] if n not in params]))
    slots = {"a": params[0], "b": params[1] if len(params) > 1 else "",
             "acc": rng.choice([n for n in vocab["acc"] if n not in params]),
             "it": rng.choice(vocab["item"]), "k": rng.choice(vocab["const"]),
             "sym": rng.choice(vocab["symbol"]), "let": rng.choice(vocab["letter"])}
    doc = arch.doc.format(**slots)
    lines = [f"def {fname}({', '.join(params)}):"]
    if docstring:
        lines.append(f'    """{doc}"""')
    lines += ["    " + b.format(**slots) for b in arch.body]
    locs = list(params) + ([slots["acc"]] if "{acc}" in "".join(arch.body) else [])
    return Func(fname, params, locs, lines, doc, arch.name)


def _rand_arg(kind: str, rng: random.Random) -> Any:
    if kind == "num":
        return rng.randint(0, 9)
    if kind == "list":
        return [rng.randint(0, 12) for _ in range(rng.randint(3, 5))]
    return rng.choice(WORDS)


def _kinds(f: Func) -> tuple[str, ...]:
    return next(a.args for a in ARCHETYPES + PICK_ARCHETYPES if a.name == f.arch)


# ---- the imitation-gap variant (`ambiguous`): a broken line that two fixes explain ------------------

# `{v} = {a} * {b}` and `{v} = {a} - {b}`, each with its operator swapped to `+` (OPERATOR_SWAPS maps
# both `*` and `-` to `+`), give the same broken line: nothing the agent can read tells the two apart,
# and the statement of these tasks says only that the call returns the wrong value. Which fix the
# hidden tests want is drawn per task, `*` with probability q. A demonstrator that knows the answer
# shows `*` on a fraction q of the tasks, so imitation learns to sample `*` with probability q and
# solves q^2 + (1 - q)^2 of them; always writing `*` solves q. That gap (the "imitation gap" of an
# expert with information the learner lacks) is one that reward closes and more imitation does not.
PICK_ARCHETYPES: tuple[Archetype, ...] = (
    Archetype("pick_mul", ("num", "num"), ("{v} = {a} * {b}", "return {v}"), "Return {a} times {b}."),
    Archetype("pick_sub", ("num", "num"), ("{v} = {a} - {b}", "return {v}"), "Return {a} minus {b}."),
)


def _pick_names(split: str) -> tuple[str, ...]:
    """The local-variable names of the pick functions: the split's noun list, identifiers only (not a
    keyword, not a builtin), so each task's broken line is its own (thousands of distinct gold diffs)."""
    import builtins
    import keyword

    return tuple(w for w in VOCAB[split]["noun"] if w.isidentifier() and not keyword.iskeyword(w)
                 and not hasattr(builtins, w))


PICK_NAMES: dict[str, tuple[str, ...]] = {split: _pick_names(split) for split in VOCAB}


def _make_pick_func(rng: random.Random, split: str, used_names: set[str], q: float) -> Func:
    """One `pick_mul` (probability q) or `pick_sub` function of two numbers (see PICK_ARCHETYPES)."""
    vocab = VOCAB[split]
    fname = _func_name(rng, vocab, used_names)
    a, b = rng.sample(list(vocab["num"]), 2)
    v = rng.choice([w for w in PICK_NAMES[split] if w not in (a, b, fname)])
    arch = PICK_ARCHETYPES[0] if rng.random() < q else PICK_ARCHETYPES[1]
    slots = {"a": a, "b": b, "v": v}
    lines = [f"def {fname}({a}, {b}):"] + ["    " + ln.format(**slots) for ln in arch.body]
    return Func(fname, [a, b], [a, b, v], lines, arch.doc.format(**slots), arch.name)


def module_text(funcs: Sequence[Func]) -> str:
    return "\n\n\n".join("\n".join(f.lines) for f in funcs) + "\n"


# ---- bugs ------------------------------------------------------------------------------------------

# The operator (or comparison) a bug puts in place of each: `mutations` swaps one token for its value,
# so a fix swaps it back (the shell_retry demonstrations search these pairs in both directions).
OPERATOR_SWAPS = {"+=": "-=", "-=": "+=", "<=": "<", ">=": ">", "==": "!=", "!=": "==", "//": "*", "+": "-", "-": "+",
                  "*": "+", "<": "<=", ">": ">="}
_TOKEN = re.compile(r"'[^']*'|\+=|-=|<=|>=|==|!=|//|[+\-*<>]|\b\d+\b")


@dataclasses.dataclass
class Mutation:
    line: int  # index into Func.lines
    new_line: str
    kind: str  # operator | comparison | off_by_one | wrong_variable


def mutations(f: Func) -> list[Mutation]:
    """Every one-token mutation of the function's body lines."""
    out: list[Mutation] = []
    for i, line in enumerate(f.lines):
        s = line.strip()
        if i == 0 or s.startswith('"""'):
            continue
        for m in _TOKEN.finditer(line):
            tok = m.group(0)
            if tok.startswith("'"):
                continue
            if tok.isdigit():
                for v in (int(tok) + 1, int(tok) - 1):
                    if v >= 0:
                        out.append(Mutation(i, line[:m.start()] + str(v) + line[m.end():], "off_by_one"))
            elif tok in OPERATOR_SWAPS:
                kind = "comparison" if tok in ("<", ">", "<=", ">=", "==", "!=") else "operator"
                out.append(Mutation(i, line[:m.start()] + OPERATOR_SWAPS[tok] + line[m.end():], kind))
        rm = re.fullmatch(r"(\s*)return ([A-Za-z_]\w*)", line)
        if rm:
            for other in f.locals:
                if other != rm.group(2):
                    out.append(Mutation(i, f"{rm.group(1)}return {other}", "wrong_variable"))
    return out


def _stub_lines(f: Func) -> list[str]:
    return f.lines[:2] + ["    raise NotImplementedError"]  # def + docstring


def _exec_module(text: str) -> dict:
    ns: dict = {}
    exec(compile(text, "<toyfix>", "exec"), ns)  # generated by this module only
    return ns


def _call(fn, args: tuple) -> tuple[str, Any]:
    try:
        return "ok", fn(*[list(a) if isinstance(a, list) else a for a in args])
    except Exception as e:  # noqa: BLE001 - the broken function's symptom
        return "raises", type(e).__name__


def _fmt_call(fname: str, args: tuple) -> str:
    return f"{fname}({', '.join(repr(a) for a in args)})"


# ---- the visible reproduction script --------------------------------------------------------------

REPRO_PATH = "repro.py"  # at the workspace root: `python repro.py`, a command with nothing to copy
REPRO_OK = "ok"


def repro_text(bugs: Sequence[dict]) -> str:
    """`repro.py`: runs each bug's reported call and prints `ok` when every result is the wanted one,
    else `got X, want Y` for the first that is not (exit code 1). It holds only what the problem
    statement says (the call and the wanted value), so it gives the agent a check of its edit, not the
    hidden tests' other cases."""
    imports = sorted({b["import"] for b in bugs})
    checks = ",\n    ".join(f"(lambda: {b['call']}, {b['want']!r})" for b in bugs)
    return (f'"""Reproduces the reported bug: prints {REPRO_OK} once it is fixed."""\n'
            + "\n".join(imports) + "\n\n"
            + f"CHECKS = [\n    {checks},\n]\n\n"
            + "for call, want in CHECKS:\n"
            + "    try:\n"
            + "        got = repr(call())\n"
            + "    except Exception as e:  # the symptom may be an exception\n"
            + "        got = 'raises ' + type(e).__name__\n"
            + "    if got != want:\n"
            + "        print('got ' + got + ', want ' + want)\n"
            + "        raise SystemExit(1)\n"
            + f"print({REPRO_OK!r})\n")


def run_repro(text: str, module_texts: dict[str, str]) -> str:
    """What `repro.py` (`text`) prints against the given package modules ({import path 'pkg.mod':
    source}), run on the host without importing anything: the demonstrator's prediction of a
    candidate edit's check (the sandbox run is the authority; generated code only)."""
    import contextlib
    import io

    ns_by_mod = {m: _exec_module(src) for m, src in module_texts.items()}
    body = []
    for ln in text.splitlines():
        m = re.fullmatch(r"from (\S+) import (.+)", ln)
        if m:
            body += [f"{n.strip()} = __mods[{m.group(1)!r}][{n.strip()!r}]" for n in m.group(2).split(",")]
        else:
            body.append(ln)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile("\n".join(body), "<repro>", "exec"), {"__mods": ns_by_mod})  # generated code only
        except SystemExit:
            pass
    return out.getvalue().strip()


# ---- candidates ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Candidate:
    stream: str
    seed: int
    difficulty: int
    package: str
    pristine: dict[str, str]  # workspace path -> text (package files)
    broken: dict[str, str]
    tests: dict[str, str]  # hidden test file path -> text
    f2p: list[str]
    p2p: list[str]
    bugs: list[dict]
    statement: str


def _unique_old(text: str, lines: list[str], i: int, n: int) -> tuple[str, int]:
    """Shortest run of lines lines[j:i+n] (j <= i) occurring exactly once in `text`; (string, j)."""
    for j in range(i, -1, -1):
        old = "\n".join(lines[j:i + n])
        if text.count(old) == 1:
            return old, j
    return "\n".join(lines[:i + n]), 0


def make_candidate(stream: str, seed: int, difficulty: int, docstrings: bool = False,
                   repro: bool = False, ambiguous: float = 0.0) -> Candidate | None:
    """One generated task from its seed (None if this seed gives no valid bug). `docstrings`: every
    function states its intended behaviour (always at difficulty 3), so the fix follows from reading
    the code rather than from arithmetic on the statement's numbers. `repro`: the repository also holds
    `repro.py` (`repro_text`), a visible check of the statement's call; drawn after everything else, so
    the package, tests and statement are those of `repro=False`. `ambiguous` = q > 0 (difficulty 0
    only): the imitation-gap variant, a `pick_mul` (probability q) or `pick_sub` function whose operator
    became `+`, stated without the wanted value (PICK_ARCHETYPES); 0 leaves every draw as it was."""
    if ambiguous and (difficulty != 0 or not 0.0 < ambiguous < 1.0 or docstrings):
        raise ValueError(f"ambiguous needs difficulty 0, no docstrings and 0 < q < 1; got difficulty {difficulty}, "
                         f"docstrings {docstrings}, q {ambiguous}")
    split = "eval" if stream == "eval" else "train"
    vocab = VOCAB[split]
    rng = random.Random(seed)
    pkg = rng.choice(vocab["package"])
    n_mods = {0: 1, 1: 1, 2: 2, 3: 3}[difficulty]
    mods = rng.sample(vocab["module"], n_mods)
    used: set[str] = set()
    funcs: dict[str, list[Func]] = {}
    for mi, mod in enumerate(mods):
        nf = 1 if difficulty == 0 else rng.randint(2, 3)
        doc = difficulty >= 3 or docstrings
        funcs[mod] = [_make_pick_func(rng, split, used, ambiguous) if ambiguous else _make_func(rng, vocab, used, doc)
                      for _ in range(nf)]
    for fs in funcs.values():
        for f in fs:
            kinds = _kinds(f)
            seen = set()
            while len(f.cases) < 3:
                c = tuple(_rand_arg(k, rng) for k in kinds)
                if repr(c) not in seen:
                    seen.add(repr(c))
                    f.cases.append(c)
    # where the bugs go
    if difficulty in (0, 1):
        plan = [(mods[0], "mutate")]
    elif difficulty == 2:
        plan = [(mods[0], "mutate"), (mods[0], "mutate")]
    else:
        plan = [(mods[0], "stub"), (mods[1], "mutate")]
    targets: list[tuple[str, Func, str]] = []
    for mod, how in plan:
        pool = [f for f in funcs[mod] if f not in [t[1] for t in targets]]
        if not pool:
            return None
        targets.append((mod, rng.choice(pool), how))
    # Difficulty 0 varies where the function starts (no header, a comment line, or a module docstring),
    # so the line to edit must be read from the code: a fixed "2s/-/+/" guess would fix a quarter of them.
    header = {mod: (rng.choice(["", f"# {pkg}/{mod}.py\n", f'"""The {mod} helpers of {pkg}."""\n\n\n'])
                    if difficulty == 0 else "") for mod in funcs}
    pristine_mod = {mod: header[mod] + module_text(fs) for mod, fs in funcs.items()}
    broken_funcs = {mod: [dataclasses.replace(f, lines=list(f.lines)) for f in fs] for mod, fs in funcs.items()}
    bugs: list[dict] = []
    for mod, f, how in targets:
        bf = next(x for x in broken_funcs[mod] if x.name == f.name)
        gold_ns = _exec_module(pristine_mod[mod])
        if how == "stub":
            bf.lines = _stub_lines(f)
            kind, changed = "stub", (2, len(f.lines))  # pristine lines [2:] became one raise line
        else:
            muts = mutations(f)
            if difficulty == 0:  # operators and comparisons only: the fix copies no name or constant
                muts = [m for m in muts if m.kind in ("operator", "comparison")]
            if ambiguous:  # the function's one operator becomes `+` (both pick archetypes' bug)
                muts = [m for m in muts if m.line == 1 and m.kind == "operator"]
            rng.shuffle(muts)
            kinds = sorted({m.kind for m in muts})
            rng.shuffle(kinds)  # a kind first, uniformly: off-by-one sites would dominate otherwise
            muts.sort(key=lambda m: kinds.index(m.kind))
            chosen = None
            for mu in muts:
                trial = list(f.lines)
                trial[mu.line] = mu.new_line
                try:
                    ns = _exec_module("\n".join(trial) + "\n")
                except SyntaxError:
                    continue
                if any(_call(ns[f.name], c) != _call(gold_ns[f.name], c) for c in f.cases):
                    chosen = mu
                    break
                extra = [tuple(_rand_arg(k, rng) for k in _kinds(f)) for _ in range(20)]
                diff = next((c for c in extra if _call(ns[f.name], c) != _call(gold_ns[f.name], c)), None)
                if diff is not None:
                    f.cases.append(diff)
                    chosen = mu
                    break
            if chosen is None:
                return None
            bf.lines[chosen.line] = chosen.new_line
            kind, changed = chosen.kind, (chosen.line, chosen.line + 1)
        bugs.append({"module": mod, "function": f.name, "kind": kind, "lines": changed})
    broken_mod = {mod: header[mod] + module_text(fs) for mod, fs in broken_funcs.items()}
    # symptoms (checked on the host; the sandbox run below is the authority)
    sentences = []
    for b in bugs:
        mod = b["module"]
        g = _exec_module(pristine_mod[mod])[b["function"]]
        x = _exec_module(broken_mod[mod])[b["function"]]
        f = next(y for y in funcs[mod] if y.name == b["function"])
        case = next((c for c in f.cases if _call(x, c) != _call(g, c)), None)
        if case is None:
            return None
        got, want = _call(x, case), _call(g, case)
        if want[0] != "ok":
            return None
        call = _fmt_call(f.name, case)
        imp = f"from {pkg}.{mod} import {f.name}"
        shown = f"returns {got[1]!r}" if got[0] == "ok" else f"raises {got[1]}"
        if ambiguous:  # the symptom without the value that would tell the two fixes apart
            sentences.append(f"In `{pkg}/{mod}.py`, `{imp}; {call}` returns the wrong value.")
        # The file is named in a backtick-quoted span: byte-level BPE then tokenises its words exactly
        # as in a tool argument ('"pkg/mod.py"'), so reading it is a copy. In "from pkg.mod" the words
        # carry a leading space ("Ġpkg"), a different token than in the path: not a copy.
        else:
            sentences.append(f"In `{pkg}/{mod}.py`, `{imp}; {call}` {shown}; it should return {want[1]!r}.")
        b.update({"path": f"{pkg}/{mod}.py", "call": call, "import": imp, "got": repr(got[1]) if got[0] == "ok"
                  else f"raises {got[1]}", "want": repr(want[1])})
    statement = " ".join(sentences) + " Fix the code."
    # hidden tests: one test function per function, 3+ asserts each
    test_path = f"tests/test_{pkg}.py"
    lines = [f"from {pkg}.{mod} import {', '.join(f.name for f in fs)}" for mod, fs in funcs.items()]
    f2p, p2p = [], []
    bugged = {(b["module"], b["function"]) for b in bugs}
    for mod, fs in funcs.items():
        ns = _exec_module(pristine_mod[mod])
        for f in fs:
            tname = f"test_{mod}_{f.name}"
            lines += ["", "", f"def {tname}():"]
            for c in f.cases:
                st, val = _call(ns[f.name], c)
                if st != "ok":
                    return None
                lines.append(f"    assert {_fmt_call(f.name, c)} == {val!r}")
            (f2p if (mod, f.name) in bugged else p2p).append(f"{test_path}::{tname}")
    tests = {test_path: "\n".join(lines) + "\n"}
    repro = {REPRO_PATH: repro_text(bugs)} if repro else {}  # visible, the same in both states (in no patch)
    pristine = {f"{pkg}/__init__.py": "", **{f"{pkg}/{m}.py": t for m, t in pristine_mod.items()}, **repro}
    broken = {f"{pkg}/__init__.py": "", **{f"{pkg}/{m}.py": t for m, t in broken_mod.items()}, **repro}
    # the edits a scripted expert makes (search_replace, applied in order): must give back pristine
    work = dict(broken)
    for b in bugs:
        f = next(y for y in funcs[b["module"]] if y.name == b["function"])
        bf = next(y for y in broken_funcs[b["module"]] if y.name == b["function"])
        text = work[b["path"]]
        blines = text.split("\n")
        start = blines.index(bf.lines[0])  # the def line (function names are unique in a package)
        if b["kind"] == "stub":
            i, n_old = start + 2, 1
            new_lines = f.lines[2:]
        else:
            i, n_old = start + b["lines"][0], 1
            new_lines = [f.lines[b["lines"][0]]]
        old, j = _unique_old(text, blines, i, n_old)
        new = "\n".join(blines[j:i] + new_lines)
        if text.count(old) != 1:
            return None
        work[b["path"]] = text.replace(old, new, 1)
        b["old"], b["new"] = old, new
        del b["lines"]
    if work != pristine:
        return None
    return Candidate(stream, seed, difficulty, pkg, pristine, broken, tests, f2p, p2p, bugs, statement)
