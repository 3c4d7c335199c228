"""Where a jitted function's time goes on the XLA CPU backend: a `jax.profiler` trace of a few calls,
summarised per executed HLO instruction (thunk), per kind of work and per model component.

    from xla_profile import profile_compiled
    prof = profile_compiled(jax.jit(fn).lower(*args).compile(), args, calls=3)
    prof["by_kind"]        # [(share, ms per call, kind)]   kind: matmul, gather, scatter, sort, reduce, ...
    prof["by_component"]   # [(share, ms per call, component, work)]  work: matmul | data movement | reduce | ...
    prof["top"]            # [(share, ms per call, instruction, kind, shape, op_name)]

Used by ``python benchmarks/model_step.py --profile`` (the `small` preset's fwd+bwd: prints the tables
below and the matmul GFLOP/s each component reaches).

How: the trace's XLA threads record one event per executed thunk, named after the HLO instruction
of the compiled module (`ynn_fusion.3`, `loop_fusion.7`, `gather.2`, ...). Control-flow thunks
(`while`, `conditional`, `call`) are left out: their bodies' thunks are recorded on their own, so
counting both would count the loop body twice. Durations are summed over the traced calls and
joined with ``compiled.as_text()``:

* kind, from the opcodes of the computation a fusion calls (a fusion containing a dot is 'matmul',
  else one holding scatter / gather / sort / reduce / transpose-or-copy, else 'elementwise'), and
  the coarser *work* class: matmul, data movement (gather, scatter, sort, transpose/copy),
  reduce, elementwise, other (custom calls such as top-k);
* component, from the Python call stack XLA keeps per instruction (the module's ``StackFrames``
  table; for a fusion, the stack of its dot when it has one, else of its root): the innermost
  frame in `c2jax/model` that identifies a component decides (`rms_norm` -> norms, `moe_router`
  -> router, `moe_impls` / `expert_matmul` / `moe_dense` -> MoE routed experts, `swiglu_mlp` ->
  MoE shared experts inside `moe_block` else dense MLP, `attend_*` -> attention scores+softmax,
  the rest of `mla` / `rope` -> attention projections+RoPE, `moe.py` -> MoE dispatch/combine,
  `transformer_block` -> residuals, `transformer.py` otherwise -> embed+LM head for matmuls,
  gathers and scatters, else layer loop+apply glue: the scan over layers); instructions
  whose stack has no model frame (the loss) are 'loss/other', and those with no stack at all
  (copies and layout changes XLA inserted, e.g. around the layer loop) 'XLA-inserted (no source)',
  except matmuls, which take the component of their nearest operand or user with one (XLA drops
  the source of some dots it rewrites).

Shares are of the summed thunk time; the threads of one step can overlap, so ms per call sums to
more than the wall time when they do (`wall_ms_per_call` is printed beside it).
"""
from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
# name = SHAPE opcode(   (SHAPE may be a tuple "(f32[2], s32[])" with spaces, so match lazily)
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\(")
_KIND_ORDER = (("dot", "matmul"), ("convolution", "matmul"), ("scatter", "scatter"), ("gather", "gather"),
               ("sort", "sort"), ("reduce", "reduce"), ("transpose", "transpose/copy"), ("copy", "transpose/copy"),
               ("custom-call", "custom-call"))
WORK = {"matmul": "matmul", "gather": "data movement", "scatter": "data movement", "sort": "data movement",
        "transpose/copy": "data movement", "reduce": "reduce", "elementwise": "elementwise",
        "custom-call": "other", "other": "other"}
NO_SOURCE = "XLA-inserted (no source)"  # layout copies, loop-carry copies, ... with no Python frame
CONTROL_FLOW = frozenset({"while", "conditional", "call"})
_TABLE_ROW = re.compile(r'^(\d+)\s+(?:"(.*)"|\{(.*)\})\s*$')


def call_stacks(hlo_text: str) -> dict[int, list[tuple[str, str]]]:
    """Stack frame id -> call stack [(file basename, function), ...] innermost first, from the
    FileNames / FunctionNames / FileLocations / StackFrames tables of an HLO module's text.
    (As printed, a frame's parent_frame_id is the parent's id + 1, 1 meaning no parent; a test
    pins this against a program with a known call chain.)"""
    tables: dict[str, dict[int, Any]] = collections.defaultdict(dict)
    section = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        if section is None:
            continue
        m = _TABLE_ROW.match(line)
        if not m:
            if line.strip():
                section = None if not line[:1].isdigit() else section
            continue
        idx = int(m.group(1))
        if m.group(2) is not None:
            tables[section][idx] = m.group(2)
        else:
            tables[section][idx] = dict(kv.split("=", 1) for kv in m.group(3).split())
    files, funcs, locs, frames = (tables[k] for k in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"))

    def frame(fid: int) -> tuple[str, str]:
        loc = locs.get(int(frames[fid]["file_location_id"]), {})
        return (os.path.basename(files.get(int(loc.get("file_name_id", 0)), "?")),
                funcs.get(int(loc.get("function_name_id", 0)), "?"))

    out: dict[int, list[tuple[str, str]]] = {}
    for fid in frames:
        chain, cur, seen = [], fid, set()
        while cur in frames and cur not in seen:
            seen.add(cur)
            chain.append(frame(cur))
            parent = int(frames[cur]["parent_frame_id"]) - 1
            cur = parent if parent >= 1 else None
        out[fid] = chain
    return out


def component(chain: Sequence[tuple[str, str]], kind: str = "matmul") -> str:
    """Model component of an instruction of `kind` from its call stack (innermost first); see the
    module docstring."""
    funcs = {fn.split(".")[0] for _, fn in chain}
    for fl, fn in chain:
        fn = fn.split(".")[0]
        if fn == "rms_norm":
            return "norms"
        if fl == "moe_router.py":
            return "router"
        if fl in ("moe_impls.py", "moe_tile_scan.py", "expert_matmul.py", "moe_dense.py"):
            return "MoE routed experts"
        if fn == "swiglu_mlp":
            return "MoE shared experts" if "moe_block" in funcs else "dense MLP"
        if fl == "mla.py" and fn in ("attend_expanded", "_attend_heads", "attend_absorbed", "_softmax"):
            return "attention scores+softmax"
        if fl == "attention_recompute.py":  # mla.ATTN_BACKWARD = "recompute": the same work, custom VJP
            return "attention scores+softmax"
        if fl in ("mla.py", "rope.py"):
            return "attention proj+RoPE"
        if fl == "moe.py":
            return "MoE dispatch/combine"
        if fl == "transformer.py":
            if fn == "transformer_block":
                return "residuals"
            return "embed+LM head" if kind in ("matmul", "gather", "scatter") else "layer loop+apply glue"
    return "loss/other"


def parse_hlo(hlo_text: str) -> dict[str, dict[str, Any]]:
    """HLO instruction name -> {shape, opcode, op_name, kind, work, stack, component, computation,
    fused} from `compiled.as_text()` (stack: the call stack `component` was decided from,
    innermost first; fused: the instruction runs inside a fusion's thunk, not as its own)."""
    stacks = call_stacks(hlo_text)
    comp_ops: dict[str, set[str]] = collections.defaultdict(set)
    comp_frames: dict[str, dict[str, Optional[int]]] = collections.defaultdict(dict)  # computation -> dot/root frame
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
        sf = re.search(r"stack_frame_id=(\d+)", line)
        frame = int(sf.group(1)) if sf else None
        if frame is not None:
            if opcode in ("dot", "convolution"):
                comp_frames[current].setdefault("dot", frame)
            if line.lstrip().startswith("ROOT"):
                comp_frames[current]["root"] = frame
            comp_frames[current].setdefault("any", frame)
        args = line[m.end():].split(")", 1)[0]
        instrs[name] = {"shape": shape, "opcode": opcode, "calls": calls.group(1) if calls else None,
                        "operands": re.findall(r"%([\w.\-]+)", args),
                        "op_name": op_name.group(1) if op_name else "", "frame": frame, "computation": current}
    fused = {i["calls"] for i in instrs.values() if i["opcode"] == "fusion"}
    for ins in instrs.values():
        ins["fused"] = ins["computation"] in fused  # inside a fusion: runs as part of its fusion's thunk
        ops = comp_ops.get(ins["calls"], set()) | {ins["opcode"]}
        ins["kind"] = next((k for op, k in _KIND_ORDER if op in ops), "elementwise")
        ins["work"] = WORK[ins["kind"]]
        inner = comp_frames.get(ins["calls"], {})
        fid = inner.get("dot") or ins["frame"] or inner.get("root") or inner.get("any")
        ins["stack"] = stacks.get(fid, []) if fid else []
        ins["component"] = component(ins["stack"], ins["kind"]) if fid else NO_SOURCE
    _inherit_components(instrs)
    return instrs


def _inherit_components(instrs: dict[str, dict[str, Any]], depth: int = 4) -> None:
    """XLA drops the source of some matmuls it rewrites (e.g. batched dots of the attention
    backward inside the layer loop). Such a matmul thunk takes the component of the nearest
    operand (then user) within `depth` steps that has a model component (the layer loop's glue,
    e.g. the slice of a stacked residual, is looked through); 'inherited' marks it.
    Other sourceless thunks (copies, layout changes) stay 'XLA-inserted (no source)'."""
    users: dict[str, list[str]] = collections.defaultdict(list)
    for name, ins in instrs.items():
        for op in ins["operands"]:
            users[op].append(name)

    def nearest(start: str, edges) -> Optional[str]:
        frontier, seen = [start], {start}
        for _ in range(depth):
            nxt = []
            for n in frontier:
                for m in edges(n):
                    if m in seen or m not in instrs:
                        continue
                    seen.add(m)
                    c = instrs[m]["component"]
                    # the layer loop's slices of stacked residuals feed matmuls but never own one
                    if c not in (NO_SOURCE, "loss/other", "layer loop+apply glue") and not instrs[m].get("inherited"):
                        return c
                    nxt.append(m)
            frontier = nxt
        return None

    for name, ins in instrs.items():
        ins["inherited"] = False
        if ins["component"] == NO_SOURCE and not ins["fused"] and ins["kind"] == "matmul":
            c = nearest(name, lambda n: instrs[n]["operands"]) or nearest(name, lambda n: users.get(n, []))
            if c:
                ins["component"], ins["inherited"] = c, True


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


def profile_compiled(fn: Callable, args: Sequence[Any], calls: int = 3, top: int = 20) -> dict[str, Any]:
    """Trace `calls` calls of the compiled `fn(*args)` (a `jax.stages.Compiled`, run once first);
    see the module docstring for the returned tables."""
    import jax

    instrs = parse_hlo(fn.as_text())
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        paths = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError("jax.profiler.trace wrote no .xplane.pb file")
        times = _thunk_times(paths[0])
    unknown = {"shape": "?", "kind": "other", "work": "other", "op_name": "", "component": NO_SOURCE,
               "opcode": "?"}
    times = {k: v for k, v in times.items() if instrs.get(k, unknown)["opcode"] not in CONTROL_FLOW}
    total = sum(times.values()) or 1.0
    kinds: dict[str, float] = collections.defaultdict(float)
    comps: dict[tuple[str, str], float] = collections.defaultdict(float)
    rows = []
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        ins = instrs.get(name, unknown)
        kinds[ins["kind"]] += ms
        comps[(ins["component"], ins["work"])] += ms
        rows.append((ms / total, ms / calls, name, ins["kind"], ins["shape"], ins["op_name"]))
    by_kind = sorted(((ms / total, ms / calls, k) for k, ms in kinds.items()), reverse=True)
    by_comp = sorted(((ms / total, ms / calls, c, w) for (c, w), ms in comps.items()), reverse=True)
    return {"by_kind": by_kind, "by_component": by_comp, "top": rows[:top], "total_ms_per_call": total / calls,
            "wall_ms_per_call": wall_ms}


# perf.forward_flops component -> profile component whose matmul time executes it
FLOP_COMPONENTS = {"attn_proj": "attention proj+RoPE", "attn_scores": "attention scores+softmax",
                   "dense_mlp": "dense MLP", "router": "router", "routed_experts": "MoE routed experts",
                   "shared_experts": "MoE shared experts", "lm_head": "embed+LM head"}


def print_step_profile(prof: dict[str, Any], fwd_flops: dict[str, float], peak_gflops: float) -> None:
    """Print `profile_compiled`'s tables for a fwd+bwd step whose forward matmul FLOPs per
    component are `fwd_flops` (`perf.forward_flops`): time by component x work with shares, by
    component, by work, and each component's matmul GFLOP/s (3 x forward FLOPs / its matmul thunk
    time) against `peak_gflops`, so what keeps MFU down is visible."""
    calls_total = prof["total_ms_per_call"]
    print(f"summed thunk time {calls_total:.1f} ms per call (wall {prof['wall_ms_per_call']:.1f} ms per call: "
          f"thread overlap {calls_total / prof['wall_ms_per_call']:.2f}x)")
    by_c: dict[str, float] = collections.defaultdict(float)
    by_w: dict[str, float] = collections.defaultdict(float)
    mm: dict[str, float] = collections.defaultdict(float)
    for share, ms, comp, work in prof["by_component"]:
        by_c[comp] += ms
        by_w[work] += ms
        if work == "matmul":
            mm[comp] += ms
    print("time by component x work (share of summed thunk time, ms per call):")
    for share, ms, comp, work in prof["by_component"]:
        if share >= 0.005:
            print(f"  {comp:26s} {work:14s} {share:6.1%} {ms:8.1f} ms")
    print("by component: " + ", ".join(f"{c} {ms / calls_total:.1%}" for c, ms in
                                       sorted(by_c.items(), key=lambda kv: -kv[1])))
    print("by work:      " + ", ".join(f"{w} {ms / calls_total:.1%}" for w, ms in
                                       sorted(by_w.items(), key=lambda kv: -kv[1])))
    print(f"matmul GFLOP/s per component (3 x forward FLOPs / its matmul thunk time; peak {peak_gflops:.1f}):")
    for key, comp in FLOP_COMPONENTS.items():
        fl = 3 * fwd_flops.get(key, 0.0)
        if fl and mm.get(comp):
            rate = fl / (mm[comp] * 1e-3) / 1e9
            print(f"  {comp:26s} {fl / 1e9:8.3f} GFLOP in {mm[comp]:8.1f} ms = {rate:7.1f} GFLOP/s "
                  f"({rate / peak_gflops:6.1%} of peak); its non-matmul time {by_c[comp] - mm[comp]:7.1f} ms")
