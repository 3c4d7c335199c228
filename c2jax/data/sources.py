"""Corpus sources: named components (registry `SOURCES`) that list candidate documents.

A source yields `Candidate`s (metadata plus a lazy `load()`), so the corpus builder can filter by
licence and package and apply size caps BEFORE reading a file. Every candidate names its source,
package (PEP 503-normalised distribution name, or ``stdlib:<module>``), path relative to its root
(so manifests hash the same on any machine), licence (read from package metadata) and kind
(``text`` or ``chat``: a JSON ``{"messages": [...], "tools": [...]}`` rendered by `chat_format`).

Built-in sources (config ``data.sources.<name>``; every source takes ``weight``, ``max_bytes``,
``held_out_max_bytes``):

    stdlib_code     Python source of the standard library (one document per module file;
                    ``root`` points at another library tree, ``skip`` names top-level dirs to skip)
    package_code    Python source of installed distributions (``packages``: names or globs,
                    ``exclude``; ``site_dirs`` searches other site-packages instead of sys.path)
    package_docs    natural-language text: docstrings of those modules (signature + docstring),
                    the distributions' long descriptions (README) and .md/.rst/.txt files
    transcripts     chat/agent transcripts from JSONL files (``paths``; ``licence`` asserted by
                    the user), OpenAI-shaped messages; the slot SFT and the RL cold start use
    sft_synth       chat examples synthesised from the accepted code documents
                    (`synth.py`): signature+docstring -> implementation, file-level edit
                    request -> unified diff

Vendored copies (``_vendor/``, ``vendor/``, ``_vendored/``, ``extern/``, ``third_party/``) are
attributed to the vendored package (``pip/_vendor/rich/x.py`` is package ``rich``), so the held-out
split can find them; by default they are dropped altogether (``data.vendored = 'drop'``).
"""
from __future__ import annotations

import ast
import fnmatch
import hashlib
import importlib.metadata as md
import json
import os
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from c2jax.config import cfg_get
from c2jax.data import licences
from c2jax.data.documents import Candidate, Document
from c2jax.registry import Registry

VENDOR_DIRS = ("_vendor", "vendor", "_vendored", "vendored", "extern", "_extern", "third_party", "_bundled")
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", ".git"}
STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "config-3.11-x86_64-linux-gnu",
               "tkinter", "pydoc_data", "venv"}
DOC_EXTS = (".md", ".rst", ".txt")
DOC_SKIP_NAMES = re.compile(r"(licen[cs]e|copying|notice|authors|record|wheel|metadata|top_level|entry_points"
                            r"|installer|requested|direct_url|dependency_links|sources|not-zip-safe)", re.I)


def normalize_package(name: str) -> str:
    """PEP 503 name normalisation ('Typing_Extensions' -> 'typing-extensions'); stdlib:X kept."""
    if name.startswith("stdlib:"):
        return name
    return re.sub(r"[-_.]+", "-", name).lower()


def matches_any(package: str, patterns: Iterable[str]) -> bool:
    """True if `package` equals or glob-matches one of `patterns` (both normalised)."""
    p = normalize_package(package)
    return any(fnmatch.fnmatchcase(p, normalize_package(q)) for q in patterns)


@dataclass
class SourceSpec:
    """A registered source: `list_fn(cfg, ctx)` yields Candidates; `derived` sources instead get
    the accepted documents of other sources through `ctx.documents(name)` and yield Documents."""

    name: str
    list_fn: Callable[[Any, "SourceContext"], Iterable[Any]]
    kind: str = "text"
    derived: bool = False
    description: str = ""


@dataclass
class SourceContext:
    """What a source may consult: global options and documents accepted so far (by source)."""

    max_file_bytes: int = 200_000
    vendored: str = "drop"
    documents: Callable[[str], Iterator[Document]] = lambda name: iter(())  # accepted docs of a source
    dropped: Counter = field(default_factory=Counter)


SOURCES: Registry[SourceSpec] = Registry("data_source")


def register_source(name: str, kind: str = "text", derived: bool = False, description: str = ""):
    def deco(fn):
        SOURCES.register(name, SourceSpec(name, fn, kind, derived, description or (fn.__doc__ or "").strip()))
        return fn

    return deco


def read_text(path: str) -> str | None:
    """UTF-8 text of a file, or None if it is not valid UTF-8 or contains NUL bytes."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def vendored_package(relpath: str) -> tuple[str | None, str | None]:
    """(vendored package, host top-level dir) if `relpath` lies under a vendor directory."""
    parts = relpath.replace(os.sep, "/").split("/")
    for i, p in enumerate(parts[:-1]):
        if p in VENDOR_DIRS and i + 1 < len(parts):
            name = parts[i + 1]
            if name.endswith(".py"):
                name = name[:-3]
            if name == "__init__":
                return None, None
            return normalize_package(name), parts[0]
    return None, None


# ---- standard library --------------------------------------------------------------------------
def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


@register_source("stdlib_code", description="Python source of the standard library")
def stdlib_code(cfg: Any, ctx: SourceContext) -> Iterator[Candidate]:
    root = cfg_get(cfg, "root", "") or stdlib_root()
    skip = set(cfg_get(cfg, "skip", STDLIB_SKIP))
    for rel in _walk_py(root, skip):
        top = rel.split("/")[0]
        top = top[:-3] if top.endswith(".py") else top
        full = os.path.join(root, rel)
        yield Candidate("stdlib_code", f"stdlib:{top}", rel, licences.STDLIB_LICENCE, _size(full),
                        _loader(full))


def _walk_py(root: str, skip: set[str]) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        depth0 = rel_dir == "."
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not (depth0 and d in skip)
                             and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py"):
                out.append(f if depth0 else os.path.join(rel_dir, f).replace(os.sep, "/"))
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _loader(path: str) -> Callable[[], str | None]:
    return lambda: read_text(path)


# ---- installed distributions -------------------------------------------------------------------
@dataclass
class Dist:
    name: str
    licence: licences.Licence
    files: list[tuple[str, str]]  # (path relative to site-packages, absolute path)
    description: str


def installed_dists(patterns: Iterable[str] = ("*",), exclude: Iterable[str] = (),
                    path: list[str] | None = None) -> list[Dist]:
    """Installed distributions whose normalised name matches `patterns` and not `exclude`.

    `path` (a list of site directories) replaces `sys.path` for the search, e.g. another venv.
    """
    patterns, exclude = list(patterns), list(exclude)
    seen: set[str] = set()
    out = []
    dists = md.distributions(path=list(path)) if path else md.distributions()
    for d in sorted(dists, key=lambda d: normalize_package(d.metadata["Name"] or "")):
        name = normalize_package(d.metadata["Name"] or "")
        if not name or name in seen or not matches_any(name, patterns) or matches_any(name, exclude):
            continue
        seen.add(name)
        files = []
        for f in d.files or []:
            rel = str(f).replace(os.sep, "/")
            if rel.startswith("..") or "__pycache__" in rel:
                continue
            files.append((rel, str(d.locate_file(f))))
        desc = d.metadata.get_payload() if hasattr(d.metadata, "get_payload") else ""
        desc = desc or d.metadata.get("Description") or ""
        out.append(Dist(name, licences.from_metadata(d.metadata), sorted(files), str(desc)))
    return out


def _dists(cfg: Any) -> list[Dist]:
    return installed_dists(list(cfg_get(cfg, "packages", ["*"])), list(cfg_get(cfg, "exclude", [])),
                           list(cfg_get(cfg, "site_dirs", [])) or None)


def _dist_candidates(source: str, dist: Dist, ctx: SourceContext, want: Callable[[str], bool]) -> Iterator[Candidate]:
    for rel, full in dist.files:
        if not want(rel):
            continue
        vend, _host = vendored_package(rel)
        if vend is not None:
            if ctx.vendored == "drop":
                ctx.dropped["vendored copy (data.vendored='drop')"] += 1
                continue
            yield Candidate(source, vend, rel, dist.licence.expression, _size(full), _loader(full),
                            vendored_in=dist.name)
        else:
            yield Candidate(source, dist.name, rel, dist.licence.expression, _size(full), _loader(full))


@register_source("package_code", description="Python source of installed distributions")
def package_code(cfg: Any, ctx: SourceContext) -> Iterator[Candidate]:
    for dist in _dists(cfg):
        yield from _dist_candidates("package_code", dist, ctx, lambda rel: rel.endswith(".py"))


# ---- documentation -----------------------------------------------------------------------------
def docstring_text(code: str, module: str) -> str | None:
    """Module, class and function docstrings of `code`, each under its qualified signature."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    parts = []
    doc = ast.get_docstring(tree)
    if doc:
        parts.append(f"Module {module}\n\n{doc}")

    def visit(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{ch.name}"
                d = ast.get_docstring(ch)
                if d:
                    if isinstance(ch, ast.ClassDef):
                        parts.append(f"class {q}\n\n{d}")
                    else:
                        try:
                            sig = ast.unparse(ch.args)
                        except Exception:  # pragma: no cover - unparse is total on parsed code
                            sig = "..."
                        parts.append(f"{q}({sig})\n\n{d}")
                if isinstance(ch, ast.ClassDef):
                    visit(ch, q + ".")

    visit(tree, "")
    return "\n\n\n".join(parts) if parts else None


def _docstring_loader(path: str, module: str) -> Callable[[], str | None]:
    def load():
        code = read_text(path)
        if code is None:
            return None
        text = docstring_text(code, module)
        return None if text is None else (text, hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest())

    return load


def _module_name(rel: str) -> str:
    m = rel[:-3] if rel.endswith(".py") else rel
    m = m.replace("/", ".")
    return m[: -len(".__init__")] if m.endswith(".__init__") else m


@register_source("package_docs", description="docstrings, READMEs and documentation files as natural language")
def package_docs(cfg: Any, ctx: SourceContext) -> Iterator[Candidate]:
    for dist in _dists(cfg):
        if dist.description.strip():
            text = dist.description
            yield Candidate("package_docs", dist.name, f"{dist.name}.dist-info/METADATA#description",
                            dist.licence.expression, len(text.encode()), (lambda t=text: t))
        for c in _dist_candidates("package_docs", dist, ctx, lambda rel: rel.endswith(DOC_EXTS)
                                  and not DOC_SKIP_NAMES.search(os.path.basename(rel))):
            yield c
        where = dict(dist.files)
        for c in _dist_candidates("package_docs", dist, ctx, lambda rel: rel.endswith(".py")):
            full = where[c.path]
            c.load = _docstring_loader(full, _module_name(c.path))
            c.path = c.path + "#docstrings"
            c.size = c.size // 4  # rough share of docstrings in a module (the cap uses real sizes)
            yield c
    if cfg_get(cfg, "include_stdlib", True):
        root = cfg_get(cfg, "stdlib_root", "") or stdlib_root()
        for rel in _walk_py(root, set(STDLIB_SKIP)):
            top = rel.split("/")[0]
            top = top[:-3] if top.endswith(".py") else top
            full = os.path.join(root, rel)
            yield Candidate("package_docs", f"stdlib:{top}", rel + "#docstrings", licences.STDLIB_LICENCE,
                            _size(full) // 4, _docstring_loader(full, _module_name(rel)))


# ---- transcripts -------------------------------------------------------------------------------
def validate_transcript(rec: Any) -> str | None:
    """Reason a JSONL record is not a usable transcript, or None."""
    if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list) or not rec["messages"]:
        return "needs a non-empty 'messages' list"
    for m in rec["messages"]:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            return f"bad message {str(m)[:60]}"
    if not any(m["role"] == "assistant" for m in rec["messages"]):
        return "has no assistant message (nothing to train on)"
    return None


@register_source("transcripts", kind="chat", description="chat/agent transcripts from JSONL files")
def transcripts(cfg: Any, ctx: SourceContext) -> Iterator[Candidate]:
    paths = list(cfg_get(cfg, "paths", []))
    default_licence = cfg_get(cfg, "licence", licences.UNKNOWN)
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"data.sources.transcripts.paths: {path} does not exist")
        stem = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n + 1}: not JSON ({e})") from None
                why = validate_transcript(rec)
                if why:
                    raise ValueError(f"{path}:{n + 1}: transcript {why}")
                text = json.dumps({"messages": rec["messages"], "tools": rec.get("tools") or []},
                                  ensure_ascii=False, sort_keys=True)
                yield Candidate("transcripts", normalize_package(rec.get("package") or f"transcripts:{stem}"),
                                f"{os.path.basename(path)}:{n + 1}", rec.get("licence") or default_licence,
                                len(text.encode()), (lambda t=text: t), kind="chat")


# ---- synthesised SFT ---------------------------------------------------------------------------
@register_source("sft_synth", kind="chat", derived=True,
                 description="chat examples synthesised from accepted code documents")
def sft_synth(cfg: Any, ctx: SourceContext) -> Iterator[Document]:
    from c2jax.data.synth import synthesize

    from_sources = list(cfg_get(cfg, "from_sources", ["stdlib_code", "package_code"]))

    def docs() -> Iterator[Document]:
        for s in from_sources:
            yield from ctx.documents(s)

    yield from synthesize(docs, kinds=list(cfg_get(cfg, "kinds", ["implement", "edit_diff"])),
                          max_examples=int(cfg_get(cfg, "max_examples", 2000)),
                          max_function_chars=int(cfg_get(cfg, "max_function_chars", 2000)),
                          max_file_chars=int(cfg_get(cfg, "max_file_chars", 6000)))
