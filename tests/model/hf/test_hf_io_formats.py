"""from_pretrained / save_pretrained on tiny synthetic checkpoints written in each public format.

Every checkpoint is written here with safetensors' numpy API by independent code: an FP8 block
quantiser (per-block loops), an INT4 compressed-tensors packer (nibbles assembled into little-endian
bytes), a Kimi-K2.5 layout with a vision tower beside ``language_model.``, DeepSeek-V3 MTP layers.
Expected weights are computed by the test's own dequantiser, not the library's.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from c2jax.model.config import ModelConfig
from c2jax.model.hf.config import CheckpointError, UnsupportedArchitectureError, hf_config_from_model_config
from c2jax.model.hf.formats import dequantize_packed, unpack_int32
from c2jax.model.hf.io import from_pretrained, inspect_checkpoint, main, save_pretrained
from c2jax.model.hf.keys import hf_state_dict_from_params

from _hf_ckpt_writers import (BF16, assert_trees_equal, tiny_cfg, fp8_expected, fp8_quantise, int4_pack,
                             fp8_quantisable, random_params, write_checkpoint)

# ---- FP8 (DeepSeek-V3 / Kimi-K2) -----------------------------------------------------------------

@pytest.mark.parametrize("block,shards", [(128, 3), (32, 1)])
def test_fp8_block_checkpoint_with_mtp(tmp_path, block, shards):
    cfg = tiny_cfg(mtp=1)
    params = random_params(cfg)
    sd = hf_state_dict_from_params(params, cfg, layout="per_expert")  # includes MTP shared copies
    assert "model.layers.3.eh_proj.weight" in sd and "model.layers.3.shared_head.head.weight" in sd
    tensors, expected = {}, {}
    for k, v in sd.items():
        if fp8_quantisable(k):
            q, s = fp8_quantise(v, block)
            tensors[k], tensors[k + "_scale_inv"] = q, s
            expected[k] = fp8_expected(q, s, block)
        else:
            tensors[k] = v.astype(BF16)
            expected[k] = tensors[k].astype(np.float32)
    hf = hf_config_from_model_config(cfg)
    hf.update(dtype="bfloat16", quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3",
                                                      "quant_method": "fp8", "weight_block_size": [block, block]})
    write_checkpoint(str(tmp_path / "ckpt"), hf, tensors, n_shards=shards)

    loaded, lcfg, rep = from_pretrained(str(tmp_path / "ckpt"), dtype="float32", return_report=True)
    assert lcfg == cfg
    assert rep.formats["fp8"] == sum(map(fp8_quantisable, sd)) and rep.layout == "per_expert"
    assert set(rep.ignored) == {"model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight"}
    # expected tree: the library's (transformers-verified) mapping of the independently dequantised tensors
    from c2jax.model.hf.keys import params_from_hf_state_dict
    want = params_from_hf_state_dict(expected, cfg, dtype="float32")
    assert_trees_equal(loaded, want)
    # the dequantised weights are close to the originals (sanity of the quantiser itself)
    np.testing.assert_allclose(loaded["dense_layers"]["mlp"]["gate_proj"]["kernel"],
                               params["dense_layers"]["mlp"]["gate_proj"]["kernel"], rtol=0.07, atol=0.02)
    np.testing.assert_allclose(loaded["mtp"]["eh_proj"]["kernel"], params["mtp"]["eh_proj"]["kernel"],
                               rtol=0.07, atol=0.02)

    # the weight-free check agrees on config, formats and ignored tensors
    icfg, irep = inspect_checkpoint(str(tmp_path / "ckpt"))
    assert icfg.param_dtype == "bfloat16"  # the checkpoint's dtype (from_pretrained above overrode it)
    assert icfg.replace(dtype="float32", param_dtype="float32") == lcfg
    assert irep.formats == rep.formats and irep.ignored == rep.ignored

    # without MTP: the MTP layer is listed as ignored
    l2, c2, rep2 = from_pretrained(str(tmp_path / "ckpt"), load_mtp=False, return_report=True)
    assert c2.mtp_depth == 0 and "mtp" not in l2
    assert "model.layers.3.eh_proj.weight_scale_inv" in rep2.ignored
    assert l2["lm_head"]["kernel"].dtype == BF16 and l2["moe_layers"]["moe"]["router"]["bias"].dtype == np.float32


def test_load_save_load_bit_exact(tmp_path):
    cfg = tiny_cfg(mtp=1)
    params = random_params(cfg, seed=3)
    sd = hf_state_dict_from_params(params, cfg)
    tensors = {}
    for k, v in sd.items():
        if fp8_quantisable(k):
            tensors[k], tensors[k + "_scale_inv"] = fp8_quantise(v, 128)
        else:
            tensors[k] = v.astype(BF16)
    hf = hf_config_from_model_config(cfg)
    hf.update(dtype="bfloat16", quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    write_checkpoint(str(tmp_path / "a"), hf, tensors)
    p1, c1 = from_pretrained(str(tmp_path / "a"))
    assert c1.param_dtype == "bfloat16"
    for layout in ("per_expert", "fused"):
        out = str(tmp_path / f"b_{layout}")
        files = save_pretrained(p1, c1, out, layout=layout, max_shard_bytes=40_000)
        assert sum(f.endswith(".safetensors") for f in files) > 2
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        assert set(idx["weight_map"].values()) == {os.path.basename(f) for f in files if f.endswith(".safetensors")}
        p2, c2 = from_pretrained(out)
        assert c2 == c1
        assert_trees_equal(p1, p2)
    # f32 params saved as bf16 then loaded as f32 equal the bf16 rounding of the originals
    save_pretrained(params, cfg, str(tmp_path / "c"), dtype="bfloat16")
    p3, _ = from_pretrained(str(tmp_path / "c"), dtype="float32")
    np.testing.assert_array_equal(p3["lm_head"]["kernel"], params["lm_head"]["kernel"].astype(BF16).astype(np.float32))
    np.testing.assert_array_equal(p3["moe_layers"]["moe"]["router"]["bias"], params["moe_layers"]["moe"]["router"]["bias"])
    with pytest.raises(FileExistsError):
        save_pretrained(params, cfg, str(tmp_path / "c"))


# ---- INT4 compressed-tensors (Kimi-K2.5) ---------------------------------------------------------

def _kimi_k25_checkpoint(path: str, cfg: ModelConfig, params: dict, quant_in_text_config: bool) -> dict:
    sd = hf_state_dict_from_params(params, cfg, layout="per_expert")
    tensors, expected = {}, {}
    for k, v in sd.items():
        if ".mlp.experts." in k:
            packed, scale, q = int4_pack(v, 32)
            base = "language_model." + k[: -len("weight")]
            tensors[base + "weight_packed"] = packed
            tensors[base + "weight_scale"] = scale
            tensors[base + "weight_shape"] = np.array(v.shape, np.int64)
            g = q.reshape(v.shape[0], -1, 32).astype(np.float32) * scale.astype(np.float32)[..., None]
            expected[k] = g.reshape(v.shape)
        else:
            tensors["language_model." + k] = v.astype(BF16)
            expected[k] = tensors["language_model." + k].astype(np.float32)
    inv_freq = "language_model.model.layers.0.self_attn.rotary_emb.inv_freq"
    tensors[inv_freq] = np.ones(cfg.attention.qk_rope_head_dim // 2, np.float32)
    rng = np.random.default_rng(7)
    vision = {"vision_tower.patch_embed.proj.weight": rng.standard_normal((16, 3, 4, 4)).astype(BF16),
              "vision_tower.encoder.blocks.0.wqkv.weight": rng.standard_normal((48, 16)).astype(BF16),
              "mm_projector.proj.0.weight": rng.standard_normal((64, 16)).astype(BF16)}
    tensors.update(vision)
    quant = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                 "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                 "dynamic": False, "actorder": None}, "input_activations": None, "output_activations": None}},
             "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"]}
    text = hf_config_from_model_config(cfg)
    text.update(model_type="kimi_k2", dtype="bfloat16")
    hf = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
          "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 16}}
    (text if quant_in_text_config else hf)["quantization_config"] = quant
    write_checkpoint(path, hf, tensors, n_shards=2)
    return {"expected": expected, "ignored": set(vision) | {inv_freq}}


@pytest.mark.parametrize("quant_in_text_config", [True, False])
def test_int4_kimi_k25_checkpoint(tmp_path, quant_in_text_config):
    cfg = tiny_cfg(mtp=0)
    params = random_params(cfg, seed=1)
    info = _kimi_k25_checkpoint(str(tmp_path / "k25"), cfg, params, quant_in_text_config)
    loaded, lcfg, rep = from_pretrained(str(tmp_path / "k25"), dtype="float32", return_report=True)
    assert lcfg == cfg and rep.prefix == "language_model."
    E, n_moe = cfg.moe.n_routed_experts, cfg.n_moe_layers
    assert rep.formats["int4"] == 3 * E * n_moe
    assert set(rep.ignored) == info["ignored"]
    icfg, irep = inspect_checkpoint(str(tmp_path / "k25"))
    assert irep.formats == rep.formats and irep.ignored == rep.ignored
    from c2jax.model.hf.keys import params_from_hf_state_dict
    assert_trees_equal(loaded, params_from_hf_state_dict(info["expected"], cfg, dtype="float32"))
    # INT4 error is bounded by half a quantisation step of each group
    got = loaded["moe_layers"]["moe"]["experts"]["down_proj"]
    ref = params["moe_layers"]["moe"]["experts"]["down_proj"]
    assert np.abs(got - ref).max() <= np.abs(ref).max() / 7.0 * 0.5 * 1.02 + 1e-6


def test_unpack_nonmultiple_and_asymmetric():
    """Columns not a multiple of 8 (padding) and packed zero points (asymmetric), vs the test's own packer."""
    rng = np.random.default_rng(2)
    out, inn, group = 6, 20, 10
    q = rng.integers(-8, 8, size=(out, inn)).astype(np.int8)
    pad = np.concatenate([q, np.zeros((out, 4), np.int8) - 8], 1)  # pads as nibble 0
    u = (pad.astype(np.int16) + 8).astype(np.uint8)
    packed = np.ascontiguousarray(u[:, 0::2] | (u[:, 1::2] << 4)).view("<i4").astype(np.int32)  # [6, 3]
    np.testing.assert_array_equal(unpack_int32(packed, 4, inn), q)
    zp = rng.integers(-8, 8, size=(out, inn // group)).astype(np.int8)  # [6, 2], packed along dim 0
    zpad = np.concatenate([zp, np.zeros((2, 2), np.int8) - 8], 0)  # rows to 8
    zu = (zpad.astype(np.int16) + 8).astype(np.uint8).T  # [2, 8]
    zpacked = np.ascontiguousarray(np.ascontiguousarray(zu[:, 0::2] | (zu[:, 1::2] << 4)).view("<i4").T).astype(np.int32)
    scale = rng.random((out, inn // group)).astype(np.float32)
    w = dequantize_packed(packed, scale, (out, inn), group_size=group, zero_point=zpacked)
    want = np.empty((out, inn), np.float32)
    for r in range(out):
        for c in range(inn):
            want[r, c] = (float(q[r, c]) - float(zp[r, c // group])) * scale[r, c // group]
    np.testing.assert_array_equal(w, want)


# ---- bad checkpoints -----------------------------------------------------------------------------

def _plain_ckpt(path, cfg, params, mutate=None, config_mutate=None):
    sd = hf_state_dict_from_params(params, cfg)
    if mutate:
        mutate(sd)
    hf = hf_config_from_model_config(cfg)
    if config_mutate:
        config_mutate(hf)
    write_checkpoint(path, hf, sd, n_shards=2)


def test_bad_checkpoints_fail_loudly(tmp_path):
    cfg = tiny_cfg(mtp=1)
    params = random_params(cfg)

    def drop(sd):
        del sd["model.layers.2.mlp.experts.5.up_proj.weight"]
        del sd["model.layers.3.enorm.weight"]
        sd["model.layers.2.mlp.experts.8.up_proj.weight"] = np.zeros((64, 64), np.float32)

    _plain_ckpt(str(tmp_path / "a"), cfg, params, drop)
    with pytest.raises(CheckpointError) as ei:
        from_pretrained(str(tmp_path / "a"))
    msg = str(ei.value)
    assert "missing 2" in msg and "model.layers.2.mlp.experts.5.up_proj.weight" in msg
    assert "model.layers.3.enorm.weight" in msg
    assert "unexpected 1" in msg and "model.layers.2.mlp.experts.8.up_proj.weight" in msg

    def reshape(sd):
        sd["model.layers.1.self_attn.kv_b_proj.weight"] = np.zeros((128, 31), np.float32)

    _plain_ckpt(str(tmp_path / "b"), cfg, params, reshape)
    for fn in (from_pretrained, inspect_checkpoint):
        with pytest.raises(CheckpointError, match=r"kv_b_proj.weight'.*\(128, 31\).*\(128, 32\)"):
            fn(str(tmp_path / "b"))

    def arch(hf):
        hf.update(model_type="mixtral", architectures=["MixtralForCausalLM"])

    _plain_ckpt(str(tmp_path / "c"), cfg, params, config_mutate=arch)
    with pytest.raises(UnsupportedArchitectureError, match="mixtral.*MixtralForCausalLM"):
        from_pretrained(str(tmp_path / "c"))

    # config with one layer fewer than the checkpoint: the extra decoder layer is unexpected, not ignored
    def fewer(hf):
        hf["num_hidden_layers"] = 2
        hf["num_nextn_predict_layers"] = hf["num_mtp_layers"] = 0

    _plain_ckpt(str(tmp_path / "d"), cfg.replace(mtp_depth=0), random_params(cfg.replace(mtp_depth=0)),
                config_mutate=fewer)
    with pytest.raises(CheckpointError, match=r"unexpected \d+ tensor\(s\): model.layers.2"):
        from_pretrained(str(tmp_path / "d"))

    # FP8 scale with the wrong block grid; INT4 without its scale; index naming a missing shard
    sd = hf_state_dict_from_params(params, cfg)
    k = "model.layers.0.mlp.down_proj.weight"  # [64, 192] -> scale grid (1, 2) for 128 blocks
    q, s = fp8_quantise(sd[k], 128)
    sd[k], sd[k + "_scale_inv"] = q, np.ones((1, 1), np.float32)
    write_checkpoint(str(tmp_path / "e"), hf_config_from_model_config(cfg), sd)
    with pytest.raises(CheckpointError, match=r"down_proj.weight_scale_inv'.*\(1, 1\).*\(1, 2\)"):
        from_pretrained(str(tmp_path / "e"))
    sd = hf_state_dict_from_params(params, cfg)
    k = "model.layers.1.mlp.experts.0.gate_proj"
    w = sd.pop(k + ".weight")
    sd[k + ".weight_packed"], _, _ = int4_pack(w, 32)
    sd[k + ".weight_shape"] = np.array(w.shape, np.int64)
    write_checkpoint(str(tmp_path / "f"), hf_config_from_model_config(cfg), sd)
    with pytest.raises(CheckpointError, match=r"experts.0.gate_proj.weight.*lacking \['weight_scale'\]"):
        from_pretrained(str(tmp_path / "f"))
    sd = hf_state_dict_from_params(params, cfg)
    k = "model.layers.0.self_attn.o_proj.weight"
    sd[k] = fp8_quantise(sd[k], 128)[0]  # float8 payload whose scale_inv is missing
    write_checkpoint(str(tmp_path / "h"), hf_config_from_model_config(cfg), sd)
    with pytest.raises(CheckpointError, match=r"o_proj.weight' has dtype F8_E4M3 but no quantisation scale"):
        from_pretrained(str(tmp_path / "h"))
    def gptq(hf):
        hf["quantization_config"] = {"quant_method": "gptq", "bits": 4}

    _plain_ckpt(str(tmp_path / "i"), cfg, params, config_mutate=gptq)
    with pytest.raises(CheckpointError, match="quantization method 'gptq' is not supported"):
        inspect_checkpoint(str(tmp_path / "i"))
    _plain_ckpt(str(tmp_path / "g"), cfg, params)
    os.remove(str(tmp_path / "g" / "model-00002-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*does not exist"):
        from_pretrained(str(tmp_path / "g"))


def test_model_init_params_save_and_load(tmp_path):
    """The model's own `init` tree (jax arrays, with MTP) saves and loads back bit for bit."""
    import jax

    from c2jax.model.transformer import init

    cfg = tiny_cfg(mtp=1)
    params = init(cfg, jax.random.key(0))
    save_pretrained(params, cfg, str(tmp_path / "x"), layout="fused", max_shard_bytes=100_000)
    loaded, lcfg = from_pretrained(str(tmp_path / "x"))
    assert lcfg == cfg
    assert_trees_equal(jax.tree.map(np.asarray, params), loaded)


def test_inspect_cli(tmp_path, capsys):
    cfg = tiny_cfg(mtp=1)
    save_pretrained(random_params(cfg), cfg, str(tmp_path))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "layout=per_expert" in out and "model.layers.3.shared_head.head.weight" in out
