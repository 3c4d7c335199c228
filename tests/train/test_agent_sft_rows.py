"""Agent SFT on fitted rows (``agent_sft.fit_rows``): the same loss as on full-length rows.

Rows as long as the demonstrations need (c2jax.batching.fit_row_length) change the padding and the
packing, never a token's loss: each segment attends only within itself and restarts its positions.
Checked on a tiny model: the summed policy-token cross entropy of the same demonstrations is equal
on rows of 1024 and on fitted rows, while a layout that breaks segment isolation (all segment ids
1 on the packed rows) changes it (the positive control)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.batching import fit_row_length, pad_batch
from c2jax.trajectory import Segment, Trajectory


def _demos(n: int = 9, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, c = int(rng.integers(20, 40)), int(rng.integers(30, 60))
        out.append(Trajectory([Segment(prompt_ids=rng.integers(1, 500, p).tolist(),
                                       completion_ids=rng.integers(1, 500, c).tolist(), loss_mask=[1] * c,
                                       behaviour_logprobs=[0.0] * c, policy_versions=[0] * c)],
                              task_id=f"t{i}", group_id=f"t{i}"))
    return out


def _policy_xent_sum(params, cfg, b: dict, segment_ids=None) -> float:
    from c2jax.model import apply

    out = apply(params, jnp.asarray(b["tokens"]), cfg, segment_ids=jnp.asarray(
        b["segment_ids"] if segment_ids is None else segment_ids), positions=jnp.asarray(b["positions"]))
    logp = jax.nn.log_softmax(out["logits"].astype(jnp.float32), axis=-1)
    tok = jnp.take_along_axis(logp, jnp.asarray(b["targets"])[..., None], axis=-1)[..., 0]
    return float(-(tok * jnp.asarray(b["loss_mask"])).sum())


def test_fitted_rows_give_the_same_loss_as_full_rows():
    from c2jax.model import init
    from c2jax.model.config import preset

    cfg = preset("tiny").replace(vocab_size=512, max_position_embeddings=256, mtp_depth=0,
                                 **{"moe.impl": "dropless"})
    params = init(cfg, jax.random.PRNGKey(0))
    demos = _demos()
    row = fit_row_length(demos, 256, multiple=32)
    full, fitted = pad_batch(demos, 256), pad_batch(demos, row)
    assert row < 256 and fitted["tokens"].size < full["tokens"].size
    assert fitted["loss_mask"].sum() == full["loss_mask"].sum()
    want = _policy_xent_sum(params, cfg, full)
    got = _policy_xent_sum(params, cfg, fitted)
    tol = 1e-5 * abs(want)
    assert abs(got - want) <= tol, (got, want)
    # Positive control: the packed rows with segment isolation removed give another loss.
    packed = fitted["segment_ids"].max(axis=1) > 1
    assert packed.any(), "the fitted rows should pack several demonstrations"
    leaky = _policy_xent_sum(params, cfg, fitted, segment_ids=(fitted["segment_ids"] > 0).astype(np.int32))
    assert abs(leaky - want) > 5 * tol, (leaky, want)
