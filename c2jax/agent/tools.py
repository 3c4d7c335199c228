"""Cursor-shaped agent tools: implementations on a sandbox, registered by name (`TOOL_IMPLS`); the
schemas and argument checks are in `tool_schemas`, the text helpers in `tool_text` (re-exported here).

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

import dataclasses
import functools
import posixpath
from typing import Any, Callable, Mapping

from c2jax.agent.tool_schemas import (SCHEMAS, TOOL_NAMES, ToolResult, check_arguments, compact_schema,
                                      openai_tools, usage, validate_call)
from c2jax.agent.tool_text import bm25_rank, format_todos, lint_python
from c2jax.envs.errors import SandboxError, UnsafePath
from c2jax.registry import Registry

__all__ = ["SCHEMAS", "TOOL_IMPLS", "TOOL_NAMES", "ToolConfig", "ToolResult", "Toolbox", "bm25_rank",
           "check_arguments", "compact_schema", "format_todos", "lint_python", "openai_tools", "usage",
           "validate_call"]

# ---- results and configuration ------------------------------------------------------------------


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


# ---- the toolbox ----------------------------------------------------------------------------------

# Tool name -> implementation `fn(toolbox, checked arguments) -> ToolResult`; the `Toolbox` methods
# below register themselves, and every name of `SCHEMAS` must have exactly one (checked at import).
TOOL_IMPLS: Registry[Callable[["Toolbox", dict], ToolResult]] = Registry("agent_tool")

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
        self._impl: dict[str, Callable[[dict], ToolResult]] = {
            n: functools.partial(TOOL_IMPLS.get(n), self) for n in TOOL_NAMES}

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
    @TOOL_IMPLS.register("read_file")
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

    @TOOL_IMPLS.register("list_dir")
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

    @TOOL_IMPLS.register("glob_file_search")
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

    @TOOL_IMPLS.register("search_replace")
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

    @TOOL_IMPLS.register("write_file")
    def _t_write_file(self, a: dict) -> ToolResult:
        path = _norm_path(a["file_path"])
        if not path:
            return ToolResult("Error: file_path names the workspace root", ok=False, error="bad_path")
        self.sb.write_file(path, a["contents"])
        return ToolResult(f"Wrote {len(a['contents'].encode())} bytes to {path}.")

    @TOOL_IMPLS.register("delete_file")
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

    @TOOL_IMPLS.register("apply_patch")
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
    @TOOL_IMPLS.register("grep")
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

    @TOOL_IMPLS.register("codebase_search")
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

    @TOOL_IMPLS.register("run_terminal_cmd")
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
    @TOOL_IMPLS.register("read_lints")
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

    @TOOL_IMPLS.register("todo_write")
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


if set(TOOL_IMPLS.names()) != set(TOOL_NAMES):  # a schema without an implementation, or the reverse
    raise ImportError(f"agent tools: schemas {sorted(set(TOOL_NAMES) - set(TOOL_IMPLS.names()))} have no "
                      f"implementation; implementations {sorted(set(TOOL_IMPLS.names()) - set(TOOL_NAMES))} "
                      "have no schema")
