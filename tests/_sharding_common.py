"""Shared helpers of the sharding tests: a tiny f32 dropless model and packed batches."""
from __future__ import annotations

import jax
import numpy as np

from c2jax.model.config import preset
from c2jax.model.transformer import init, segment_positions

LOSS = {"xent": 1.0, "z_loss": 1e-4, "mtp_distill": 0.3}


def tiny_cfg():
    """Tiny preset, float32, dropless MoE (exact), larger init so routing is not near-uniform."""
    return preset("tiny").replace(**{"moe.impl": "dropless", "initializer_range": 0.05})


def tiny_params(cfg, seed: int = 0):
    params = init(cfg, jax.random.key(seed))
    b = params["moe_layers"]["moe"]["router"]["bias"]
    params["moe_layers"]["moe"]["router"]["bias"] = jax.random.uniform(jax.random.key(7), b.shape, b.dtype, -0.05, 0.05)
    return params


def packed_batch(cfg, B: int, S: int, seed: int = 0, pad: bool = True) -> dict:
    """Rows packed with 1-4 documents of random lengths (ids 1, 2, ...), trailing padding (id 0)."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((B, S), np.int32)
    for r in range(B):
        pos, sid = 0, 1
        end = S - (rng.integers(0, S // 4) if pad else 0)
        while pos < end:
            n = int(min(end - pos, rng.integers(3, S // 2)))
            seg[r, pos:pos + n] = sid
            pos, sid = pos + n, sid + 1
    tokens = rng.integers(1, cfg.vocab_size, (B, S)).astype(np.int32)
    tokens[seg == 0] = 0
    targets = np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1)
    same = np.concatenate([seg[:, 1:] == seg[:, :-1], np.zeros((B, 1), bool)], 1)
    loss_mask = ((seg > 0) & same).astype(np.float32)
    positions = np.asarray(segment_positions(seg))
    return {"tokens": tokens, "targets": targets, "segment_ids": seg, "positions": positions,
            "loss_mask": loss_mask}


def rel_fro(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    if nb == 0:
        return float(np.linalg.norm(a))
    return float(np.linalg.norm(a - b) / nb)
