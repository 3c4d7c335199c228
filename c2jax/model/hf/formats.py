"""Weight formats of the public DeepSeek-V3 / Kimi checkpoints, decoded with numpy, one tensor at a time.

* FP8 block quantisation (DeepSeek-V3, Kimi-K2; config ``quantization_config`` {quant_method: fp8,
  weight_block_size: [128, 128]}): ``<name>.weight`` float8_e4m3fn ``[out, in]`` and
  ``<name>.weight_scale_inv`` float32 ``[ceil(out/128), ceil(in/128)]``; the weight is
  ``w * scale_inv`` block by block (DeepSeek's ``weight_dequant``), computed in float32.
* compressed-tensors ``pack-quantized`` INT4 (Kimi-K2-Thinking, Kimi-K2.5 routed experts; config
  ``quantization_config`` {quant_method: compressed-tensors, format: pack-quantized, config_groups:
  {..: {weights: {num_bits: 4, group_size: 32, symmetric: true, strategy: group}}}}):
  ``<name>.weight_packed`` int32 ``[out, ceil(in/8)]``, ``<name>.weight_scale`` ``[out, in/group]``,
  ``<name>.weight_shape`` ``[2]`` (the unpacked shape) and, only when asymmetric,
  ``<name>.weight_zero_point`` packed the same way along dim 0. Packing (compressed_tensors
  ``pack_to_int32``): q in [-8, 7] is offset to the unsigned nibble q + 8; input column
  ``8*j + i`` sits in bits ``[4*i, 4*i + 4)`` of packed column ``j`` (lowest nibble first); the
  weight is ``(q - zero_point) * scale`` per group of ``group_size`` input columns.

`SafetensorsReader` streams tensors out of a (sharded) safetensors checkpoint. safetensors' numpy
API cannot return float8 tensors (numpy has no float8 dtype attribute), so those are read from the
file's header offsets with `np.memmap` and viewed as `ml_dtypes` float8.
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import ml_dtypes
import numpy as np
from safetensors import safe_open

from c2jax.model.hf.config import CheckpointError

FP8_SCALE_SUFFIX = "_scale_inv"      # "<name>.weight" + "_scale_inv"
INT4_SUFFIXES = ("_packed", "_scale", "_shape", "_zero_point")  # "<name>.weight" + suffix
_RAW_DTYPES = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


# ---- FP8 block quantisation ---------------------------------------------------------------------

def dequantize_fp8_blocks(w: np.ndarray, scale_inv: np.ndarray, block: Sequence[int] = (128, 128),
                          name: str = "") -> np.ndarray:
    """float8 ``w [out, in]`` times its per-block ``scale_inv [ceil(out/bo), ceil(in/bi)]`` -> float32."""
    bo, bi = int(block[0]), int(block[1])
    out, inn = w.shape
    want = (math.ceil(out / bo), math.ceil(inn / bi))
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(f"tensor {name + FP8_SCALE_SUFFIX!r} has shape {tuple(scale_inv.shape)}, "
                              f"expected {want} for weight {tuple(w.shape)} with {bo}x{bi} blocks")
    s = scale_inv.astype(np.float32)
    if out % bo == 0 and inn % bi == 0:  # one float32 temporary: broadcast the scale over each block
        wf = w.astype(np.float32).reshape(want[0], bo, want[1], bi)  # [nbo, bo, nbi, bi]
        wf *= s[:, None, :, None]
        return wf.reshape(out, inn)
    s = np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[:out, :inn]  # [out, in] (partial edge blocks)
    return w.astype(np.float32) * s


# ---- compressed-tensors pack-quantized INT4 --------------------------------------------------------

def unpack_int32(packed: np.ndarray, num_bits: int, n: int, axis: int = 1) -> np.ndarray:
    """Inverse of compressed_tensors ``pack_to_int32`` along `axis`: int32 -> signed int8, first `n` values kept."""
    if num_bits < 1 or 32 % num_bits:
        raise CheckpointError(f"pack-quantized num_bits={num_bits} is not supported (must divide 32: 1, 2, 4, 8)")
    per = 32 // num_bits
    u = np.ascontiguousarray(packed).view(np.uint32)
    if axis == 0:
        return unpack_int32(u.T.view(np.int32), num_bits, n, axis=1).T
    shifts = (np.arange(per, dtype=np.uint32) * num_bits)  # [per]
    nib = (u[:, :, None] >> shifts) & np.uint32((1 << num_bits) - 1)  # [rows, cols/per, per]
    if nib.shape[1] * per < n:
        raise CheckpointError(f"packed tensor holds {nib.shape[1] * per} values per row, fewer than {n}")
    vals = nib.reshape(nib.shape[0], -1)[:, :n].astype(np.int16) - (1 << (num_bits - 1))
    return vals.astype(np.int8)


def dequantize_packed(packed: np.ndarray, scale: np.ndarray, shape: Sequence[int], *, num_bits: int = 4,
                      group_size: Optional[int] = None, zero_point: Optional[np.ndarray] = None,
                      name: str = "") -> np.ndarray:
    """compressed-tensors pack-quantized (group strategy) -> float32 ``[out, in]``."""
    out, inn = int(shape[0]), int(shape[1])
    if packed.dtype != np.int32:
        raise CheckpointError(f"tensor {name + '_packed'!r} has dtype {packed.dtype}, expected int32")
    per = 32 // num_bits
    if tuple(packed.shape) != (out, math.ceil(inn / per)):
        raise CheckpointError(f"tensor {name + '_packed'!r} has shape {tuple(packed.shape)}, expected "
                              f"{(out, math.ceil(inn / per))} for weight_shape {(out, inn)}")
    q = unpack_int32(packed, num_bits, inn)  # [out, in] int8
    if scale.ndim == 1 or scale.shape[-1] == 1:  # channel strategy
        scale = scale.reshape(out, 1)
        group = inn
    else:
        group = group_size or inn // scale.shape[1]
    ngroups = math.ceil(inn / group)
    if tuple(scale.shape) != (out, ngroups):
        raise CheckpointError(f"tensor {name + '_scale'!r} has shape {tuple(scale.shape)}, expected "
                              f"{(out, ngroups)} (group size {group})")
    qf = q.astype(np.float32)
    if zero_point is not None:
        zp = unpack_int32(zero_point, num_bits, out, axis=0) if zero_point.dtype == np.int32 else zero_point
        if tuple(zp.shape) != (out, ngroups):
            raise CheckpointError(f"tensor {name + '_zero_point'!r} unpacks to {tuple(zp.shape)}, expected {(out, ngroups)}")
        qf = qf - np.repeat(zp.astype(np.float32), group, axis=1)[:, :inn]
    return qf * np.repeat(scale.astype(np.float32), group, axis=1)[:, :inn]


def int4_settings(quant_cfg: Optional[Mapping[str, Any]]) -> tuple[int, Optional[int]]:
    """(num_bits, group_size) of a compressed-tensors ``quantization_config`` (first weight group)."""
    if not quant_cfg or quant_cfg.get("quant_method") != "compressed-tensors":
        return 4, None
    fmt = quant_cfg.get("format")
    if fmt not in (None, "pack-quantized"):
        raise CheckpointError(f"compressed-tensors format {fmt!r} is not supported (only 'pack-quantized')")
    for grp in (quant_cfg.get("config_groups") or {}).values():
        w = grp.get("weights") or {}
        if w.get("type", "int") != "int":
            raise CheckpointError(f"compressed-tensors weight type {w.get('type')!r} is not supported (only 'int')")
        if w.get("strategy", "group") not in ("group", "channel"):
            raise CheckpointError(f"compressed-tensors strategy {w.get('strategy')!r} is not supported "
                                  "(only 'group' and 'channel')")
        return int(w.get("num_bits", 4)), w.get("group_size")
    return 4, None


SUPPORTED_QUANT_METHODS = ("fp8", "compressed-tensors")


def check_quantization(quant_cfg: Optional[Mapping[str, Any]]) -> None:
    """Fail early, naming it, on a ``quantization_config`` this module cannot decode."""
    if not quant_cfg:
        return
    method = quant_cfg.get("quant_method")
    if method not in SUPPORTED_QUANT_METHODS:
        raise CheckpointError(f"quantization method {method!r} is not supported; c2jax decodes "
                              f"{list(SUPPORTED_QUANT_METHODS)} (FP8 blocks, compressed-tensors pack-quantized INT)")
    if method == "fp8":
        fp8_block_size(quant_cfg)
    else:
        int4_settings(quant_cfg)


def fp8_block_size(quant_cfg: Optional[Mapping[str, Any]]) -> tuple[int, int]:
    if quant_cfg and quant_cfg.get("quant_method") == "fp8":
        b = quant_cfg.get("weight_block_size")
        if b is None or len(b) != 2:
            raise CheckpointError(f"fp8 quantization_config needs weight_block_size [rows, cols], got {b!r} "
                                  "(per-tensor FP8 is not supported)")
        return int(b[0]), int(b[1])
    return 128, 128


# ---- safetensors reading ------------------------------------------------------------------------

class SafetensorsReader:
    """Lazy, per-tensor access to every tensor of a checkpoint directory (single file or sharded index)."""

    def __init__(self, path: str):
        self.path = path
        self._headers: dict[str, dict] = {}
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            self.files = {k: os.path.join(path, v) for k, v in weight_map.items()}
        else:
            names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
            if not names:
                raise CheckpointError(f"no *.safetensors files (and no model.safetensors.index.json) in {path}")
            self.files = {}
            for n in names:
                fn = os.path.join(path, n)
                self._headers[fn] = _header(fn)
                for k in tensor_names(self._headers[fn]):
                    if k in self.files:
                        raise CheckpointError(f"tensor {k!r} appears in both {self.files[k]} and {fn}")
                    self.files[k] = fn
        self._handles: dict[str, Any] = {}

    def keys(self) -> Iterable[str]:
        return self.files.keys()

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def _info(self, key: str) -> dict:
        fn = self.files[key]
        if fn not in self._headers:
            if not os.path.exists(fn):
                raise CheckpointError(f"shard {fn} named by the index for {key!r} does not exist")
            self._headers[fn] = _header(fn)
        try:
            return self._headers[fn][key]
        except KeyError:
            raise CheckpointError(f"tensor {key!r} is listed in the index but absent from {fn}") from None

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._info(key)["shape"])

    def dtype(self, key: str) -> str:
        return self._info(key)["dtype"]

    def get(self, key: str) -> np.ndarray:
        info, fn = self._info(key), self.files[key]
        if info["dtype"] in _RAW_DTYPES:  # safetensors' numpy API has no float8
            start, end = info["data_offsets"]
            base = self._headers[fn]["__data_start__"]
            dt = np.dtype(_RAW_DTYPES[info["dtype"]])
            mm = np.memmap(fn, dtype=np.uint8, mode="r", offset=base + start, shape=(end - start,))
            return np.asarray(mm).view(dt).reshape(info["shape"])  # read-only view; decoded by the caller
        if fn not in self._handles:
            self._handles[fn] = safe_open(fn, framework="np")
        return self._handles[fn].get_tensor(key)

    def close(self) -> None:
        self._handles.clear()


def _header(fn: str) -> dict:
    """Parse a safetensors header: {name: {dtype, shape, data_offsets}} plus ``__data_start__``."""
    with open(fn, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{fn} is not a safetensors file (truncated header)")
        (n,) = struct.unpack("<Q", raw)
        try:
            hdr = json.loads(f.read(n))
        except ValueError as e:
            raise CheckpointError(f"{fn} is not a safetensors file ({e})") from None
    hdr.pop("__metadata__", None)
    out = {k: v for k, v in hdr.items()}
    out["__data_start__"] = 8 + n  # type: ignore[assignment]
    return out


def tensor_names(hdr: Mapping[str, Any]) -> Iterator[str]:
    return (k for k in hdr if k != "__data_start__")
