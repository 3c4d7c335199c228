"""Greedy speculative decoding with the model's own MTP head (DeepSeek-V3 MTP, depth 1).

The MTP module at position i reads the main model's final hidden state h_i and the embedding of
the next token x_{i+1}, runs one MoE decoder block (attending over earlier MTP positions) and
predicts x_{i+2} (see c2jax/model/mtp.py). Incrementally it needs its own latent cache (one
layer, same layout as the main cache, written here with the model's `mla`/`moe_block`).

One step for every slot (fixed shape [S, 2]): feed the last token x_L and the draft d (the MTP
guess for x_{L+1}) at positions L, L+1. The main logits at L give y1 = argmax (= x_{L+1});
if ``y1 == d`` the computation at L+1 was on the right token and also yields y2 = x_{L+2}: two
tokens for one step. Otherwise only y1 is kept and the slot at L+1 is overwritten next step
(``lengths`` advances by 1 + accepted). Then the MTP block runs at positions L (h_L, y1) and, if
accepted, L+1 (h_{L+1}, y2); its logits at the last valid position are the next draft.

Greedy output is unchanged: every emitted token is the main model's argmax given the exact
preceding tokens. Only greedy rows speculate (``temperature == 0``; sampled rows take one token
per step from the same call). The acceptance rate is `Engine.stats['spec_accepted'] /
stats['spec_proposed']`.

With prefix reuse, the MTP entry at the last reused position depends on the following token, so
the engine re-prefills one more token (reuse r-1) and the MTP cache row is copied with the main
row.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import ModelConfig
from c2jax.model.mla import mla
from c2jax.model.moe import moe_block
from c2jax.model.norms import rms_norm
from c2jax.model.rope import rope_cos_sin
from c2jax.sampling.device import put_row, take_row, unwindow, window
from c2jax.sampling.forward import serving_apply as apply
from c2jax.sampling.sample import sample_tokens


def init_mtp_cache(cfg: ModelConfig, slots: int, max_len: int, dtype=None) -> dict:
    """Latent cache of the depth-1 MTP block: lengths [S]; layer c_kv [S,T,r], k_rope [S,T,rope]."""
    a, dt = cfg.attention, jnp.dtype(dtype or cfg.dtype)
    return {"lengths": jnp.zeros((slots,), jnp.int32),
            "layer": {"c_kv": jnp.zeros((slots, max_len, a.kv_lora_rank), dt),
                      "k_rope": jnp.zeros((slots, max_len, a.qk_rope_head_dim), dt)}}


def mtp_forward_cached(params: dict, cfg: ModelConfig, hidden: jax.Array, next_tok: jax.Array,
                       mcache: dict, seg: jax.Array):
    """MTP depth 1 over new positions lengths..lengths+S-1 of each row.

    hidden [B, S, D] main final-normed states at those positions, next_tok [B, S] the tokens that
    follow them, seg [B, S] valid mask (valid first). Returns (mcache, logits [B, S, V] f32)."""
    p = params["mtp"][0]  # serving params: per-depth list (forward.serving_params)
    dt = hidden.dtype
    eps = cfg.rms_norm_eps
    e = params["embed"]["embedding"][next_tok].astype(dt)
    z = jnp.concatenate([rms_norm(e, p["enorm"]["scale"], eps), rms_norm(hidden, p["hnorm"]["scale"], eps)], -1)
    h = z @ p["eh_proj"]["kernel"].astype(dt)
    s = hidden.shape[1]
    lengths = mcache["lengths"]
    slots = lengths[:, None] + jnp.arange(s, dtype=jnp.int32)[None]  # [B, S]
    t = mcache["layer"]["c_kv"].shape[1]
    mask = jnp.arange(t, dtype=jnp.int32)[None, None, :] <= slots[:, :, None]
    cos, sin = rope_cos_sin(cfg.attention, slots)
    lp = p["layer"]
    lc = mcache["layer"]
    a, nc = mla(lp["attn"], rms_norm(h, lp["attn_norm"]["scale"], eps), cos, sin, mask, cfg, lc, slots)
    h = h + a
    y, _ = moe_block(lp["moe"], rms_norm(h, lp["mlp_norm"]["scale"], eps), cfg, seg != 0)
    h = h + y
    g = rms_norm(h, p["final_norm"]["scale"], eps)
    logits = jnp.einsum("bsd,dv->bsv", g, params["lm_head"]["kernel"].astype(dt), preferred_element_type=jnp.float32)
    new = {"lengths": lengths + (seg != 0).sum(-1).astype(jnp.int32), "layer": nc}
    return new, logits


def _prefill(cfg, win, params, cache, mcache, slot, tokens, start, n_valid, follow, samp, draw):
    """Main prefill of one row (as device._prefill) plus the MTP positions of the chunk.

    follow: the token after the chunk (-1: the token sampled here, i.e. the last chunk).
    Returns (cache, mcache, next, lp_s, lp_r, routes [C, n_moe, k], draft)."""
    row = take_row(cache, slot)
    row["lengths"] = jnp.reshape(start, (1,)).astype(jnp.int32)
    c = tokens.shape[0]
    seg = (jnp.arange(c) < n_valid).astype(jnp.int32)[None]
    out = apply(params, tokens[None], cfg, segment_ids=seg, cache=row, window=win)
    logits = jax.lax.dynamic_index_in_dim(out["logits"][0], n_valid - 1, 0, keepdims=True)
    s1 = {k: jnp.reshape(v, (1,)) for k, v in samp.items()}
    nxt, lp_s, lp_r = sample_tokens(logits, s1["temperature"], s1["top_k"], s1["top_p"], s1["seed"],
                                    jnp.reshape(draw, (1,)))
    cache = put_row(cache, out["cache"], slot)
    fol = jnp.where(follow < 0, nxt[0], follow)
    nt = jnp.concatenate([tokens[1:], jnp.zeros((1,), tokens.dtype)])
    nt = jnp.where(jnp.arange(c) == n_valid - 1, fol, nt)
    mrow = take_row(mcache, slot, win)
    mrow["lengths"] = jnp.reshape(start, (1,)).astype(jnp.int32)
    mrow, mlog = mtp_forward_cached(params, cfg, out["hidden"], nt[None], mrow, seg)
    mcache = put_row(mcache, mrow, slot)
    draft = jnp.argmax(jax.lax.dynamic_index_in_dim(mlog[0], n_valid - 1, 0, keepdims=False)).astype(jnp.int32)
    return cache, mcache, nxt[0], lp_s[0], lp_r[0], out["routes"][0], draft


def _step(cfg, win, params, cache, mcache, tok, draft, active, spec_ok, samp, draw):
    """One speculative step for all slots (see module docstring). tok/draft [S] int32,
    active/spec_ok [S] bool. Returns (cache, mcache, y1, y2, accept, lp_s1, lp_r1, lp_r2,
    routes [S, 2, n_moe, k], next_draft)."""
    lengths = cache["lengths"]
    toks = jnp.stack([tok, draft], 1)  # [S, 2]
    seg = jnp.stack([active, spec_ok & active], 1).astype(jnp.int32)
    mfull = mcache
    mcache = window(mcache, win)
    out = apply(params, toks, cfg, segment_ids=seg, cache=cache, window=win)
    y1, lp_s1, lp_r1 = sample_tokens(out["logits"][:, 0], samp["temperature"], samp["top_k"], samp["top_p"],
                                     samp["seed"], draw)
    accept = spec_ok & active & (y1 == draft)
    lg2 = out["logits"][:, 1]
    y2 = jnp.argmax(lg2, -1).astype(jnp.int32)
    lp_r2 = jnp.take_along_axis(jax.nn.log_softmax(lg2, -1), y2[:, None], -1)[:, 0]
    cache = dict(out["cache"], lengths=lengths + active.astype(jnp.int32) + accept.astype(jnp.int32))
    mseg = jnp.stack([active, accept], 1).astype(jnp.int32)
    mcache = dict(mcache, lengths=lengths)
    mcache, mlog = mtp_forward_cached(params, cfg, out["hidden"], jnp.stack([y1, y2], 1), mcache, mseg)
    nd = jnp.argmax(jnp.where(accept[:, None], mlog[:, 1], mlog[:, 0]), -1).astype(jnp.int32)
    mcache = unwindow(mfull, mcache)
    return cache, mcache, y1, y2, accept, lp_s1, lp_r1, lp_r2, out["routes"], nd


def _copy_row(mcache, src, dst, length):
    row = take_row(mcache, src)
    row["lengths"] = jnp.reshape(length, (1,)).astype(jnp.int32)
    return put_row(mcache, row, dst)


@functools.lru_cache(maxsize=16)
def _compiled(cfg: ModelConfig) -> Any:
    ns = type("SpecSteps", (), {})()
    ns.prefill = jax.jit(functools.partial(_prefill, cfg), static_argnums=(0,), donate_argnums=(2, 3))
    ns.step = jax.jit(functools.partial(_step, cfg), static_argnums=(0,), donate_argnums=(2, 3))
    ns.copy_row = jax.jit(_copy_row, donate_argnums=(0,))
    return ns


class SpecDecoder:
    """Engine-side state of MTP speculative decoding (the MTP cache and each slot's draft)."""

    def __init__(self, engine):
        self.eng = engine
        c = engine.config
        self.steps = _compiled(engine.run_cfg)
        self.mcache = init_mtp_cache(engine.model_cfg, c.max_slots, c.max_len, c.cache_dtype)
        self.draft = np.zeros((c.max_slots,), np.int32)
        self.draft_override = None  # tests: fn(seq, position) -> token or None, replaces the MTP draft

    def prefill(self, slot, chunk, pos, n, follow, samp, draw):
        e = self.eng
        e.cache, self.mcache, tok, lps, lpr, routes, draft = self.steps.prefill(
            e._window(pos + n), e.params, e.cache, self.mcache, jnp.int32(slot), jnp.asarray(chunk), jnp.int32(pos), jnp.int32(n),
            jnp.int32(follow), samp, jnp.int32(draw))
        self.draft[slot] = int(draft)
        return tok, lps, lpr, routes

    def copy_row(self, src, dst, length):
        self.mcache = self.steps.copy_row(self.mcache, jnp.int32(src), jnp.int32(dst), jnp.int32(length))

    def step(self, events: list) -> None:
        e = self.eng
        S, T = e.config.max_slots, e.config.max_len
        tok = np.zeros((S,), np.int32)
        active = np.zeros((S,), bool)
        spec_ok = np.zeros((S,), bool)
        draw = np.zeros((S,), np.int32)
        for s, seq in enumerate(e.row_seq):
            if seq is None:
                continue
            tok[s], active[s], draw[s] = seq.next_tok, True, len(seq.gen)
            L = int(e.row_len[s])
            spec_ok[s] = (not seq.draining and seq.params.temperature == 0.0 and L + 2 < T
                          and len(seq.gen) + 2 <= seq.params.max_new_tokens)
            if spec_ok[s] and self.draft_override is not None:
                d = self.draft_override(seq, L + 1)
                if d is not None:
                    self.draft[s] = d
        samp = e._samp_device()
        win = e._window(int(e.row_len[active].max()) + 2)
        (e.cache, self.mcache, y1, y2, acc, lps1, lpr1, lpr2, routes, nd) = self.steps.step(
            win, e.params, e.cache, self.mcache, jnp.asarray(tok), jnp.asarray(self.draft), jnp.asarray(active),
            jnp.asarray(spec_ok), samp, jnp.asarray(draw))
        y1, y2, acc, lps1, lpr1, lpr2, routes, nd = jax.device_get((y1, y2, acc, lps1, lpr1, lpr2, routes, nd))
        self.draft[:] = nd
        e.stats["decode_steps"] += 1
        e.stats["spec_proposed"] += int(spec_ok.sum())
        e.stats["spec_accepted"] += int(acc.sum())
        for s in np.flatnonzero(active):
            seq = e.row_seq[s]
            e._fed(s, tok[s], routes[s, 0])
            if seq.draining:
                e._finish(seq, events)
                continue
            e._append(seq, int(y1[s]), float(lps1[s]), float(lpr1[s]), events)
            if not acc[s]:
                continue
            e._fed(s, y1[s], routes[s, 1])  # the draft was y1: already processed at L+1
            if seq.draining:  # y1 ended the sequence and is already fed: done now
                e._finish(seq, events)
                continue
            e._append(seq, int(y2[s]), 0.0, float(lpr2[s]), events)
