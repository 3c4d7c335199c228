"""Where a jitted function's time goes on the XLA CPU backend: a `jax.profiler` trace of a few calls,
summarised per executed HLO instruction (thunk) and per kind of work.

    from xla_profile import profile_jitted
    prof = profile_jitted(jitted_fn, args, calls=3)
    prof["by_kind"]   # [(share, ms per call, kind)]   kind: matmul, gather, scatter, sort, reduce, ...
    prof["top"]       # [(share, ms per call, instruction, kind, shape, op_name)]

How: the trace's XLA threads record one event per executed thunk, named after the HLO instruction
of the compiled module (`ynn_fusion.3`, `loop_fusion.7`, `gather.2`, ...). Durations are summed
over the traced calls and joined with ``compiled.as_text()``: the instruction's result shape, its
op_name (the jax name stack) and its kind, from the opcodes of the computation a fusion calls
(a fusion containing a dot is 'matmul', else one holding scatter / gather / sort / reduce /
transpose-or-copy, else 'elementwise'). Shares are of the summed thunk time; the threads of one
step can overlap, so ms per call sums to more than the wall time when they do.
Used by ``benchmarks/model_step.py --profile``.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
from typing import Any, Callable, Sequence

_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+?)(?:\{[^}]*\})?\s+([\w\-]+)\(")
_KIND_ORDER = (("dot", "matmul"), ("convolution", "matmul"), ("scatter", "scatter"), ("gather", "gather"),
               ("sort", "sort"), ("reduce", "reduce"), ("transpose", "transpose/copy"), ("copy", "transpose/copy"))


def parse_hlo(hlo_text: str) -> dict[str, dict[str, Any]]:
    """HLO instruction name -> {shape, opcode, op_name, kind} from `compiled.as_text()`."""
    comp_ops: dict[str, set[str]] = collections.defaultdict(set)
    instrs: dict[str, dict[str, Any]] = {}
    current = None
    for line in hlo_text.splitlines():
        c = _COMP.match(line)
        if c:
            current = c.group(1)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, opcode = m.groups()
        comp_ops[current].add(opcode)
        calls = re.search(r"calls=%?([\w.\-]+)", line)
        op_name = re.search(r'op_name="([^"]*)"', line)
        instrs[name] = {"shape": shape, "opcode": opcode, "calls": calls.group(1) if calls else None,
                        "op_name": op_name.group(1) if op_name else ""}
    for ins in instrs.values():
        ops = comp_ops.get(ins["calls"], set()) | {ins["opcode"]}
        ins["kind"] = next((k for op, k in _KIND_ORDER if op in ops), "elementwise")
    return instrs


def _thunk_times(xspace_path: str) -> dict[str, float]:
    from jax.profiler import ProfileData

    totals: dict[str, float] = collections.defaultdict(float)
    for plane in ProfileData.from_file(xspace_path).planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):  # XLA client/worker threads only
                continue
            for ev in line.events:
                if ev.name.startswith(("end: ", "ThreadpoolListener", "ThunkExecutor", "SlinkyThreadPool")):
                    continue
                totals[ev.name] += ev.duration_ns * 1e-6  # ms
    return dict(totals)


def profile_jitted(fn: Callable, args: Sequence[Any], calls: int = 3, top: int = 20) -> dict[str, list]:
    """Trace `calls` calls of the jitted `fn(*args)` (compiled and run once first); see the module
    docstring for the returned tables."""
    import jax

    instrs = parse_hlo(fn.lower(*args).compile().as_text())
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        paths = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError("jax.profiler.trace wrote no .xplane.pb file")
        times = _thunk_times(paths[0])
    total = sum(times.values()) or 1.0
    kinds: dict[str, float] = collections.defaultdict(float)
    rows = []
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        ins = instrs.get(name, {"shape": "?", "kind": "other", "op_name": ""})
        kinds[ins["kind"]] += ms
        rows.append((ms / total, ms / calls, name, ins["kind"], ins["shape"], ins["op_name"]))
    by_kind = sorted(((ms / total, ms / calls, k) for k, ms in kinds.items()), reverse=True)
    return {"by_kind": by_kind, "top": rows[:top], "total_ms_per_call": total / calls}
