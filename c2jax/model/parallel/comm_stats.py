"""Communication volume read from compiled HLO: bytes per collective kind and per mesh axis.

`collective_stats(compiled_text, mesh)` parses the text of ``jax.jit(f).lower(...).compile()``
(``.as_text()``), finds every collective (all-gather, all-reduce, reduce-scatter, all-to-all,
collective-permute, and their async ``-start`` forms), and counts its per-device bytes:
the result size for all-gather, the operand size otherwise. Collectives inside a ``while`` body
(the layer `lax.scan`) are multiplied by the loop's known trip count, nested loops compose, so
the numbers are per call of the compiled function (e.g. per train step). Each collective is
attributed to the mesh axes along which its replica groups (or source/target pairs) vary, giving
e.g. ``{'fsdp': ..., 'expert': ..., 'context': ..., 'fsdp+context': ...}``.
Partition id i is the i-th device of the mesh in row-major order (jit's device assignment).
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Optional

import numpy as np

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
         "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\([^{]*)?\{\s*$")
_OP = re.compile(r"=\s*(.+?)\s+(" + "|".join(KINDS) + r")(-start)?\((.*)$")
_CALLS = re.compile(r"(?:condition|body|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _bytes(type_str: str) -> int:
    total = 0
    for dt, dims in _SHAPE.findall(type_str):
        if dt not in _DTYPE_BYTES and not dt.startswith("f8") and not dt.startswith("f4"):
            continue
        size = _DTYPE_BYTES.get(dt, 1)
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n * size
    return total


def _split_computations(text: str) -> tuple[dict[str, list[str]], Optional[str]]:
    comps: dict[str, list[str]] = {}
    entry, cur = None, None
    for line in text.splitlines():
        s = line.strip()
        if cur is None:
            m = _COMP_HEAD.match(s)
            if m and "=" not in s.split("(")[0]:
                cur = m.group(2)
                comps[cur] = []
                if m.group(1):
                    entry = cur
            continue
        if s == "}":
            cur = None
            continue
        comps[cur].append(s)
    return comps, entry


def _multiplicities(comps: dict[str, list[str]], entry: Optional[str]) -> dict[str, int]:
    mult: dict[str, int] = defaultdict(int)
    if entry is None:
        return {c: 1 for c in comps}

    def visit(name: str, k: int, depth: int = 0) -> None:
        if name not in comps or depth > 64:
            return
        mult[name] += k
        for line in comps[name]:
            callees = _CALLS.findall(line)
            for b in _BRANCHES.findall(line):
                callees += [c.strip().lstrip("%") for c in b.split(",") if c.strip()]
            if not callees:
                continue
            trip = 1
            if " while(" in line:
                t = _TRIP.search(line)
                trip = int(t.group(1)) if t else 1
            for c in callees:
                visit(c, k * trip, depth + 1)

    visit(entry, 1)
    return dict(mult)


def _mesh_groups(line: str) -> list[list[int]] | None:
    """XLA's mesh form: replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, optionally with a
    device order (``<=[dims]T(perm)`` or ``, device_ids=([dims]T(perm))``) after the bracket:
    groups vary along the listed axes."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:<=\[([\d,]+)\](?:T\(([\d,]+)\))?|,\s*device_ids=\(\[([\d,]+)\]"
                  r"(?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", line)
    if not m:
        return None
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    names = [a for a, _ in axes]
    shape = [int(n) for _, n in axes]
    total = int(np.prod(shape)) if shape else 1
    dims_s, perm_s = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
    if dims_s:  # device order: iota(dims).transpose(perm), read in the mesh shape
        dims = [int(x) for x in dims_s.split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if perm_s:
            ids = ids.transpose([int(x) for x in perm_s.split(",")])
        ids = ids.reshape(shape)
    else:
        ids = np.arange(total).reshape(shape)
    listed = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(6)) if a in names]
    if not listed:
        return [[i] for i in ids.ravel().tolist()]
    rest = [i for i in range(len(shape)) if i not in listed]
    g = ids.transpose(rest + listed).reshape(-1, int(np.prod([shape[i] for i in listed])))
    return g.tolist()


def _groups(line: str, n_devices: int = 0) -> list[list[int]]:
    mg = _mesh_groups(line)
    if mg is not None:
        return mg
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return ids.reshape(shape).tolist()
    if "replica_groups={}" in line:  # empty = one group of every device
        return [list(range(n_devices))] if n_devices else []
    m = re.search(r"replica_groups=\{(\{[\d,{} ]*\})\}", line)
    if m:
        return [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d, ]*)\}", m.group(1))]
    m = re.search(r"source_target_pairs=\{(\{[\d,{} ]*\})\}", line)
    if m:
        return [[int(x) for x in g.split(",")] for g in re.findall(r"\{([\d, ]+)\}", m.group(1))]
    return []


def _axes_of(groups: list[list[int]], mesh) -> str:
    if mesh is None or not groups:
        return "?"
    shape = mesh.devices.shape
    names = mesh.axis_names
    varying = set()
    for g in groups:
        coords = np.array([np.unravel_index(i, shape) for i in g if i < mesh.devices.size])
        if len(coords) > 1:
            for a in range(len(shape)):
                if len(set(coords[:, a].tolist())) > 1:
                    varying.add(names[a])
    return "+".join(n for n in names if n in varying) or "none"


def collective_stats(compiled_text: str, mesh=None) -> dict:
    """{'by_kind': {kind: bytes}, 'by_axes': {axes: bytes}, 'ops': [(kind, axes, bytes, count, result dtype)],
    'total': bytes}: per-device bytes per call (see module docstring)."""
    comps, entry = _split_computations(compiled_text)
    mult = _multiplicities(comps, entry)
    by_kind: dict[str, int] = defaultdict(int)
    by_axes: dict[str, int] = defaultdict(int)
    ops = []
    for name, lines in comps.items():
        k = mult.get(name, 0)
        if not k:
            continue
        for line in lines:
            m = _OP.search(line)
            if not m:
                continue
            result_type, kind, _, rest = m.groups()
            if kind == "all-gather":
                nbytes = _bytes(result_type)
            else:
                operands = rest.split("),")[0]
                nbytes = _bytes(operands) or _bytes(result_type)
            axes = _axes_of(_groups(line, 0 if mesh is None else mesh.devices.size), mesh)
            by_kind[kind] += nbytes * k
            by_axes[axes] += nbytes * k
            dt = _SHAPE.search(result_type)
            ops.append((kind, axes, nbytes, k, dt.group(1) if dt else "?"))
    return {"by_kind": dict(by_kind), "by_axes": dict(by_axes), "ops": ops,
            "total": int(sum(by_kind.values()))}


def compiled_collective_stats(jitted, *args, mesh=None) -> dict:
    """`collective_stats` of ``jitted.lower(*args).compile()`` (args may be ShapeDtypeStructs)."""
    return collective_stats(jitted.lower(*args).compile().as_text(), mesh)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return json.dumps(n)
