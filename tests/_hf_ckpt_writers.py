"""Independent writers for synthetic HF checkpoints used by the tests/model/hf/test_hf_io_*.py files.

An FP8 block quantiser (per-block loops, DeepSeek's amax/448 recipe), an INT4 compressed-tensors
packer (nibbles assembled into little-endian bytes), and a safetensors directory writer (single
file or sharded with an index) - none of them shares code with c2jax.model.hf.formats.
"""
from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from c2jax.model.config import ModelConfig, preset
from c2jax.model.params_spec import ParamSpec, param_specs

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)


def tiny_cfg(mtp: int = 1) -> ModelConfig:
    # tiny, with a dense MLP of 192 (= 1.5 FP8 blocks of 128) so block edges are exercised
    return preset("tiny").replace(mtp_depth=mtp)


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def build(t):
        if isinstance(t, ParamSpec):
            return (rng.standard_normal(t.shape) * 0.5).astype(np.float32)
        return {k: build(v) for k, v in t.items()}

    return build(param_specs(cfg))


def _flat(tree, prefix=()):
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from _flat(tree[k], prefix + (k,))
    else:
        yield "/".join(prefix), tree


def assert_trees_equal(a, b):
    fa, fb = dict(_flat(a)), dict(_flat(b))
    assert fa.keys() == fb.keys()
    for k in fa:
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype, x.shape, y.shape)
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), k  # bitwise


def write_checkpoint(path: str, config: dict, tensors: dict, n_shards: int = 1) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    keys = list(tensors)
    if n_shards == 1:
        save_file({k: np.ascontiguousarray(tensors[k]) for k in keys}, os.path.join(path, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    chunks = np.array_split(np.arange(len(keys)), n_shards)
    wmap = {}
    for i, idx in enumerate(chunks):
        name = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({keys[j]: np.ascontiguousarray(tensors[keys[j]]) for j in idx}, os.path.join(path, name),
                  metadata={"format": "pt"})
        wmap.update({keys[j]: name for j in idx})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wmap}, f)


def fp8_quantise(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Independent block quantiser: per block amax/448 scale, float8 e4m3 payload (DeepSeek's recipe)."""
    out, inn = w.shape
    nb_o, nb_i = math.ceil(out / block), math.ceil(inn / block)
    q = np.empty(w.shape, F8)
    s = np.empty((nb_o, nb_i), np.float32)
    for bo in range(nb_o):
        for bi in range(nb_i):
            blk = w[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block].astype(np.float32)
            scale = np.float32(max(float(np.abs(blk).max()), 1e-12) / 448.0)
            s[bo, bi] = scale
            q[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block] = (blk / scale).astype(F8)
    return q, s


def fp8_expected(q: np.ndarray, s: np.ndarray, block: int) -> np.ndarray:
    w = np.empty(q.shape, np.float32)
    for bo in range(s.shape[0]):
        for bi in range(s.shape[1]):
            sl = np.s_[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block]
            w[sl] = q[sl].astype(np.float32) * s[bo, bi]
    return w


def int4_pack(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independent symmetric group-wise INT4 quantiser + compressed-tensors packer.

    Returns (weight_packed int32 [out, in/8], weight_scale bf16 [out, in/group], q int8 [out, in]).
    Packing: unsigned nibble u = q + 8; values 2b and 2b+1 share byte b (even index in the low
    nibble); bytes are read as little-endian int32, so value 8j+i sits in bits [4i, 4i+4) of word j.
    """
    out, inn = w.shape
    assert inn % 8 == 0 and inn % group == 0
    g = w.reshape(out, inn // group, group)
    scale = (np.abs(g).max(-1) / 7.0).astype(BF16)  # stored bf16, as Kimi does
    sf = scale.astype(np.float32)[..., None]
    q = np.clip(np.rint(g / np.where(sf == 0, 1, sf)), -8, 7).astype(np.int8).reshape(out, inn)
    u = (q.astype(np.int16) + 8).astype(np.uint8)  # [out, in] nibbles
    bytes_ = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)  # [out, in/2]
    packed = np.ascontiguousarray(bytes_).view("<i4").astype(np.int32)  # [out, in/8]
    return packed, scale, q


def fp8_quantisable(key: str) -> bool:
    """DeepSeek-V3's FP8 checkpoint quantises every projection except the router and LM head/embedding."""
    return key.endswith("_proj.weight") or key.endswith("kv_a_proj_with_mqa.weight")


