"""Parity of the JAX model with the PyTorch reference `transformers.DeepseekV3ForCausalLM`.

Random weights (initializer_range 0.1, every tensor redrawn including norm scales) and a random
router correction bias (transformers initialises it to zero, which would leave the selection-only
bias untested); float32 on CPU. Checks: the chosen experts of every MoE layer are identical, and
logits agree to 2e-5 (the measured worst case over these configs is 3.7e-6 with logits up to ~3.5:
f32 rounding, not a loose bound), for configs that differ in q_lora_rank (incl. None), n_group/topk_group,
YaRN rope scaling (both mscale conventions), rope layout and first_k_dense_replace; the same for
the KV-cached path (prefill + decode steps, batched prompts of different lengths). A bfloat16 case
(bf16 weights and compute against the f32 reference on the same bf16-rounded weights) has bounds
suited to bf16, stated at `test_bf16_forward_parity`.

The reference is the `torch` extra; without it these tests fail (C2JAX_ALLOW_NO_TORCH=1 skips them).
"""
from __future__ import annotations

import numpy as np
import pytest

from _reference_imports import import_references, require_reference  # noqa: F401

(torch, transformers), pytestmark = import_references("torch", "transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from c2jax.model.config import AttentionConfig, ModelConfig, MoEConfig, RopeScaling  # noqa: E402
from c2jax.model.hf.config import hf_config_from_model_config  # noqa: E402
from c2jax.model.hf.keys import params_from_hf_state_dict  # noqa: E402
from c2jax.model.cache import init_cache  # noqa: E402
from c2jax.model.transformer import apply  # noqa: E402

TOL = 2e-5  # f32: measured worst 3.7e-6 (dense2_yarn_mscale), 2.5e-6, 2.7e-6


def _cfg(**kw) -> ModelConfig:
    base = ModelConfig(
        vocab_size=128, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96,
        first_k_dense_replace=1, max_position_embeddings=256, initializer_range=0.1, mtp_depth=0,
        attention=AttentionConfig(q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                                  qk_rope_head_dim=8, v_head_dim=16, rope_interleave=True),
        moe=MoEConfig(n_routed_experts=8, n_shared_experts=1, top_k=2, n_group=1, topk_group=1,
                      intermediate_size=32, routed_scaling_factor=2.5, impl="dropless"),
    )
    return base.replace(**kw)


CONFIGS = {
    # direct query projection, no grouping, plain RoPE, one dense layer
    "qproj_plain": _cfg(),
    # q LoRA, group-limited routing, YaRN with mscale_all_dim (Kimi/DeepSeek style), no dense layer,
    # rotate-half layout
    "qlora_groups_yarn": _cfg(**{
        "first_k_dense_replace": 0, "attention.q_lora_rank": 24, "attention.rope_interleave": False,
        "attention.rope_scaling": RopeScaling(factor=4.0, original_max_position_embeddings=64,
                                              beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        "moe.n_group": 4, "moe.topk_group": 2}),
    # two dense layers, YaRN without mscale_all_dim (attention factor on cos/sin), 2 shared
    # experts, 3-of-8 routing in 2 groups, no top-k normalisation
    "dense2_yarn_mscale": _cfg(**{
        "first_k_dense_replace": 2, "num_layers": 4, "attention.q_lora_rank": 40,
        "attention.rope_scaling": RopeScaling(factor=8.0, original_max_position_embeddings=32,
                                              beta_fast=16.0, beta_slow=2.0, mscale=0.707, mscale_all_dim=0.0),
        "moe.n_group": 2, "moe.topk_group": 1, "moe.top_k": 3, "moe.n_shared_experts": 2,
        "moe.norm_topk_prob": False}),
}


def _hf_model(cfg: ModelConfig, seed: int):
    hf = hf_config_from_model_config(cfg)
    config = transformers.DeepseekV3Config(**{k: v for k, v in hf.items() if k not in ("architectures",)})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            noise = torch.randn(t.shape, generator=g, dtype=torch.float32) * cfg.initializer_range
            if name.endswith("e_score_correction_bias"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.2 - 0.1)
            elif "norm" in name:
                t.copy_(1.0 + noise)
            else:
                t.copy_(noise)
    return model


def _to_params(model, cfg):
    sd = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    params = params_from_hf_state_dict(sd, cfg)
    return jax.tree_util.tree_map(jnp.asarray, params)


def _hf_forward(model, tokens: np.ndarray):
    """Logits and, per MoE layer, the chosen expert sets [B, S, k] (sorted)."""
    chosen = []

    def hook(mod, inp, out):
        chosen.append(np.sort(out[2].detach().numpy(), axis=-1))

    hs = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens)).logits.numpy()
    for h in hs:
        h.remove()
    b, s = tokens.shape
    return logits, [c.reshape(b, s, -1) for c in chosen]


_apply = jax.jit(apply, static_argnums=2)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request):
    cfg = CONFIGS[request.param]
    model = _hf_model(cfg, seed=len(request.param))
    params = _to_params(model, cfg)
    return cfg, model, params


def test_forward_parity(case):
    cfg, model, params = case
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 20)).astype(np.int64)
    ref_logits, ref_chosen = _hf_forward(model, tokens)
    out = _apply(params, jnp.asarray(tokens), cfg)
    routes = np.sort(np.asarray(out["routes"]), axis=-1)  # [B, S, L, k]
    assert len(ref_chosen) == cfg.n_moe_layers
    for layer, ref in enumerate(ref_chosen):
        np.testing.assert_array_equal(routes[:, :, layer], ref, err_msg=f"experts differ in MoE layer {layer}")
    err = np.abs(np.asarray(out["logits"]) - ref_logits).max()
    assert err <= TOL, f"max |logits - reference| = {err}"
    assert np.abs(ref_logits).max() > 0.1  # the comparison is not between near-zero tensors


def test_cached_decode_parity(case):
    """Batched prompts of different lengths (right-padded) prefilled into our latent cache, then
    greedy-independent decode steps with given tokens; each row against HF's own DynamicCache path."""
    cfg, model, params = case
    rng = np.random.default_rng(1)
    prompt_lens = [7, 4]
    n_new = 4
    seqs = [rng.integers(0, cfg.vocab_size, n + n_new).astype(np.int64) for n in prompt_lens]
    b, s_prompt = len(seqs), max(prompt_lens)
    prompt = np.zeros((b, s_prompt), np.int64)
    seg = np.zeros((b, s_prompt), np.int32)
    for i, (sq, n) in enumerate(zip(seqs, prompt_lens)):
        prompt[i, :n] = sq[:n]
        seg[i, :n] = 1
    cache = init_cache(cfg, b, 16)
    out = _apply(params, jnp.asarray(prompt), cfg, segment_ids=jnp.asarray(seg), cache=cache)
    ours = [[np.asarray(out["logits"])[i, n - 1]] for i, n in enumerate(prompt_lens)]
    cache = out["cache"]
    assert list(np.asarray(cache["lengths"])) == prompt_lens
    for step in range(n_new - 1):
        tok = np.array([[sq[n + step]] for sq, n in zip(seqs, prompt_lens)])
        out = _apply(params, jnp.asarray(tok), cfg, cache=cache)
        cache = out["cache"]
        for i in range(b):
            ours[i].append(np.asarray(out["logits"])[i, 0])
    for i, (sq, n) in enumerate(zip(seqs, prompt_lens)):
        with torch.no_grad():
            o = model(torch.from_numpy(sq[None, :n]), use_cache=True)
            ref = [o.logits[0, -1].numpy()]
            pkv = o.cache if hasattr(o, "cache") and o.cache is not None else o.past_key_values
            for step in range(n_new - 1):
                o = model(torch.from_numpy(sq[None, n + step:n + step + 1]), cache=pkv, use_cache=True)
                pkv = o.cache if hasattr(o, "cache") and o.cache is not None else o.past_key_values
                ref.append(o.logits[0, -1].numpy())
        err = np.abs(np.stack(ours[i]) - np.stack(ref)).max()
        assert err <= TOL, f"row {i}: max |cached logits - reference| = {err}"


def test_bf16_forward_parity(case, request):
    """bfloat16 weights and compute (ours) vs the f32 reference run on the same bf16-rounded weights,
    so the difference is bf16 arithmetic alone. bf16 keeps 8 significant bits (unit roundoff 2^-8 ~
    0.4%) and the error compounds over layers; a near-tie in the router can also flip an expert
    choice at a few positions, which changes those logits wholesale. Bounds: the routes agree at
    >= 90% of positions; where they agree, max |error| <= 10% of max |logit| (~25 roundoffs) and the
    mean |error| <= 2% of it. Measured on these configs: 97.5-100% agreement, max 1.8-5.8%, mean
    0.25-1.1%. The output must also differ from the f32 one by > 1e-3, so a silently-f32 path fails."""
    cfg, _, _ = case
    ref_model = _hf_model(cfg, seed=len(request.node.callspec.params["case"]))  # the fixture's weights
    with torch.no_grad():
        for name, t in ref_model.state_dict().items():
            if t.dtype == torch.float32 and not name.endswith("e_score_correction_bias"):
                t.copy_(t.to(torch.bfloat16).float())
    params32 = _to_params(ref_model, cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 20)).astype(np.int64)
    ref_logits, ref_chosen = _hf_forward(ref_model, tokens)
    cfg16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    params16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, params32)
    out = _apply(params16, jnp.asarray(tokens), cfg16)
    logits = np.asarray(out["logits"]).astype(np.float32)
    routes = np.sort(np.asarray(out["routes"]), axis=-1)  # [B, S, L, k]
    agree = np.ones(tokens.shape, bool)
    for layer, ref in enumerate(ref_chosen):
        agree &= (routes[:, :, layer] == ref).all(-1)
    scale = np.abs(ref_logits).max()
    err = np.abs(logits - ref_logits)  # [B, S, V]
    assert agree.mean() >= 0.9, f"routes agree at only {agree.mean():.1%} of positions"
    assert err[agree].max() <= 0.10 * scale, f"max error {err[agree].max()} vs max |logit| {scale}"
    assert err.mean() <= 0.02 * scale, f"mean error {err.mean()} vs max |logit| {scale}"
    f32 = np.asarray(_apply(params32, jnp.asarray(tokens), cfg)["logits"])
    assert np.abs(logits - f32).max() > 1e-3  # the bf16 path really computed in bf16
