"""Bug injection and feature deletion as span edits located by the AST (formatting is kept).

No `ast.unparse`: every edit replaces the exact source span of one node (line/column offsets from
the parser, columns in UTF-8 bytes) with a small replacement text, so a single-site gold patch
touches only the mutated lines.

Operators (`Mutation.kind`):
  operator      a + b -> a - b, * <-> /, and <-> or, ...
  comparison    < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not
  constant      small int n -> n + 1 (0 <-> 1), True <-> False
  off_by_one    an index/slice/range bound e -> e + 1 (or - 1)
  swap_args     f(a, b, ...) -> f(b, a, ...)
  remove_stmt   delete one simple statement of a function body (an assignment, augmented
                assignment, call or return); a body left empty gets `pass`
Feature deletion (`delete_bodies`): function/method bodies replaced by `raise NotImplementedError`
after the signature and docstring, so the module still imports.
"""
from __future__ import annotations

import ast
import dataclasses
import random
from typing import Iterator

KINDS = ("operator", "comparison", "constant", "off_by_one", "swap_args", "remove_stmt")

_BINOP_SWAP = {ast.Add: "-", ast.Sub: "+", ast.Mult: "/", ast.Div: "*", ast.FloorDiv: "*",
               ast.Mod: "//", ast.BitAnd: "|", ast.BitOr: "&", ast.LShift: ">>", ast.RShift: "<<"}
_BINOP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
               ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>"}
_CMP_SWAP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace bytes [start, end) of a file's UTF-8 source with `text`."""

    path: str
    start: int
    end: int
    text: str


@dataclasses.dataclass(frozen=True)
class Mutation:
    path: str
    kind: str
    edits: tuple[Edit, ...]
    function: str  # qualified name of the enclosing function ("" at module level)
    line: int


class _Source:
    """A file's text with (line, byte col) -> byte offset conversion."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self.line_starts = [0]
        for i, b in enumerate(self.data):
            if b == 10:
                self.line_starts.append(i + 1)

    def off(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def seg(self, a: int, b: int) -> str:
        return self.data[a:b].decode("utf-8")


def apply_edits(text: str, edits: list[Edit]) -> str:
    """Apply non-overlapping byte-span edits to `text` (edits of one file)."""
    data = text.encode("utf-8")
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        data = data[:e.start] + e.text.encode("utf-8") + data[e.end:]
    return data.decode("utf-8")


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}{child.name}"
                yield q, child
                yield from walk(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
    yield from walk(tree, "")


def _op_span(src: _Source, left: ast.AST, right: ast.AST, op_text: str) -> tuple[int, int] | None:
    """Byte span of the operator token between two operand nodes."""
    a, b = src.span(left)[1], src.span(right)[0]
    between = src.seg(a, b)
    i = between.find(op_text)
    if i < 0:
        return None
    # make sure we matched the whole token (e.g. '<' not the start of '<=')
    j = i + len(op_text)
    if j < len(between) and between[j] in "=<>/*":
        return None
    return a + len(between[:i].encode()), a + len(between[:j].encode())


def candidates(path: str, text: str) -> list[Mutation]:
    """Every single-site mutation of one file, in source order (inside functions only)."""
    src = _Source(text)
    tree = ast.parse(text)
    out: list[Mutation] = []
    docstrings = set()
    for _, fn in _functions(tree):
        if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
            docstrings.add(id(fn.body[0].value))
    for qual, fn in _functions(tree):
        inner = {id(n) for _, f2 in _functions(fn) for n in ast.walk(f2)}  # nested defs get their own pass
        for node in ast.walk(fn):
            if id(node) in inner or node is fn:
                if node is not fn:
                    continue
            line = getattr(node, "lineno", fn.lineno)

            def add(kind, edits):
                out.append(Mutation(path, kind, tuple(edits), qual, line))

            if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
                sp = _op_span(src, node.left, node.right, _BINOP_TEXT[type(node.op)])
                if sp:
                    add("operator", [Edit(path, sp[0], sp[1], _BINOP_SWAP[type(node.op)])])
            elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
                old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
                sp = _op_span(src, node.values[0], node.values[1], old)
                if sp:
                    add("operator", [Edit(path, sp[0], sp[1], new)])
            elif isinstance(node, ast.Compare) and len(node.ops) == 1:
                op = node.ops[0]
                if type(op) in _CMP_SWAP:
                    old, new = _CMP_SWAP[type(op)]
                    sp = _op_span(src, node.left, node.comparators[0], old)
                    if sp:
                        add("comparison", [Edit(path, sp[0], sp[1], new)])
                elif isinstance(op, (ast.IsNot, ast.NotIn)):
                    a, b = src.span(node.left)[1], src.span(node.comparators[0])[0]
                    between = src.seg(a, b)
                    word = "is not" if isinstance(op, ast.IsNot) else "not in"
                    i = between.find(word)
                    if i >= 0:
                        s = a + len(between[:i].encode())
                        add("comparison", [Edit(path, s, s + len(word), word.replace(" not", "").replace("not ", ""))])
            elif isinstance(node, ast.Constant) and id(node) not in docstrings:
                v = node.value
                s, e = src.span(node)
                if isinstance(v, bool):
                    add("constant", [Edit(path, s, e, "False" if v else "True")])
                elif isinstance(v, int) and 0 <= v <= 64 and src.seg(s, e).isdigit():
                    add("constant", [Edit(path, s, e, str(v + 1) if v != 1 else "0")])
            elif isinstance(node, ast.Subscript):
                sl = node.slice
                targets = [sl] if not isinstance(sl, (ast.Slice, ast.Tuple)) else \
                    ([x for x in (sl.lower, sl.upper) if x is not None] if isinstance(sl, ast.Slice) else [])
                for t in targets:
                    if isinstance(t, (ast.Name, ast.BinOp, ast.Constant, ast.Attribute, ast.UnaryOp)) and \
                            not (isinstance(t, ast.Constant) and not isinstance(t.value, int)):
                        s, e = src.span(t)
                        add("off_by_one", [Edit(path, s, e, f"{src.seg(s, e)} + 1")])
            elif isinstance(node, ast.Call):
                args = node.args
                if isinstance(node.func, ast.Name) and node.func.id == "range" and args:
                    t = args[-1] if len(args) <= 2 else args[1]
                    s, e = src.span(t)
                    add("off_by_one", [Edit(path, s, e, f"{src.seg(s, e)} - 1")])
                if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                    s0, e0 = src.span(args[0])
                    s1, e1 = src.span(args[1])
                    t0, t1 = src.seg(s0, e0), src.seg(s1, e1)
                    if t0 != t1 and "\n" not in t0 + t1:
                        add("swap_args", [Edit(path, s0, e0, t1), Edit(path, s1, e1, t0)])
        for body in _bodies(fn):
            stmts = [s for s in body if isinstance(s, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr))
                     and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            for st in stmts:
                if st.lineno != st.end_lineno:
                    continue
                s = src.off(st.lineno, 0)
                e = src.line_starts[st.end_lineno] if st.end_lineno < len(src.line_starts) else len(src.data)
                line_text = src.seg(s, e)
                if ";" in line_text:
                    continue
                alone = len([b for b in body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]) == 1
                indent = line_text[:len(line_text) - len(line_text.lstrip())]
                new = f"{indent}pass\n" if alone else ""
                out.append(Mutation(path, "remove_stmt", (Edit(path, s, e, new),), qual, st.lineno))
    return out


def _bodies(fn: ast.AST) -> Iterator[list[ast.stmt]]:
    """Statement lists inside a function (not inside nested defs)."""
    stack = [fn]
    while stack:
        node = stack.pop()
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body
                for s in body:
                    if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        stack.append(s)
        for h in getattr(node, "handlers", []) or []:
            stack.append(h)


def sample(muts: list[Mutation], rng: random.Random, kind: str | None = None) -> Mutation | None:
    pool = [m for m in muts if kind is None or m.kind == kind]
    return rng.choice(pool) if pool else None


# ---- feature deletion ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Deletable:
    path: str
    function: str
    lines: int  # body lines removed
    edit: Edit
    docstring: str


def deletable_functions(path: str, text: str, min_lines: int = 3) -> list[Deletable]:
    """Functions/methods whose body (after the docstring) can be replaced by a NotImplementedError."""
    src = _Source(text)
    tree = ast.parse(text)
    out = []
    for qual, fn in _functions(tree):
        body = fn.body
        doc = ""
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc = body[0].value.value
            body = body[1:]
        if not body or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn)):
            continue  # generators would stop being generators
        if body[0].lineno == fn.lineno:
            continue  # one-line def
        start = src.off(body[0].lineno, 0)
        end_line = body[-1].end_lineno
        end = src.line_starts[end_line] if end_line < len(src.line_starts) else len(src.data)
        n = end_line - body[0].lineno + 1
        if n < min_lines:
            continue
        first = src.seg(start, src.line_starts[body[0].lineno] if body[0].lineno < len(src.line_starts) else len(src.data))
        indent = first[:len(first) - len(first.lstrip())]
        new = f"{indent}raise NotImplementedError({qual.split('.')[-1]!r})\n"
        out.append(Deletable(path, qual, n, Edit(path, start, end, new), doc))
    return out
