"""Text helpers of the agent tools that need no sandbox: the to-do list's rendering, offline BM25
ranking (`codebase_search`) and a static Python lint (`read_lints`)."""
from __future__ import annotations

import ast
import math
import re
from collections import Counter
from typing import Mapping, Sequence


def format_todos(todos: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(f"- [{t['status']}] {t['id']}: {t['content']}" for t in todos)


# ---- offline search and lints --------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def _terms(text: str) -> list[str]:
    """Identifiers split on snake_case and camelCase, lower-cased."""
    out = []
    for w in _WORD.findall(text):
        parts = [p for p in re.split(r"_|(?<=[a-z0-9])(?=[A-Z])", w) if p]
        out += [p.lower() for p in parts]
        if len(parts) > 1:
            out.append(w.lower())
    return out


def bm25_rank(query: str, docs: Sequence[str], k: int, k1: float = 1.2, b: float = 0.75) -> list[tuple[int, float]]:
    """Top-`k` (doc index, BM25 score) for `query`; documents with score 0 are dropped."""
    q = set(_terms(query))
    if not q or not docs:
        return []
    tfs = [Counter(_terms(d)) for d in docs]
    lens = [sum(t.values()) for t in tfs]
    avg = sum(lens) / len(lens) or 1.0
    n = len(docs)
    df = {t: sum(1 for tf in tfs if t in tf) for t in q}
    scores = []
    for i, tf in enumerate(tfs):
        s = 0.0
        for t in q:
            f = tf.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * lens[i] / avg))
        if s > 0:
            scores.append((i, s))
    scores.sort(key=lambda x: (-x[1], x[0]))
    return scores[:k]


def lint_python(src: str, path: str = "<file>") -> list[tuple[int, str]]:
    """Syntax errors, undefined names and unused imports of one module (static: nothing is executed)."""
    try:
        tree = ast.parse(src, path)
        compile(tree, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        return [(e.lineno or 0, f"SyntaxError: {e.msg}")]
    except (ValueError, RecursionError) as e:
        return [(0, f"cannot parse: {e}")]
    import builtins

    defined = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__builtins__", "__spec__", "__path__"}
    imported: dict[str, int] = {}
    used: set[str] = set()
    star = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for al in node.names:
                if al.name == "*":
                    star = True
                    continue
                nm = (al.asname or al.name).split(".")[0]
                defined.add(nm)
                imported.setdefault(nm, node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            args = node.args if not isinstance(node, ast.ClassDef) else None
            if args is not None:
                for x in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                    if x is not None:
                        defined.add(x.arg)
        elif isinstance(node, ast.Lambda):
            for x in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                defined.add(x.arg)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                defined.add(node.id)
            else:
                used.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            defined.update(node.names)
        elif isinstance(node, ast.alias):
            pass
        elif isinstance(node, ast.MatchAs) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.Attribute):
            pass
    exported = set()
    for node in ast.walk(tree):  # names listed in __all__ count as used
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                exported |= {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    problems = []
    if not star:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in defined:
                problems.append((node.lineno, f"undefined name {node.id!r}"))
    if not path.endswith("__init__.py"):
        for nm, ln in imported.items():
            if nm not in used and nm not in exported:
                problems.append((ln, f"{nm!r} imported but unused"))
    lines = src.splitlines()
    return sorted({(ln, m) for ln, m in problems if not (0 < ln <= len(lines) and "# noqa" in lines[ln - 1])})
