"""Load and save Hugging Face DeepSeek-V3 / Kimi-K2 / Kimi-K2.5 checkpoint directories.

    params, cfg = from_pretrained("/ckpt/Kimi-K2-Instruct")          # numpy arrays, param tree of cfg
    params, cfg, report = from_pretrained(path, return_report=True)  # report.ignored: what was skipped
    cfg, report = inspect_checkpoint(path)        # names + shapes checked, no weights read
    save_pretrained(params, cfg, "/out", layout="per_expert", max_shard_bytes=5 * 2**30)

`from_pretrained` reads ``config.json`` (see `hf_config`) and the safetensors weights (single file or
``model.safetensors.index.json`` shards), one tensor at a time into preallocated parameter arrays
(peak memory = the parameter tree + one decoded tensor). Per tensor it accepts plain floats, FP8
block-quantised weights (``weight_scale_inv``) and compressed-tensors INT4 (``weight_packed``,
``weight_scale``, ``weight_shape``) and dequantises them (see `hf_formats`); routed experts in the
public per-expert layout or transformers-5 fused layout; a ``language_model.`` prefix (Kimi-K2.5),
ignoring the tensors outside it (vision tower, projector); MTP modules stored as extra decoder
layers ``model.layers.{num_hidden_layers + k}``. Every ignored tensor is listed with its reason in
the report and logged. Bad checkpoints raise `CheckpointError` naming missing/unexpected tensors or
the tensor with the wrong shape (with both shapes); an unsupported architecture raises
`UnsupportedArchitectureError`.

`save_pretrained` writes config.json plus bfloat16/float32 safetensors in the chosen layout, sharded
by `max_shard_bytes` with an index, streaming one shard at a time. Loading what it wrote gives the
same tree bit for bit.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

from c2jax.model.config import ModelConfig
from c2jax.model.hf.config import (
    CheckpointError, UnsupportedArchitectureError, hf_config_from_model_config, model_config_from_hf, text_config)
from c2jax.model.hf.formats import (
    SafetensorsReader, check_quantization, dequantize_fp8_blocks, dequantize_packed, fp8_block_size, int4_settings)
from c2jax.model.hf.keys import (
    FP32_LEAVES, LAYOUTS, np_dtype, check_keys, detect_layout, fill_params, hf_state_dict_from_params,
    ignorable_keys, iter_hf_tensors, key_plan, params_from_hf_state_dict)

__all__ = [
    "CheckpointError", "UnsupportedArchitectureError", "LoadReport", "from_pretrained", "save_pretrained",
    "inspect_checkpoint",
    "hf_config_from_model_config", "model_config_from_hf", "params_from_hf_state_dict",
    "hf_state_dict_from_params", "LAYOUTS",
]

log = logging.getLogger(__name__)

LM_PREFIXES = ("language_model.",)  # multimodal wrappers keep the language model under one of these
_INT4_PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


@dataclass
class LoadReport:
    """What `from_pretrained` did: layout, prefix, how many tensors of each format, what it skipped."""

    path: str
    layout: str = "per_expert"
    prefix: str = ""
    formats: dict[str, int] = field(default_factory=dict)  # plain / fp8 / int4 -> count of weights
    ignored: dict[str, str] = field(default_factory=dict)  # checkpoint tensor -> reason
    notes: list[str] = field(default_factory=list)


@dataclass
class _Logical:
    """One logical HF tensor (e.g. ``...gate_proj.weight``) and the stored tensors that encode it."""

    kind: str = "plain"  # plain | fp8 | int4
    parts: dict[str, str] = field(default_factory=dict)  # role -> stored key


def _group_tensors(keys: Any, prefix: str, report: LoadReport) -> dict[str, _Logical]:
    """Group stored tensor names into logical tensors; names outside `prefix` are ignored (and reported)."""
    out: dict[str, _Logical] = {}
    for k in keys:
        if prefix and not k.startswith(prefix):
            report.ignored[k] = f"outside the language model (no {prefix!r} prefix)"
            continue
        name = k[len(prefix):]
        if name.endswith(".weight_scale_inv"):
            out.setdefault(name[: -len("_scale_inv")], _Logical()).parts["scale_inv"] = k
            continue
        for part in _INT4_PARTS:
            if name.endswith("." + part):
                out.setdefault(name[: -len(part)] + "weight", _Logical()).parts[part] = k
                break
        else:
            out.setdefault(name, _Logical()).parts["value"] = k
    for name, lg in out.items():
        if "weight_packed" in lg.parts:
            lg.kind = "int4"
            lacking = [p for p in ("weight_scale", "weight_shape") if p not in lg.parts]
            if lacking or "value" in lg.parts or "scale_inv" in lg.parts:
                raise CheckpointError(f"INT4 tensor {name!r}: stored parts {sorted(lg.parts)}; "
                                      f"needs weight_packed, weight_scale, weight_shape only (lacking {lacking})")
        elif "scale_inv" in lg.parts:
            lg.kind = "fp8"
            if "value" not in lg.parts:
                raise CheckpointError(f"FP8 scale {lg.parts['scale_inv']!r} has no weight tensor {prefix + name!r}")
        elif "value" not in lg.parts:
            raise CheckpointError(f"tensor {name!r}: stored parts {sorted(lg.parts)} without weight_packed")
    return out


def _decoder(reader: SafetensorsReader, logical: Mapping[str, _Logical], quant: Optional[Mapping[str, Any]],
             report: LoadReport) -> Callable[[str], np.ndarray]:
    block = fp8_block_size(quant)
    num_bits, group = int4_settings(quant)

    def get(name: str) -> np.ndarray:
        lg = logical[name]
        report.formats[lg.kind] = report.formats.get(lg.kind, 0) + 1
        if lg.kind == "plain":
            dt = reader.dtype(lg.parts["value"])
            if not (dt.startswith("F") or dt == "BF16") or dt.startswith("F8"):
                raise CheckpointError(f"tensor {lg.parts['value']!r} has dtype {dt} but no quantisation scale "
                                      f"(expected {lg.parts['value']}_scale_inv or a float tensor)")
            return reader.get(lg.parts["value"])
        if lg.kind == "fp8":
            return dequantize_fp8_blocks(reader.get(lg.parts["value"]), reader.get(lg.parts["scale_inv"]),
                                         block, name=lg.parts["value"])
        shape = tuple(int(s) for s in np.asarray(reader.get(lg.parts["weight_shape"])).reshape(-1))
        zp = reader.get(lg.parts["weight_zero_point"]) if "weight_zero_point" in lg.parts else None
        return dequantize_packed(reader.get(lg.parts["weight_packed"]), reader.get(lg.parts["weight_scale"]),
                                 shape, num_bits=num_bits, group_size=group, zero_point=zp,
                                 name=lg.parts["weight_packed"][: -len("_packed")])

    return get


def _mtp_layers(logical: Mapping[str, Any], num_layers: int) -> dict[int, list[str]]:
    """Decoder-layer indices >= num_layers that look like MTP modules (they carry ``eh_proj``) -> their keys."""
    pat = re.compile(r"^model\.layers\.(\d+)\.")
    by_layer: dict[int, list[str]] = {}
    for k in logical:
        m = pat.match(k)
        if m and int(m.group(1)) >= num_layers:
            by_layer.setdefault(int(m.group(1)), []).append(k)
    return {l: ks for l, ks in by_layer.items() if any(".eh_proj." in k for k in ks)}


@dataclass
class _Opened:
    cfg: ModelConfig
    reader: SafetensorsReader
    logical: dict[str, _Logical]
    plan: list
    quant: Optional[Mapping[str, Any]]
    report: LoadReport


def _open(path: str, dtype: Optional[str], load_mtp: bool, overrides: dict[str, Any]) -> _Opened:
    """Read config.json and the tensor index, resolve prefix/layout/MTP, check names (no tensor data read)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path} has no config.json")
    with open(cfg_path) as f:
        raw_cfg = json.load(f)
    if dtype is not None:
        overrides = dict(overrides, param_dtype=dtype, dtype=dtype)
    cfg = model_config_from_hf(raw_cfg, **overrides)
    quant = text_config(raw_cfg).get("quantization_config")
    check_quantization(quant)
    report = LoadReport(path=path)
    reader = SafetensorsReader(path)
    keys = list(reader.keys())
    report.prefix = next((p for p in LM_PREFIXES if any(k.startswith(p) for k in keys)), "")
    logical = _group_tensors(keys, report.prefix, report)
    report.layout = detect_layout(logical)

    # MTP modules: stored as extra decoder layers carrying eh_proj.
    mtp = _mtp_layers(logical, cfg.num_layers)
    if cfg.mtp_depth and not load_mtp:
        cfg = cfg.replace(mtp_depth=0)
        report.notes.append("MTP modules not loaded (load_mtp=False)")
    elif cfg.mtp_depth and not mtp:
        report.notes.append(f"config declares {cfg.mtp_depth} MTP module(s) but the checkpoint stores none "
                            "(as transformers' own save does): loaded without MTP")
        cfg = cfg.replace(mtp_depth=0)
    extra = {l: ks for l, ks in mtp.items() if l >= cfg.num_layers + cfg.mtp_depth}
    reason = {k: f"MTP module {l - cfg.num_layers} not loaded (mtp_depth={cfg.mtp_depth})"
              for l, ks in extra.items() for k in ks}

    plan = key_plan(cfg, report.layout)
    shapes = {k: reader.shape(lg.parts["value"]) for k, lg in logical.items() if lg.kind == "plain"}
    ignorable = {**ignorable_keys(cfg, shapes), **reason}
    check_keys([e.key for e in plan], logical.keys(), ignored=ignorable)
    for k, why in ignorable.items():
        if k in logical:
            for stored in logical[k].parts.values():
                report.ignored[stored] = why
    return _Opened(cfg, reader, logical, plan, quant, report)


def _log_report(what: str, report: LoadReport) -> None:
    if report.ignored:
        reasons: dict[str, int] = {}
        for why in report.ignored.values():
            reasons[why] = reasons.get(why, 0) + 1
        log.info("%s(%s): ignored %d tensor(s): %s", what, report.path, len(report.ignored),
                 "; ".join(f"{n} x {w}" for w, n in reasons.items()))
    for note in report.notes:
        log.warning("%s(%s): %s", what, report.path, note)


def from_pretrained(path: str, *, dtype: Optional[str] = None, load_mtp: bool = True,
                    return_report: bool = False, **overrides: Any):
    """Load an HF DeepSeek-V3 / Kimi-K2 / Kimi-K2.5 directory -> ``(params, cfg)`` (+ `LoadReport`).

    params are numpy arrays in `dtype` (default: the checkpoint's ``dtype``/``torch_dtype``,
    bfloat16 or float32; the router stays float32), shaped as `params_spec.param_specs(cfg)`.
    `load_mtp=False` drops the MTP modules (cfg.mtp_depth = 0). `overrides` are `ModelConfig.replace`
    keys for settings a checkpoint does not carry (e.g. ``**{'moe.impl': 'capacity'}``).
    """
    o = _open(path, dtype, load_mtp, overrides)
    try:
        params = fill_params(o.cfg, o.plan, _decoder(o.reader, o.logical, o.quant, o.report),
                             dtype=o.cfg.param_dtype)
    finally:
        o.reader.close()
    _log_report("from_pretrained", o.report)
    return (params, o.cfg, o.report) if return_report else (params, o.cfg)


def inspect_checkpoint(path: str, *, load_mtp: bool = True, **overrides: Any) -> tuple[ModelConfig, LoadReport]:
    """Validate a checkpoint without reading its weights: config, every tensor name, every (logical)
    shape; counts the formats it would decode. Cheap even for a 1T-parameter checkpoint."""
    o = _open(path, None, load_mtp, overrides)
    try:
        for ent in o.plan:
            lg = o.logical[ent.key]
            if lg.kind == "int4":
                shape = tuple(int(v) for v in np.asarray(o.reader.get(lg.parts["weight_shape"])).reshape(-1))
            else:
                shape = o.reader.shape(lg.parts["value"])
            if shape != ent.shape:
                raise CheckpointError(f"tensor {ent.key!r} has shape {shape}, expected {ent.shape} from the config")
            o.report.formats[lg.kind] = o.report.formats.get(lg.kind, 0) + 1
    finally:
        o.reader.close()
    _log_report("inspect_checkpoint", o.report)
    return o.cfg, o.report


def _tensor_specs(params: Mapping[str, Any], cfg: ModelConfig, layout: str, dtype: Optional[str],
                  mtp_shared_copies: bool) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
    """(key, shape, dtype) of every tensor `iter_hf_tensors` will yield, without computing any."""
    out_dt = np_dtype(dtype) if dtype is not None else None
    for ent in key_plan(cfg, layout):
        leaf = params
        for p in ent.slots[0][0]:
            leaf = leaf[p]
        keep32 = any(tuple(path[-2:]) in FP32_LEAVES for path, _ in ent.slots)
        dt = (np.dtype(np.float32) if keep32 else out_dt) if out_dt is not None else np.dtype(leaf.dtype)
        yield ent.key, ent.shape, dt
    if mtp_shared_copies:
        V, D = cfg.vocab_size, cfg.hidden_size
        for k in range(cfg.mtp_depth):
            pre = f"model.layers.{cfg.num_layers + k}."
            yield f"{pre}embed_tokens.weight", (V, D), out_dt or np.dtype(params["embed"]["embedding"].dtype)
            yield f"{pre}shared_head.head.weight", (V, D), out_dt or np.dtype(params["lm_head"]["kernel"].dtype)


def save_pretrained(params: Mapping[str, Any], cfg: ModelConfig, path: str, *, layout: str = "per_expert",
                    max_shard_bytes: int = 5 * 2**30, dtype: Optional[str] = None,
                    mtp_shared_copies: bool = True, overwrite: bool = False) -> list[str]:
    """Write `params` as an HF DeepSeek-V3 checkpoint directory; returns the files written.

    `dtype` ('bfloat16' | 'float32', default: each parameter's own dtype; the router stays float32).
    Shards hold at most `max_shard_bytes` (a larger single tensor gets a shard of its own); several
    shards get ``model-0000i-of-0000n.safetensors`` names and ``model.safetensors.index.json``.
    """
    from safetensors.numpy import save_file

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if dtype is not None and str(dtype) not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    os.makedirs(path, exist_ok=True)
    old = [n for n in os.listdir(path) if n.endswith(".safetensors") or n == "model.safetensors.index.json"]
    if old and not overwrite:
        raise FileExistsError(f"{path} already holds a checkpoint ({old[0]}, ...); pass overwrite=True to replace it")
    for n in old:
        os.remove(os.path.join(path, n))

    # Assign tensors to shards by size first (names need the shard count), then stream.
    shard_of: dict[str, int] = {}
    sizes = [0]
    total = 0
    for key, shape, dt in _tensor_specs(params, cfg, layout, dtype, mtp_shared_copies):
        nbytes = int(np.prod(shape)) * dt.itemsize
        if sizes[-1] and sizes[-1] + nbytes > max_shard_bytes:
            sizes.append(0)
        sizes[-1] += nbytes
        total += nbytes
        shard_of[key] = len(sizes) - 1
    n = len(sizes)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]

    written: list[str] = []
    buf: dict[str, np.ndarray] = {}
    cur = 0
    for key, x in iter_hf_tensors(params, cfg, layout, dtype, mtp_shared_copies):
        if shard_of[key] != cur:
            save_file(buf, os.path.join(path, names[cur]), metadata={"format": "pt"})
            written.append(names[cur])
            buf, cur = {}, shard_of[key]
        buf[key] = x
    save_file(buf, os.path.join(path, names[cur]), metadata={"format": "pt"})
    written.append(names[cur])
    buf = {}
    if n > 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": {k: names[i] for k, i in shard_of.items()}}, f, indent=2)
        written.append("model.safetensors.index.json")
    hf = hf_config_from_model_config(cfg)
    if dtype is not None:
        hf["dtype"] = str(dtype)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    written.append("config.json")
    return [os.path.join(path, w) for w in written]


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m c2jax.model.hf.io PATH``: validate a checkpoint directory without loading weights."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("path")
    args = ap.parse_args(argv)
    cfg, rep = inspect_checkpoint(args.path)
    from c2jax.model.config import count_params

    print(f"{args.path}: layout={rep.layout} prefix={rep.prefix!r} formats={rep.formats}")
    print(f"  {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.moe.n_routed_experts} experts top-"
          f"{cfg.moe.top_k}, mtp_depth {cfg.mtp_depth}, {count_params(cfg, include_mtp=True):,} parameters")
    for note in rep.notes:
        print(f"  note: {note}")
    if rep.ignored:
        print(f"  ignored {len(rep.ignored)} tensor(s):")
        for k, why in sorted(rep.ignored.items()):
            print(f"    {k}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
