"""Validation record of the GPU kernels, keyed by device kind: written by the GPU kit
(`benchmarks/gpu_kit.py`), read by `impl='auto'` dispatch (`kernels_pallas.api`).

Why: the Triton kernels lower on CPU and match the references in interpret mode, but only a run on
the real device proves that they compile and give the right numbers there. `impl='auto'` therefore
picks a GPU kernel only for a kernel the kit has checked on this device kind with this JAX version;
with no record (or a failed check, or another JAX) it takes the reference / XLA path.

Record file (JSON), at `$C2JAX_KERNEL_RECORD` or `~/.cache/c2jax/kernel_validation.json`:
    {"version": 1, "devices": {"NVIDIA H200": {"jax": "0.10.2", "jaxlib": "0.10.2",
        "kernels": {"gmm_bf16": {"passed": true, "max_err_ratio": 0.03, "checked_at": "..."}, ...}}}}
`max_err_ratio` is the worst |kernel - reference| / allowed bound over the kit's checks (<= 1 passes).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import jax

RECORD_ENV = "C2JAX_KERNEL_RECORD"
VERSION = 1
# Kernels the kit validates (names used by `api` dispatch).
GMM_KERNELS = ("gmm_f32", "gmm_bf16", "gmm_fp8_blockwise", "gmm_mxfp8", "gmm_nvfp4_fwd_mxfp8_bwd")
QUANT_KERNELS = ("quant_mxfp8_e4m3", "quant_mxfp8_e5m2", "quant_nvfp4_per_token")
KERNELS = GMM_KERNELS + QUANT_KERNELS


def record_path() -> Path:
    """Where the record lives: `$C2JAX_KERNEL_RECORD`, else ~/.cache/c2jax/kernel_validation.json."""
    env = os.environ.get(RECORD_ENV)
    return Path(env) if env else Path.home() / ".cache" / "c2jax" / "kernel_validation.json"


def device_kind(device: Optional[jax.Device] = None) -> str:
    """`device_kind` of the given (default: first) device, e.g. 'NVIDIA H200'."""
    return (device or jax.devices()[0]).device_kind


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": VERSION, "devices": {}}
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"kernel validation record {path} is unreadable ({e}); delete it or rerun "
                         "benchmarks/gpu_kit.sh") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("devices"), dict):
        raise ValueError(f"kernel validation record {path} has an unknown layout (want version {VERSION})")
    return data


_CACHE: dict = {}


def load(path: Optional[Path] = None) -> dict:
    """The record (cached per path and modification time); an empty record when the file is absent."""
    path = Path(path) if path is not None else record_path()
    try:
        stamp = path.stat().st_mtime_ns
    except FileNotFoundError:
        stamp = None
    key = (str(path), stamp)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _read(path)
    return _CACHE[key]


def write(results: dict, kind: str, path: Optional[Path] = None) -> Path:
    """Merge `results` ({kernel: {"passed": bool, ...}}) for device `kind` into the record (atomic
    replace). Entries for other device kinds are kept; this kind's entry is replaced as a whole when
    the JAX version changed."""
    unknown = sorted(set(results) - set(KERNELS))
    if unknown:
        raise ValueError(f"unknown kernel names {unknown}; known: {KERNELS}")
    for name, r in results.items():
        if not isinstance(r, dict) or not isinstance(r.get("passed"), bool):
            raise ValueError(f"result for {name} needs a boolean 'passed', got {r!r}")
    path = Path(path) if path is not None else record_path()
    data = _read(path)
    import jaxlib
    entry = data["devices"].get(kind, {})
    if entry.get("jax") != jax.__version__:
        entry = {}
    entry.update({"jax": jax.__version__, "jaxlib": jaxlib.__version__})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry.setdefault("kernels", {}).update({k: {**v, "checked_at": now} for k, v in results.items()})
    data["devices"][kind] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def validated(kernel: str, kind: Optional[str] = None, path: Optional[Path] = None) -> bool:
    """True when the record says `kernel` passed on device kind `kind` (default: the first device,
    which must be a GPU) under the running JAX version."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {KERNELS}")
    if kind is None:
        dev = jax.devices()[0]
        if dev.platform != "gpu":
            return False
        kind = dev.device_kind
    entry = load(path)["devices"].get(kind)
    if not entry or entry.get("jax") != jax.__version__:
        return False
    return bool(entry.get("kernels", {}).get(kernel, {}).get("passed", False))
