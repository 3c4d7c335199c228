"""``rl.optimizer.name`` picks the RL learner's full-parameter optimizer: AdamW (default) or Muon.

Checked on one update from the same gradient: from a ~rank-1 gradient, the singular values of each
kernel's Muon update are close to equal while AdamW's stay ~rank 1; vectors (norms), embeddings and the
LM head get an Adam update of the same sign under both; the frozen router bias gets no update.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _setup(name: str):
    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage
    from c2jax.train.rl_learner import make_optimizer_for

    cfg = preset("tiny").replace(vocab_size=256, mtp_depth=0)
    params = init(cfg, jax.random.PRNGKey(0))
    rl = resolve_rl_config({"group_size": 2})
    rl.update(resolve_stage({"steps": 4, "learning_rate": 1e-2,
                             "optimizer": {"name": name, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
                                           "weight_decay": 0.0, "clip_norm": None}}))
    tx = make_optimizer_for(params, cfg, rl)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    rng = np.random.default_rng(1)  # numpy, not jax.random: per-shape compiles of the latter took ~17 s
    grads = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(_rank1_plus_noise(rng, x.shape), x.dtype)
                                                   for x in leaves])
    upd, _ = jax.jit(tx.update)(grads, tx.init(params), params)  # one compile: eager op-by-op Newton-Schulz took ~20 s
    return cfg, params, upd


def _rank1_plus_noise(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """u v^T over the last two axes plus 5% noise: AdamW's first update ~ sign(g) keeps it ~rank 1,
    Muon's orthogonalisation spreads it over every direction."""
    if len(shape) < 2:
        return rng.standard_normal(shape, np.float32)
    u = rng.standard_normal(shape[:-1], np.float32)[..., None]
    v = rng.standard_normal(shape[-1:], np.float32)
    return u * v + 0.05 * rng.standard_normal(shape, np.float32)


def _flat(tree):
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _matrices(x: np.ndarray, dims) -> np.ndarray:
    """[..., reduction, output] slices of a leaf, per its Muon dimension numbers (single axes only)."""
    red, out = dims.reduction_axis, dims.output_axis
    red = red if isinstance(red, int) else red[0]
    out = out if isinstance(out, int) else out[-1]
    y = np.moveaxis(np.asarray(x, np.float64), (red, out), (-2, -1))
    return y.reshape(-1, *y.shape[-2:])


def test_muon_orthogonalises_matrices_and_leaves_the_rest_to_adamw():
    from c2jax.model.params_spec import logical_axes
    from c2jax.train.optim import muon_dimension_numbers

    cfg, params, adam = _setup("adamw")
    _, _, muon = _setup("muon")
    a, m = _flat(adam), _flat(muon)
    dims = {jax.tree_util.keystr(p): d for p, d in jax.tree_util.tree_flatten_with_path(
        muon_dimension_numbers(params, logical_axes(cfg)), is_leaf=lambda d: d is None or hasattr(d, "reduction_axis"))[0]}
    matrix_leaves = [k for k, d in dims.items() if d is not None]
    other = [k for k, d in dims.items() if d is None and not ("router" in k and "bias" in k)]
    assert matrix_leaves and other
    for k in matrix_leaves:
        if not (isinstance(dims[k].reduction_axis, int) and isinstance(dims[k].output_axis, int)):
            continue
        for sm, sa in zip(_matrices(m[k], dims[k]), _matrices(a[k], dims[k])):
            s_m = np.linalg.svd(sm, compute_uv=False)
            s_a = np.linalg.svd(sa, compute_uv=False)
            # spread of the singular values relative to their mean: Newton-Schulz flattens the spectrum
            # of a ~rank-1 gradient, AdamW's ~sign(g) update stays ~rank 1
            flat_m, flat_a = s_m.std() / s_m.mean(), s_a.std() / s_a.mean()
            assert flat_m < 0.5 < 1.5 < flat_a, (k, flat_m, flat_a)
    for k in other:  # norms, embeddings, LM head: an Adam update under both (optax's Muon uses Nesterov
        # momentum for them, so the first step is ~1.47x AdamW's, same sign elementwise)
        um, ua = np.asarray(m[k]), np.asarray(a[k])
        big = np.abs(ua) > 1e-4
        assert big.any() and np.all(np.sign(um[big]) == np.sign(ua[big])), k
        ratio = np.abs(um[big]) / np.abs(ua[big])
        assert 1.0 <= ratio.min() and ratio.max() <= 2.0, (k, ratio.min(), ratio.max())
    for k, x in m.items():
        if "router" in k and "bias" in k:
            assert not np.any(np.asarray(x)) and not np.any(np.asarray(a[k])), k  # frozen under both
        assert np.all(np.isfinite(np.asarray(x))), k


def test_frozen_parameters_get_no_update_and_bad_entries_are_named():
    """``rl.frozen``: the covered parameters (a group: the LM head; a glob: every layer's attention) get a
    zero update while every other trainable leaf moves; the positive control (nothing frozen) moves
    them; an entry that covers no parameter is rejected by the config check, listing the parameters."""
    from c2jax.config import Checker
    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage, validate_rl_stage
    from c2jax.train.rl_learner import make_optimizer_for

    cfg = preset("tiny").replace(vocab_size=256, mtp_depth=0)
    params = init(cfg, jax.random.PRNGKey(0))
    grads = jax.tree_util.tree_map(jnp.ones_like, params)

    def update(frozen):
        rl = resolve_rl_config({"group_size": 2})
        rl.update(resolve_stage({"steps": 4, "learning_rate": 1e-2, "frozen": frozen}))
        tx = make_optimizer_for(params, cfg, rl)
        upd, _ = tx.update(grads, tx.init(params), params)
        return upd

    def moved(tree):
        return sum(float(jnp.abs(x).sum()) for x in jax.tree_util.tree_leaves(tree))

    head, attn, free = update(("lm_head",)), update(("*/attn/*",)), update(())
    assert moved(head["lm_head"]) == 0.0 and moved(free["lm_head"]) > 0.0
    assert moved(head["embed"]) > 0.0 and moved(head["moe_layers"]) > 0.0
    for group in ("dense_layers", "moe_layers"):
        assert moved(attn[group]["attn"]) == 0.0 and moved(free[group]["attn"]) > 0.0
        assert moved(attn[group]["attn_norm"]) > 0.0  # 'attn_norm' is not under 'attn/'
    assert moved(attn["moe_layers"]["moe"]) > 0.0 and moved(attn["lm_head"]) > 0.0
    check = Checker("rl")
    validate_rl_stage(check, {"frozen": ["lm_head", "heads", "*/attn/*"]}, {"model": cfg.to_dict()})
    assert [k for k, _ in check.problems] == ["rl.frozen"]
    msg = check.problems[0][1]
    assert "'heads' matches no parameter" in msg and "lm_head/kernel" in msg
