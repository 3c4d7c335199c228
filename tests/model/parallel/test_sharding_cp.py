"""Context-parallel MLA attention: equals unsharded attention (packed segments, balanced and
contiguous chunking, sub-chunk KV blocks, gradients), balanced block counts, and the all-gather
bytes of latent vs up-projected KV gathering read from the compiled HLO."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _sharding_common import rel_fro
from c2jax.model import mla
from c2jax.model.parallel.comm_stats import compiled_collective_stats
from c2jax.model.config import preset
from c2jax.model.parallel.cp_attention import causal_block_counts, cp_attention, zigzag_perms
from c2jax.model.parallel.sharding import MeshConfig, make_mesh

B, S = 2, 32


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(data=2, context=4))


@pytest.fixture(scope="module")
def inputs():
    cfg = preset("tiny")
    a, H = cfg.attention, cfg.num_heads
    k = jax.random.split(jax.random.key(0), 5)
    qn = jax.random.normal(k[0], (B, S, H, a.qk_nope_head_dim))
    qr = jax.random.normal(k[1], (B, S, H, a.qk_rope_head_dim))
    ckv = jax.random.normal(k[2], (B, S, a.kv_lora_rank))
    kr = jax.random.normal(k[3], (B, S, a.qk_rope_head_dim))
    w = jax.random.normal(k[4], (a.kv_lora_rank, H, a.qk_nope_head_dim + a.v_head_dim)) * 0.2
    seg = np.zeros((B, S), np.int32)  # packed: documents crossing chunk boundaries + padding
    seg[0, :11], seg[0, 11:25], seg[0, 25:30] = 1, 2, 3
    seg[1, :3], seg[1, 3:] = 1, 2
    return cfg, (qn, qr, ckv, kr, jnp.asarray(seg), w)


def _reference(cfg, qn, qr, ckv, kr, seg, w):
    mask = jnp.tril(jnp.ones((S, S), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    return mla.attend_expanded({"kv_b_proj": {"kernel": w}}, qn, qr, ckv, kr, mask, cfg)


def test_zigzag_perms_are_permutations():
    for n in (1, 2, 3, 4, 8):
        for pairs in zigzag_perms(n):
            assert sorted(d for _, d in pairs) == list(range(n))
        assert causal_block_counts(n, True) == [2 * n + 1] * n


@pytest.mark.parametrize("balanced,block", [(True, 0), (False, 0), (True, 2)])
def test_cp_attention_equals_unsharded_with_packed_segments(mesh, inputs, balanced, block):
    cfg, args = inputs
    ref = _reference(cfg, *args)
    o, counts = jax.jit(lambda *x: cp_attention(mesh, *x, cfg, balanced=balanced, block=block))(*args)
    assert rel_fro(o, ref) <= 1e-5
    counts = np.asarray(counts).reshape(mesh.devices.shape)  # [data, fsdp, expert, context]
    per_rank = counts[0, 0, 0]
    assert (counts == per_rank).all()  # every data replica does the same work
    L = S // (2 * 4)
    want = causal_block_counts(4, balanced, L // (block or L))
    assert per_rank.tolist() == want
    if balanced:
        assert per_rank.max() <= 1.05 * per_rank.min()
    else:
        assert per_rank.max() >= 2 * per_rank.min()


def test_cp_attention_gradients_match(mesh, inputs):
    cfg, args = inputs
    ct = jax.random.normal(jax.random.key(5), (B, S, cfg.num_heads, cfg.attention.v_head_dim))
    f_cp = lambda *x: jnp.vdot(cp_attention(mesh, *x[:4], args[4], x[4], cfg)[0], ct)
    f_ref = lambda *x: jnp.vdot(_reference(cfg, *x[:4], args[4], x[4]), ct)
    argn = (0, 1, 2, 3, 4)
    diff = (args[0], args[1], args[2], args[3], args[5])
    g = jax.jit(jax.grad(f_cp, argn))(*diff)
    g0 = jax.grad(f_ref, argn)(*diff)
    for a, b in zip(g, g0):
        assert rel_fro(a, b) <= 1e-5


@pytest.mark.parametrize("name", ["tiny", "kimi_k2"])
def test_latent_gather_bytes_match_predicted_ratio(mesh, name):
    """Compile only (ShapeDtypeStructs): float all-gather bytes, latent vs up-projected KV."""
    cfg = preset(name)
    a, H = cfg.attention, cfg.num_heads
    sd = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    args = (sd(B, S, H, a.qk_nope_head_dim), sd(B, S, H, a.qk_rope_head_dim), sd(B, S, a.kv_lora_rank),
            sd(B, S, a.qk_rope_head_dim), jax.ShapeDtypeStruct((B, S), jnp.int32),
            sd(a.kv_lora_rank, H, a.qk_nope_head_dim + a.v_head_dim))
    got = {}
    for gather in ("latent", "expanded"):
        st = compiled_collective_stats(jax.jit(lambda *x: cp_attention(mesh, *x, cfg, gather=gather)), *args,
                                       mesh=mesh)
        gathers = [o for o in st["ops"] if o[0] == "all-gather" and o[4].startswith("f")]
        assert gathers and all(o[1] == "context" for o in gathers)
        got[gather] = sum(o[2] * o[3] for o in gathers)
    predicted = H * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) / (a.kv_lora_rank + a.qk_rope_head_dim)
    assert got["expanded"] / got["latent"] == pytest.approx(predicted, rel=1e-9)
    if name == "kimi_k2":
        assert predicted == pytest.approx(35.56, abs=0.01)
