"""The agent tools' declarations: JSON Schemas (`SCHEMAS`, the one list of tool names), their OpenAI
`tools` form, and the checking of a call's raw arguments against them (`validate_call`).

The implementations live in `c2jax.agent.tools` (`Toolbox`, registered in `TOOL_IMPLS` by name).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Mapping, Sequence

import jsonschema


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
