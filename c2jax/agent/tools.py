"""Cursor-shaped agent tools: JSON Schemas, argument checking, and implementations on a sandbox.

    box = Toolbox(sandbox, ToolConfig())            # or ToolConfig(bash_only=True), ToolConfig(strict=True)
    box.schemas()                                   # OpenAI `tools` list: {type: function, function: {...}}
    res = box.call("read_file", '{"target_file": "pkg/a.py"}')   # ToolResult(content, ok, malformed, error)

Every tool runs against the `c2jax.envs` sandbox interface (host-side read/write/list/glob through the
merged /workspace view, commands inside the sandbox). `call` never raises for anything the model
did wrong: bad JSON, an unknown or disabled tool, a missing, extra (strict mode) or wrong-typed
argument, a path outside the workspace, a failing command: each becomes a `ToolResult` whose
`content` is the message the agent sees (`malformed=True` when the call itself was ill-formed, the
model's fault and counted). Only infrastructure failures (`SandboxError`) propagate: the caller masks
the sample.

Per-environment configuration (`ToolConfig`): drop tools (`disabled`), keep only some (`enabled`),
`strict` argument checks (no unknown arguments, no type coercion: the report's training-only
tightening) and `bash_only` (only `run_terminal_cmd`: the ablation baseline the report guarded
against by a reward when its policy collapsed onto the terminal tool).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import posixpath
import re
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import jsonschema

from c2jax.envs.errors import SandboxError, UnsafePath

# ---- results and configuration ------------------------------------------------------------------


@dataclasses.dataclass
class ToolResult:
    """What a tool call returns to the agent. `content` is the tool message text.

    ok: False when the tool ran but reported failure (command failed, string not found, ...).
    malformed: the call itself was ill-formed (bad JSON, unknown tool, bad arguments): the model's
    fault, shown to it as an error message and counted as a negative.
    """

    content: str
    ok: bool = True
    malformed: bool = False
    error: str | None = None
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """Which tools an environment exposes and how strictly their arguments are checked."""

    enabled: tuple[str, ...] | None = None  # None = every tool in TOOL_NAMES
    disabled: tuple[str, ...] = ()
    bash_only: bool = False
    strict: bool = False  # reject unknown arguments and do not coerce "5" -> 5, "true" -> True
    read_max_lines: int = 2000  # read_file: lines per call
    read_max_bytes: int = 256 * 1024  # read_file: bytes read from the file
    max_line_chars: int = 2000  # read_file / grep: a longer line is cut
    grep_max_matches: int = 50
    glob_max_results: int = 100
    search_max_results: int = 10
    search_max_files: int = 2000
    output_max_chars: int = 20000  # run_terminal_cmd: head + tail kept
    cmd_timeout_s: float = 120.0
    cmd_max_timeout_s: float = 600.0
    compact_declarations: bool = False  # declare only required parameters, no descriptions (tiny contexts)

    def tool_names(self) -> tuple[str, ...]:
        if self.bash_only:
            return ("run_terminal_cmd",)
        names = self.enabled if self.enabled is not None else TOOL_NAMES
        unknown = [n for n in (*names, *self.disabled) if n not in TOOL_NAMES]
        if unknown:
            raise ValueError(f"ToolConfig: unknown tool(s) {unknown}; known: {list(TOOL_NAMES)}")
        return tuple(n for n in names if n not in self.disabled)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ToolConfig":
        d = dict(d or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - fields)
        if bad:
            raise ValueError(f"agent.tools: unknown field(s) {bad}; known: {sorted(fields)}")
        for k in ("enabled", "disabled"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        cfg = cls(**d)
        cfg.tool_names()
        return cfg


# ---- schemas --------------------------------------------------------------------------------------

def _obj(props: dict, required: Sequence[str] = ()) -> dict:
    return {"type": "object", "properties": props, "required": list(required)}


_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
_EXPL = {"type": "string", "description": "One sentence: why this tool is used now."}

SCHEMAS: dict[str, dict] = {
    "read_file": {
        "description": "Read a file of the workspace. Lines are numbered (LINE_NUMBER|TEXT). Use offset/limit "
                       "for large files.",
        "parameters": _obj({"target_file": {**_S, "description": "Workspace-relative path."},
                            "offset": {**_I, "minimum": 1, "description": "First line to read (1-based)."},
                            "limit": {**_I, "minimum": 1, "description": "Number of lines to read."}},
                           ["target_file"])},
    "list_dir": {
        "description": "List the entries of a workspace directory.",
        "parameters": _obj({"target_directory": {**_S, "description": "Workspace-relative directory ('.' = root)."},
                            "explanation": _EXPL}, ["target_directory"])},
    "grep": {
        "description": "Search file contents with a regular expression (Perl syntax). Returns path:line:text "
                       "matches, capped.",
        "parameters": _obj({"pattern": {**_S, "description": "Regular expression."},
                            "path": {**_S, "description": "File or directory to search (default: workspace)."},
                            "include": {**_S, "description": "Only files matching this glob, e.g. '*.py'."},
                            "exclude": {**_S, "description": "Skip files matching this glob."},
                            "case_insensitive": _B,
                            "max_matches": {**_I, "minimum": 1}},
                           ["pattern"])},
    "glob_file_search": {
        "description": "Find files by glob pattern (patterns without '/' match at any depth).",
        "parameters": _obj({"glob_pattern": _S,
                            "target_directory": {**_S, "description": "Directory to search in (default: workspace)."}},
                           ["glob_pattern"])},
    "codebase_search": {
        "description": "Search the codebase for code relevant to a natural-language query (lexical BM25 over "
                       "file chunks).",
        "parameters": _obj({"query": _S,
                            "target_directories": {"type": "array", "items": _S},
                            "explanation": _EXPL}, ["query"])},
    "search_replace": {
        "description": "Replace old_string by new_string in a file. old_string must occur exactly once unless "
                       "replace_all is true.",
        "parameters": _obj({"file_path": _S, "old_string": _S, "new_string": _S, "replace_all": _B},
                           ["file_path", "old_string", "new_string"])},
    "write_file": {
        "description": "Create or overwrite a file with the given contents.",
        "parameters": _obj({"file_path": _S, "contents": _S}, ["file_path", "contents"])},
    "delete_file": {
        "description": "Delete a file of the workspace.",
        "parameters": _obj({"target_file": _S, "explanation": _EXPL}, ["target_file"])},
    "apply_patch": {
        "description": "Apply a unified diff (git format, paths relative to the workspace root, a/ b/ prefixes "
                       "optional).",
        "parameters": _obj({"patch": _S}, ["patch"])},
    "run_terminal_cmd": {
        "description": "Run a shell command in a persistent bash session at the workspace (cwd and variables "
                       "persist). Long-running commands: is_background=true (output goes to a log file).",
        "parameters": _obj({"command": _S, "is_background": _B,
                            "timeout": {"type": "number", "exclusiveMinimum": 0,
                                        "description": "Seconds before the command is killed."},
                            "explanation": _EXPL}, ["command"])},
    "read_lints": {
        "description": "Report syntax errors and lint problems (undefined names, unused imports) of Python files "
                       "(default: the files changed so far).",
        "parameters": _obj({"paths": {"type": "array", "items": _S}})},
    "todo_write": {
        "description": "Create or update the task's to-do list. merge=true updates items by id; merge=false "
                       "replaces the list.",
        "parameters": _obj({"merge": _B, "todos": {"type": "array", "items": _obj(
            {"id": _S, "content": _S,
             "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]}},
            ["id", "content", "status"])}}, ["merge", "todos"])},
}
TOOL_NAMES: tuple[str, ...] = tuple(SCHEMAS)


def _strict_schema(schema: Any) -> Any:
    """The same schema with `additionalProperties: false` on every object (strict mode)."""
    if isinstance(schema, dict):
        out = {k: _strict_schema(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict_schema(v) for v in schema]
    return schema


def compact_schema(params: dict) -> dict:
    """The declaration of a tool's parameters reduced to the required ones, without descriptions
    (the calls the tool accepts are unchanged: argument checking uses the full schema)."""
    req = list(params.get("required", []))
    props = {k: {kk: vv for kk, vv in v.items() if kk != "description"} for k, v in params["properties"].items()
             if k in req}
    return {"type": "object", "properties": props, "required": req}


def openai_tools(names: Sequence[str], strict: bool = False, compact: bool = False) -> list[dict]:
    """OpenAI `tools` entries for `names` (the form sent to endpoints and rendered into the prompt).

    `compact`: only required parameters and no descriptions (a few dozen tokens per tool, for the
    ~1k-token contexts of tiny models; see ToolConfig.compact_declarations)."""
    out = []
    for n in names:
        params = _strict_schema(SCHEMAS[n]["parameters"]) if strict else SCHEMAS[n]["parameters"]
        if compact:
            out.append({"type": "function", "function": {"name": n, "parameters": compact_schema(params)}})
            continue
        out.append({"type": "function", "function": {"name": n, "description": SCHEMAS[n]["description"],
                                                      "parameters": params}})
    return out


# ---- argument checking ----------------------------------------------------------------------------

_VALIDATORS: dict[tuple[str, bool], jsonschema.protocols.Validator] = {}


def _validator(name: str, strict: bool):
    key = (name, strict)
    if key not in _VALIDATORS:
        schema = SCHEMAS[name]["parameters"]
        _VALIDATORS[key] = jsonschema.Draft202012Validator(_strict_schema(schema) if strict else schema)
    return _VALIDATORS[key]


def _coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    """Lenient mode: numeric strings for integers/numbers, 'true'/'false' for booleans."""
    t = schema.get("type")
    if isinstance(value, str):
        s = value.strip()
        if t == "integer" and re.fullmatch(r"[+-]?\d+", s):
            return int(s)
        if t == "number":
            try:
                f = float(s)
                if math.isfinite(f):
                    return f
            except ValueError:
                pass
        if t == "boolean" and s.lower() in ("true", "false"):
            return s.lower() == "true"
    if t == "integer" and isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    return value


def check_arguments(name: str, arguments: str, strict: bool) -> tuple[dict | None, str | None]:
    """Parse and check a call's raw JSON arguments -> (args, None) or (None, error message)."""
    if not isinstance(arguments, str):
        return None, f"arguments must be a JSON object string, got {type(arguments).__name__}"
    text = arguments.strip()
    if not text and not SCHEMAS[name]["parameters"].get("required"):
        text = "{}"
    try:
        args = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return None, f"arguments are not valid JSON ({e if not isinstance(e, RecursionError) else 'nested too deeply'})"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object, got {type(args).__name__}"
    props = SCHEMAS[name]["parameters"]["properties"]
    if not strict:
        args = {k: (_coerce(v, props[k]) if k in props else v) for k, v in args.items()}
        args = {k: v for k, v in args.items() if k in props}  # unknown arguments ignored
    try:
        errors = sorted(_validator(name, strict).iter_errors(args), key=lambda e: list(e.absolute_path))
    except RecursionError:
        return None, "arguments are nested too deeply"
    if errors:
        msgs = []
        for e in errors[:3]:
            where = ".".join(str(p) for p in e.absolute_path) or "arguments"
            msgs.append(f"{where}: {e.message[:200]}")
        return None, "; ".join(msgs)
    return args, None


def usage(name: str) -> str:
    p = SCHEMAS[name]["parameters"]
    req = set(p.get("required", ()))
    parts = [f"{k}{'' if k in req else '?'}: {v.get('type', 'any')}" for k, v in p["properties"].items()]
    return f"{name}({', '.join(parts)})"


def validate_call(name: Any, arguments: Any, names: Sequence[str], strict: bool = False
                  ) -> tuple[dict | None, ToolResult | None]:
    """-> (checked arguments, None) or (None, the malformed-call message for the agent). Never raises."""
    if not isinstance(name, str) or name not in names:
        shown = repr(name)[:80]
        why = "is not available in this environment" if name in TOOL_NAMES else "does not exist"
        msg = f"Error: tool {shown} {why}. Available tools: {', '.join(names)}."
        return None, ToolResult(msg, ok=False, malformed=True, error="unknown_tool")
    args, err = check_arguments(name, arguments, strict)
    if err is not None:
        return None, ToolResult(f"Error: invalid arguments for {name}: {err}. Usage: {usage(name)}",
                                ok=False, malformed=True, error="bad_arguments")
    return args, None


# ---- the toolbox ----------------------------------------------------------------------------------

TODO_STATUSES = ("pending", "in_progress", "completed", "cancelled")


def _norm_path(path: str) -> str:
    """Workspace-relative path: '/workspace/x' and './x' become 'x'; '.' and '' the root."""
    p = path.strip()
    if p.startswith("/workspace"):
        p = p[len("/workspace"):]
    p = posixpath.normpath(p.lstrip("/")) if p.strip("/") else "."
    return "" if p == "." else p


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and the tail of `text` within `limit` characters."""
    if len(text) <= limit:
        return text, False
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}", True


class Toolbox:
    """The tools of one episode, bound to one sandbox (and its persistent shell and to-do list)."""

    def __init__(self, sandbox: Any, config: ToolConfig | None = None) -> None:
        self.sb = sandbox
        self.config = config or ToolConfig()
        self.names = self.config.tool_names()
        self.todos: list[dict] = []
        self._shell = None
        self._bg = 0
        self._impl: dict[str, Callable[[dict], ToolResult]] = {n: getattr(self, f"_t_{n}") for n in TOOL_NAMES}

    def schemas(self) -> list[dict]:
        return openai_tools(self.names, self.config.strict, self.config.compact_declarations)

    def open_todos(self) -> list[dict]:
        """To-do items not completed or cancelled (carried over a self-summarisation)."""
        return [t for t in self.todos if t["status"] in ("pending", "in_progress")]

    def close(self) -> None:
        if self._shell is not None:
            try:
                self._shell.close()
            except SandboxError:
                pass
            self._shell = None

    # ---- dispatch ----
    def call(self, name: Any, arguments: Any) -> ToolResult:
        """Run one call; never raises for the model's mistakes (see the module docstring)."""
        args, bad = validate_call(name, arguments, self.names, self.config.strict)
        if bad is not None:
            return bad
        try:
            return self._impl[name](args)
        except UnsafePath as e:
            return ToolResult(f"Error: {e}", ok=False, error="unsafe_path")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            return ToolResult(f"Error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), ok=False,
                              error="not_found")
        except SandboxError:
            raise
        except (OSError, ValueError, UnicodeError) as e:
            return ToolResult(f"Error: {type(e).__name__}: {e}", ok=False, error="tool_error")

    # ---- file tools ----
    def _t_read_file(self, a: dict) -> ToolResult:
        c = self.config
        path = _norm_path(a["target_file"])
        data = self.sb.read_file(path, max_bytes=c.read_max_bytes + 1, binary=True)
        cut_bytes = len(data) > c.read_max_bytes
        if b"\0" in data[:8192]:
            return ToolResult(f"Error: {path} is a binary file ({len(data)}+ bytes)", ok=False, error="binary")
        lines = data[: c.read_max_bytes].decode("utf-8", errors="replace").splitlines()
        start = a.get("offset", 1)
        n = min(a.get("limit", c.read_max_lines), c.read_max_lines)
        if not lines:
            return ToolResult(f"{path} is empty.")
        if start > len(lines):
            return ToolResult(f"Error: offset {start} is past the end of {path} ({len(lines)} lines)", ok=False,
                              error="bad_offset")
        shown = lines[start - 1: start - 1 + n]
        body = "\n".join(f"{i:6d}|{ln[:c.max_line_chars]}" for i, ln in enumerate(shown, start))
        end = start - 1 + len(shown)
        notes = []
        if end < len(lines):
            notes.append(f"[lines {start}-{end} of {len(lines)}{'+' if cut_bytes else ''}; use offset={end + 1} to read on]")
        elif cut_bytes:
            notes.append(f"[file cut at {c.read_max_bytes} bytes]")
        return ToolResult(body + ("\n" + "\n".join(notes) if notes else ""), meta={"lines": len(shown)})

    def _t_list_dir(self, a: dict) -> ToolResult:
        path = _norm_path(a["target_directory"])
        entries = sorted(self.sb.list_dir(path), key=lambda e: (e["type"] != "dir", e["name"]))
        if not entries:
            return ToolResult(f"{path or '.'} is empty.")
        lines = []
        for e in entries[:500]:
            if e["type"] == "dir":
                lines.append(f"{e['name']}/")
            elif e["type"] == "symlink":
                lines.append(f"{e['name']}@")
            else:
                lines.append(f"{e['name']} ({e['size']} bytes)")
        if len(entries) > 500:
            lines.append(f"... {len(entries) - 500} more entries")
        return ToolResult("\n".join(lines))

    def _t_glob_file_search(self, a: dict) -> ToolResult:
        pat = a["glob_pattern"].strip()
        base = _norm_path(a.get("target_directory", ""))
        if not pat:
            return ToolResult("Error: empty glob_pattern", ok=False, error="bad_pattern")
        if "/" not in pat and not pat.startswith("**"):
            pat = "**/" + pat
        full = posixpath.join(base, pat) if base else pat
        lim = self.config.glob_max_results
        hits = sorted(self.sb.glob(full, limit=lim + 1))
        if not hits:
            return ToolResult(f"No files match {a['glob_pattern']!r}.")
        more = f"\n[first {lim} results]" if len(hits) > lim else ""
        return ToolResult("\n".join(hits[:lim]) + more)

    def _t_search_replace(self, a: dict) -> ToolResult:
        path = _norm_path(a["file_path"])
        old, new = a["old_string"], a["new_string"]
        if old == new:
            return ToolResult("Error: old_string and new_string are identical", ok=False, error="no_change")
        text = self.sb.read_file(path)
        if old == "":
            if text:
                return ToolResult(f"Error: old_string is empty but {path} is not; use write_file to create files",
                                  ok=False, error="empty_old")
            self.sb.write_file(path, new)
            return ToolResult(f"Wrote {path}.")
        n = text.count(old)
        if n == 0:
            return ToolResult(f"Error: old_string not found in {path}", ok=False, error="not_found")
        if n > 1 and not a.get("replace_all", False):
            return ToolResult(f"Error: old_string occurs {n} times in {path}; add context to make it unique or "
                              f"set replace_all=true", ok=False, error="not_unique")
        self.sb.write_file(path, text.replace(old, new) if a.get("replace_all") else text.replace(old, new, 1))
        return ToolResult(f"Replaced {n if a.get('replace_all') else 1} occurrence(s) in {path}.")

    def _t_write_file(self, a: dict) -> ToolResult:
        path = _norm_path(a["file_path"])
        if not path:
            return ToolResult("Error: file_path names the workspace root", ok=False, error="bad_path")
        self.sb.write_file(path, a["contents"])
        return ToolResult(f"Wrote {len(a['contents'].encode())} bytes to {path}.")

    def _t_delete_file(self, a: dict) -> ToolResult:
        path = _norm_path(a["target_file"])
        if not path or path.startswith("../") or path == "..":
            return ToolResult(f"Error: cannot delete {a['target_file']!r}", ok=False, error="bad_path")
        r = self.sb.exec(["/bin/sh", "-c", 'if [ -d "$1" ] && [ ! -L "$1" ]; then echo "is a directory" >&2; exit 2; fi; '
                          'rm -- "$1"', "sh", path], timeout=30)
        if r.exit_code != 0:
            msg = (r.stderr or r.stdout).strip().replace("rm: ", "")
            return ToolResult(f"Error: cannot delete {path}: {msg}", ok=False, error="delete_failed")
        return ToolResult(f"Deleted {path}.")

    def _t_apply_patch(self, a: dict) -> ToolResult:
        patch = a["patch"]
        if not patch.endswith("\n"):
            patch += "\n"
        errs = []
        for strip in ("-p1", "-p0"):
            r = self.sb.exec(["git", "apply", "--verbose", "--whitespace=nowarn", strip, "-"], stdin=patch, timeout=60)
            if r.exit_code == 0:
                touched = [ln.split(" ", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("Applied patch")]
                return ToolResult("Patch applied" + (": " + ", ".join(
                    t.replace(" cleanly.", "").strip() for t in touched) if touched else "."))
            errs.append(r.stderr.strip())
        return ToolResult("Error: the patch does not apply:\n" + _cut(errs[0], 4000)[0], ok=False, error="patch_failed")

    # ---- search tools ----
    def _t_grep(self, a: dict) -> ToolResult:
        c = self.config
        path = _norm_path(a.get("path", "")) or "."
        cap = min(a.get("max_matches", c.grep_max_matches), 1000)
        argv = ["grep", "-rnIP", "--color=never"]
        if a.get("case_insensitive"):
            argv.append("-i")
        if a.get("include"):
            argv.append(f"--include={a['include']}")
        if a.get("exclude"):
            argv.append(f"--exclude={a['exclude']}")
        argv += ["--exclude-dir=.git", "-e", a["pattern"], "--", path]
        r = self.sb.exec(argv, timeout=60)
        if r.killed_reason:
            return ToolResult(f"Error: grep stopped ({r.killed_reason}); narrow the pattern or path", ok=False,
                              error=r.killed_reason)
        if r.exit_code == 1:
            return ToolResult(f"No matches for {a['pattern']!r}.")
        if r.exit_code != 0 and not r.stdout:
            return ToolResult(f"Error: {r.stderr.strip().replace('grep: ', '')[:500]}", ok=False, error="grep_failed")
        lines = r.stdout.splitlines()
        shown = [ln[: c.max_line_chars] for ln in lines[:cap]]
        if path == ".":
            shown = [ln[2:] if ln.startswith("./") else ln for ln in shown]
        more = f"\n[{len(lines) - cap}+ more matches not shown]" if len(lines) > cap or r.stdout_truncated else ""
        return ToolResult("\n".join(shown) + more, meta={"matches": min(len(lines), cap)})

    def _t_codebase_search(self, a: dict) -> ToolResult:
        c = self.config
        dirs = [_norm_path(d) for d in a.get("target_directories") or [""]]
        files: list[str] = []
        for d in dirs:
            files += self.sb.glob(posixpath.join(d, "**/*") if d else "**/*", limit=c.search_max_files)
        chunks = []
        for f in sorted(set(files))[: c.search_max_files]:
            if "/.git/" in f"/{f}" or f.endswith((".pyc", ".so", ".png", ".jpg", ".gz", ".zip", ".whl")):
                continue
            try:
                data = self.sb.read_file(f, max_bytes=200_000, binary=True)
            except (OSError, UnsafePath):
                continue  # directories, special files
            if b"\0" in data[:4096]:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            for s in range(0, max(len(lines), 1), 40):
                chunks.append((f, s + 1, lines[s:s + 40]))
        hits = bm25_rank(a["query"], [f + "\n" + "\n".join(ls) for f, _, ls in chunks], c.search_max_results)
        if not hits:
            return ToolResult(f"No results for {a['query']!r}.")
        out = []
        for i, score in hits:
            f, start, ls = chunks[i]
            snippet = "\n".join(ls[:12])
            out.append(f"{f}:{start}-{start + len(ls) - 1} (score {score:.2f})\n{snippet}")
        return ToolResult("\n\n".join(out))

    # ---- terminal ----
    def _shell_session(self):
        if self._shell is None:
            self._shell = self.sb.shell()
        return self._shell

    def _t_run_terminal_cmd(self, a: dict) -> ToolResult:
        c = self.config
        cmd = a["command"]
        if not cmd.strip():
            return ToolResult("Error: empty command", ok=False, error="empty_command")
        sh = self._shell_session()
        if a.get("is_background"):
            self._bg += 1
            log = f"/tmp/bg_{self._bg}.log"
            r = sh.run(f"( {cmd}\n) > {log} 2>&1 < /dev/null &\necho $!", timeout=30)
            pid = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "?"
            return ToolResult(f"Started in the background (pid {pid}); output goes to {log}.",
                              ok=r.exit_code == 0, meta={"pid": pid, "log": log})
        timeout = min(float(a.get("timeout", c.cmd_timeout_s)), c.cmd_max_timeout_s)
        r = sh.run(cmd, timeout=timeout)
        text, cut = _cut(r.stdout + (("\n" + r.stderr) if r.stderr else ""), c.output_max_chars)
        status = f"Exit code: {r.exit_code}"
        if r.killed_reason == "timeout":
            status = f"Command timed out after {timeout:g} s and was killed (exit code {r.exit_code})"
        elif r.killed_reason:
            status = f"Command killed ({r.killed_reason}), exit code {r.exit_code}"
        if cut or r.stdout_truncated:
            status += " (output truncated)"
        return ToolResult(f"{text.rstrip()}\n{status}" if text.strip() else status,
                          ok=r.exit_code == 0 and not r.killed_reason,
                          error=None if r.exit_code == 0 and not r.killed_reason else (r.killed_reason or "exit_code"),
                          meta={"exit_code": r.exit_code, "duration_s": r.duration_s})

    # ---- lints and to-dos ----
    def _t_read_lints(self, a: dict) -> ToolResult:
        paths = a.get("paths")
        if paths is None:
            from c2jax.envs.grading import diff_paths

            changed, _ = diff_paths(self.sb.diff())
            paths = sorted(changed)
        paths = [_norm_path(p) for p in paths if _norm_path(p).endswith(".py")]
        if not paths:
            return ToolResult("No Python files to lint.")
        report = []
        for p in paths[:50]:
            try:
                src = self.sb.read_file(p, max_bytes=1 << 20)
            except FileNotFoundError:
                continue
            report += [f"{p}:{ln}: {msg}" for ln, msg in lint_python(src, p)]
        return ToolResult("\n".join(report) if report else f"No lint errors in {len(paths)} file(s).",
                          meta={"problems": len(report)})

    def _t_todo_write(self, a: dict) -> ToolResult:
        items = [{"id": t["id"], "content": t["content"], "status": t["status"]} for t in a["todos"]]
        if a["merge"]:
            by_id = {t["id"]: t for t in self.todos}
            for t in items:
                if t["id"] in by_id:
                    by_id[t["id"]].update(t)
                else:
                    self.todos.append(t)
                    by_id[t["id"]] = t
        else:
            self.todos = items
        return ToolResult("To-do list:\n" + format_todos(self.todos) if self.todos else "To-do list is empty.")


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
