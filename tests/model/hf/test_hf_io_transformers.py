"""Checkpoint interop with the third-party references: transformers 5 (its own save/load and its FP8
dequantiser) and compressed-tensors (its INT4 packer and dequantiser)."""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

from _reference_imports import import_references, require_reference  # noqa: F401

from c2jax.model.config import preset
from c2jax.model.hf.config import hf_config_from_model_config
from c2jax.model.hf.formats import dequantize_packed, unpack_int32
from c2jax.model.hf.io import from_pretrained, save_pretrained
from c2jax.model.hf.keys import hf_state_dict_from_params, params_from_hf_state_dict

from _hf_ckpt_writers import BF16, assert_trees_equal, fp8_quantise, fp8_quantisable, random_params, write_checkpoint

(torch, transformers), pytestmark = import_references("torch", "transformers")


def _model(cfg, seed=0):
    hc = transformers.DeepseekV3Config(**hf_config_from_model_config(cfg))
    torch.manual_seed(seed)
    m = transformers.DeepseekV3ForCausalLM(hc).eval()
    with torch.no_grad():
        for name, buf in m.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn_like(buf))
    return m


def _sd(m):
    return {k: v.detach().float().numpy().copy() for k, v in m.state_dict().items()}


def test_reads_transformers_save_pretrained(tmp_path):
    """transformers writes the public per-expert layout, sharded, and a config that declares one MTP
    module without storing it: we load it (noting the absent MTP) equal to its in-memory state dict."""
    cfg = preset("tiny")  # mtp_depth=1
    m = _model(cfg)
    m.save_pretrained(str(tmp_path), max_shard_size="100KB")
    idx = json.load(open(tmp_path / "model.safetensors.index.json"))
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in idx["weight_map"]
    params, lcfg, rep = from_pretrained(str(tmp_path), return_report=True)
    assert lcfg == cfg.replace(mtp_depth=0) and rep.layout == "per_expert"
    assert any("MTP" in n for n in rep.notes)
    assert_trees_equal(params, params_from_hf_state_dict(_sd(m), lcfg))


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_transformers_reads_our_save_pretrained(tmp_path, layout):
    cfg = preset("tiny").replace(mtp_depth=0, **{"attention.q_lora_rank": None, "moe.n_group": 1,
                                                 "moe.topk_group": 1})
    m = _model(cfg, seed=1)
    sd = _sd(m)
    params = params_from_hf_state_dict(sd, cfg)
    save_pretrained(params, cfg, str(tmp_path), layout=layout, max_shard_bytes=150_000)
    m2 = transformers.DeepseekV3ForCausalLM.from_pretrained(str(tmp_path))
    sd2 = _sd(m2)
    assert set(sd2) == set(sd)
    for k in sd:
        assert np.array_equal(sd2[k], sd[k]), k


def test_fp8_dequant_matches_transformers(tmp_path):
    """transformers' FP8 loader (dequantising on CPU) and ours read the same checkpoint identically.
    transformers needs block-divisible shapes, so this uses an 8x8 block grid."""
    require_reference("accelerate")
    cfg = preset("tiny").replace(mtp_depth=0)
    sd = hf_state_dict_from_params(random_params(cfg, seed=5), cfg)
    t = {}
    for k, v in sd.items():
        if fp8_quantisable(k):
            t[k], t[k + "_scale_inv"] = fp8_quantise(v, 8)
        else:
            t[k] = v.astype(BF16)
    hf = hf_config_from_model_config(cfg)
    hf.update(dtype="bfloat16", quantization_config={"quant_method": "fp8", "weight_block_size": [8, 8],
                                                      "activation_scheme": "dynamic", "fmt": "e4m3"})
    write_checkpoint(str(tmp_path), hf, t)
    m = transformers.DeepseekV3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ours, _, rep = from_pretrained(str(tmp_path), dtype="float32", return_report=True)
    assert rep.formats["fp8"] > 0
    assert_trees_equal(ours, params_from_hf_state_dict(_sd(m), cfg, dtype="float32"))


def test_int4_matches_compressed_tensors():
    """compressed-tensors' own packer + group dequantiser vs our unpack/dequant (bf16 result bit-exact;
    ours is the exact float32 product, theirs rounds in the scale's bf16)."""
    ct = require_reference("compressed_tensors")
    try:  # compressed-tensors >= 0.13 moved the packer
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    except ImportError:
        from compressed_tensors.compressors.quantized_compressors.pack_quantized import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize

    del ct
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 96, generator=g).to(torch.bfloat16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    scale = (w.float().reshape(24, 3, 32).abs().amax(-1) / 7).to(torch.bfloat16)
    zp = torch.zeros_like(scale, dtype=torch.int8)
    q = quantize(w, scale, zp, args, dtype=torch.int8)
    packed = pack_to_int32(q, 4)
    assert tuple(packed.shape) == (24, 12)
    np.testing.assert_array_equal(unpack_int32(packed.numpy(), 4, 96), q.numpy())
    ours = dequantize_packed(packed.numpy(), scale.float().numpy(), (24, 96), group_size=32)
    theirs = dequantize(q, scale, zp, args).float().numpy()
    np.testing.assert_array_equal(ours.astype(ml_dtypes.bfloat16).astype(np.float32), theirs)
    exact = q.float().numpy().reshape(24, 3, 32) * scale.float().numpy()[..., None]
    np.testing.assert_array_equal(ours, exact.reshape(24, 96))
