"""Synthesised SFT chat examples from real code documents (offline, deterministic).

Two kinds, both checkable by construction:

- ``implement``: the user gives a function's signature and docstring (body elided) and asks for
  the implementation; the assistant answers with the original function source.
- ``edit_diff``: the user shows a file in which one documented function's body has been replaced
  by ``raise NotImplementedError`` (the whole file, or for a long file the numbered lines around
  the stub) and asks for that function to be implemented; the assistant answers with the unified
  diff (``--- a/PATH`` / ``+++ b/PATH``) against the whole file that restores the original.
  Applying the answer with ``git apply``/``patch`` gives back the real file.

Each example is a Document of kind ``chat`` (JSON ``{"messages": [...], "tools": []}``) that keeps
the package, path and licence of the file it came from, so the held-out split applies to it too.
Selection is deterministic: candidates are ordered by a hash of (file sha256, function name) and
the first `max_examples` per kind are kept (minus the rare one that fails a late check), which
spreads examples across packages.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import json
import textwrap
from typing import Callable, Iterable, Iterator

from c2jax.data.documents import Document

SYSTEM = "You are an expert Python programmer. Answer with code only."
KINDS = ("implement", "edit_diff")


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) for functions and methods that have a docstring and a real body."""

    def visit(node: ast.AST, prefix: str):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ClassDef):
                yield from visit(ch, f"{prefix}{ch.name}.")
            elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if ast.get_docstring(ch) and len(ch.body) >= 2 and ch.end_lineno is not None:
                    yield f"{prefix}{ch.name}", ch

    yield from visit(tree, "")


def _key(doc: Document, qual: str, kind: str) -> str:
    return hashlib.sha256(f"{kind}:{doc.sha256}:{qual}".encode()).hexdigest()


def _chat(user: str, answer: str) -> str:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user},
            {"role": "assistant", "content": answer}]
    return json.dumps({"messages": msgs, "tools": []}, ensure_ascii=False, sort_keys=True)


def stub_function(lines: list[str], fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The file's lines with `fn`'s body after the docstring replaced by `raise NotImplementedError`."""
    first_stmt = fn.body[1]
    start = first_stmt.lineno - 1
    if first_stmt.lineno == fn.body[0].end_lineno:  # docstring and code on one line: give up
        return []
    end = fn.end_lineno
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    return lines[:start] + [f"{indent}raise NotImplementedError\n"] + lines[end:]


def implement_example(doc: Document, lines: list[str], qual: str, fn, max_chars: int) -> Document | None:
    start = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
    src = "".join(lines[start:fn.end_lineno])
    if len(src) > max_chars:
        return None
    src = textwrap.dedent(src)
    doc_end = fn.body[0].end_lineno
    head = textwrap.dedent("".join(lines[start:doc_end]))
    if not head.strip() or head == src:
        return None
    user = (f"Implement `{qual}` from `{doc.path}` ({doc.package}). Signature and docstring:\n\n"
            f"```python\n{head.rstrip()}\n    ...\n```")
    return Document(_chat(user, f"```python\n{src.rstrip()}\n```"), "sft_synth", doc.package,
                    f"{doc.path}::{qual}#implement", doc.licence, kind="chat", vendored_in=doc.vendored_in,
                    origin_sha256=doc.sha256)


EXCERPT_CONTEXT = 12  # lines shown around the stub when the whole file is too long


def edit_diff_example(doc: Document, lines: list[str], qual: str, fn, max_file_chars: int) -> Document | None:
    """File-level edit request: the stubbed file (or, for a long file, the lines around the stub,
    numbered as in the file) and the unified diff against the WHOLE file as the answer."""
    if not doc.text.endswith("\n"):
        return None
    before = stub_function(lines, fn)
    if not before:
        return None
    diff = "".join(difflib.unified_diff(before, lines, fromfile=f"a/{doc.path}", tofile=f"b/{doc.path}", n=3))
    if not diff:
        return None
    whole = "".join(before)
    if len(whole) <= max_file_chars:
        shown, where = whole, f"`{doc.path}`"
    else:
        first = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
        stub_end = fn.body[1].lineno  # the stub line, 0-based index stub_end - 1, in `before`
        a, b = max(0, first - EXCERPT_CONTEXT), min(len(before), stub_end + EXCERPT_CONTEXT)
        shown = "".join(before[a:b])
        if len(shown) > max_file_chars:
            return None
        where = f"lines {a + 1}-{b} of `{doc.path}`"
    summary = next((ln.strip() for ln in (ast.get_docstring(fn) or "").splitlines() if ln.strip()), "see its docstring")
    user = (f"Here are {where} from {doc.package}:\n\n```python\n{shown}```\n\n"
            f"`{qual}` is a stub. Implement it ({summary}). Answer with a unified diff against the file.")
    return Document(_chat(user, diff), "sft_synth", doc.package, f"{doc.path}::{qual}#edit_diff", doc.licence,
                    kind="chat", vendored_in=doc.vendored_in, origin_sha256=doc.sha256)


def _cheap_ok(kind: str, doc: Document, lines: list[str], fn, max_function_chars: int) -> bool:
    """The checks of `implement_example` / `edit_diff_example` that need no rendering."""
    if fn.body[1].lineno == fn.body[0].end_lineno:  # docstring and code on one line
        return False
    if kind == "implement":
        start = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
        return sum(len(x) for x in lines[start:fn.end_lineno]) <= max_function_chars
    return doc.text.endswith("\n")


def synthesize(docs: Callable[[], Iterable[Document]], kinds: Iterable[str] = KINDS, max_examples: int = 2000,
               max_function_chars: int = 2000, max_file_chars: int = 6000) -> Iterator[Document]:
    """Up to `max_examples` examples of each kind from Python source documents.

    `docs` returns a fresh iterator over the source documents (it is read twice: once to rank
    every candidate function by hash, once to build the chosen examples), so memory holds only
    (key, document number, function name) per candidate, never the corpus.
    """
    kinds = list(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown sft_synth kinds {bad}; known: {list(KINDS)}")
    cands: dict[str, list[tuple[str, int, str]]] = {k: [] for k in kinds}
    for i, doc in enumerate(docs()):
        if doc.kind != "text" or not doc.path.endswith(".py"):
            continue
        try:
            tree = ast.parse(doc.text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        lines = doc.text.splitlines(keepends=True)
        for qual, fn in _functions(tree):
            for k in kinds:
                if _cheap_ok(k, doc, lines, fn, max_function_chars):
                    cands[k].append((_key(doc, qual, k), i, qual))
    chosen: dict[int, list[tuple[str, str, str]]] = {}
    for k in kinds:
        for key, i, qual in sorted(cands[k])[:max_examples]:
            chosen.setdefault(i, []).append((key, k, qual))
    del cands
    for i, doc in enumerate(docs()):
        if i not in chosen:
            continue
        lines = doc.text.splitlines(keepends=True)
        fns = dict(_functions(ast.parse(doc.text)))
        for _, k, qual in sorted(chosen[i]):
            if k == "implement":
                ex = implement_example(doc, lines, qual, fns[qual], max_function_chars)
            else:
                ex = edit_diff_example(doc, lines, qual, fns[qual], max_file_chars)
            if ex is not None:
                yield ex
