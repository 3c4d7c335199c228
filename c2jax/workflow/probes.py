"""Small, fast measurements behind the notebooks and the cheap claims of the ledger.

Each returns plain numbers (and the raw per-trial values) so a notebook can plot them and a claim
can compute its verdict; nothing here decides an outcome. They call the library code the training
system uses: `kernels_pallas.api.quantize` (NVFP4 per tensor / per token), `kernels_pallas.bits`
(exact vs approximate division), `c2jax.rl.kl.kl_estimate`, `c2jax.model.apply` with replayed
routes and `c2jax.train.rl_learner.mismatch_stats`.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


# ---------------------------------------------------------------- proportions
def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion k/n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_diff(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float, float]:
    """p1 - p2 and Newcombe's hybrid-score 95% interval (method 10) from the two Wilson intervals."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1)
    l2, u2 = wilson(k2, n2)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


# ---------------------------------------------------------------- low precision
def batch_invariance(fmt: str, trials: int = 64, k: int = 64, batch: int = 8, seed: int = 0) -> dict:
    """Does a token's quantised row change when its batch mates change? (NVFP4 per tensor vs per token.)

    Each trial quantises ``[row; mates]`` and ``[row; mates * c]`` (c log-uniform in [1/16, 16],
    mates redrawn) along the last axis and compares the first row's dequantised values bit for bit.
    Returns ``{"changed": n_trials_where_row_changed, "trials": trials, "rate", "ci95"}``.
    """
    import jax.numpy as jnp

    from kernels_pallas import api

    rng = np.random.default_rng(seed)
    changed = 0
    for _ in range(trials):
        row = rng.standard_normal((1, k)).astype(np.float32)
        mates = rng.standard_normal((batch - 1, k)).astype(np.float32)
        c = np.float32(np.exp(rng.uniform(np.log(1 / 16), np.log(16))))
        a = np.asarray(api.dequantize(api.quantize(jnp.asarray(np.concatenate([row, mates])), fmt)))[0]
        b = np.asarray(api.dequantize(api.quantize(jnp.asarray(np.concatenate([row, mates * c])), fmt)))[0]
        changed += int(not np.array_equal(a.view(np.uint32), b.view(np.uint32)))
    return {"format": fmt, "changed": changed, "trials": trials, "rate": changed / trials,
            "ci95": wilson(changed, trials)}


def quantization_error(fmts: Sequence[str] = ("mxfp8_e4m3", "mxfp4", "nvfp4", "nvfp4_per_token"),
                       n: int = 4096, k: int = 128, seed: int = 0) -> dict[str, float]:
    """Relative RMS round-trip error |deq(q(x)) - x| / |x| of each format on Gaussian data."""
    import jax.numpy as jnp

    from kernels_pallas import api

    x = np.random.default_rng(seed).standard_normal((n // k, k)).astype(np.float32)
    out = {}
    for f in fmts:
        y = np.asarray(api.dequantize(api.quantize(jnp.asarray(x), f)))
        out[f] = float(np.linalg.norm(y - x) / np.linalg.norm(x))
    return out


def division_agreement(n: int = 100_000, divisor: float = 448.0, seed: int = 0) -> dict[str, float]:
    """Share of ``amax / divisor`` (under jit) equal to numpy's correctly rounded result: the
    library's exact `div_rn` path vs the backend's ``/`` (the fp8 scale site)."""
    import jax
    import jax.numpy as jnp

    from kernels_pallas import bits

    rng = np.random.default_rng(seed)
    amax = (np.abs(rng.standard_normal(n)) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    want = amax / np.float32(divisor)
    out = {}
    for mode in ("exact", "approx"):
        got = np.asarray(jax.jit(lambda a, m=mode: bits.divide(a, jnp.float32(divisor), m))(amax))
        out[mode] = float(np.mean(got == want))
    return out


# ---------------------------------------------------------------- KL estimators
def kl_estimator_spread(mus: Sequence[float], n: int = 200_000, seed: int = 0) -> list[dict]:
    """Per mu: empirical mean and variance of k1, k2, k3 for q = N(0,1), p = N(mu,1) (true KL mu^2/2),
    evaluated with `c2jax.rl.kl.kl_estimate` (the RL loss's code)."""
    import jax.numpy as jnp

    from c2jax.rl.kl import kl_estimate

    rows = []
    for i, mu in enumerate(mus):
        x = np.random.default_rng(seed * 1000 + i).standard_normal(n)
        logq = jnp.asarray(-0.5 * x ** 2, jnp.float32)
        logp = jnp.asarray(-0.5 * (x - mu) ** 2, jnp.float32)
        row = {"mu": float(mu), "kl": mu ** 2 / 2}
        for kind in ("k1", "k2", "k3"):
            v = np.asarray(kl_estimate(logq, logp, kind), np.float64)
            row[f"{kind}_mean"], row[f"{kind}_var"] = float(v.mean()), float(v.var(ddof=1))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- router replay
def replay_mismatch(seed: int = 0, batch: int = 4, seq: int = 64, margin: float | None = 0.0,
                    sampler_precision: str = "nvfp4_fwd_mxfp8_bwd", preset: str = "tiny") -> dict:
    """Learner-vs-sampler logprob mismatch with and without router replay, on one random model + batch.

    Sampler: bf16 compute with low-precision expert matmuls (``sampler_precision``), as an inference
    engine runs; it records its routes. Learner: f32, dropless, (a) routing itself, (b) replaying
    the sampler's routes, (c) replaying them through the plausibility filter (``moe.replay_margin =
    margin``). Returns `mismatch_stats` (mean, p99 of |delta logp|) for each and the route flip rate.
    """
    import jax
    import jax.numpy as jnp

    from c2jax.model import apply, init
    from c2jax.model.config import preset as model_preset
    from c2jax.train.rl_learner import mismatch_stats, route_flip_rate

    cfg = model_preset(preset).replace(mtp_depth=0, **{"moe.impl": "dropless"})
    k_init, k_tok = jax.random.split(jax.random.PRNGKey(seed))
    params = init(cfg, k_init)
    tokens = jax.random.randint(k_tok, (batch, seq), 0, cfg.vocab_size)  # [B, S]

    def logp(out):  # [B, S-1] logprob of the next token
        lp = jax.nn.log_softmax(out["logits"].astype(jnp.float32), -1)
        return np.asarray(jnp.take_along_axis(lp[:, :-1], tokens[:, 1:, None], -1)[..., 0])

    sampler_cfg = cfg.replace(dtype="bfloat16", **{"moe.precision": sampler_precision})
    s = apply(params, tokens, sampler_cfg)
    own = apply(params, tokens, cfg)
    replay = apply(params, tokens, cfg, routes=s["routes"])
    mask = np.ones((batch, seq - 1))
    out = {"no_replay": mismatch_stats(logp(own), logp(s), mask),
           "replay": mismatch_stats(logp(replay), logp(s), mask),
           "route_flip_rate": route_flip_rate(np.asarray(own["routes"])[:, :-1], np.asarray(s["routes"])[:, :-1],
                                              mask)}
    if margin is not None:
        filt = apply(params, tokens, cfg.replace(**{"moe.replay_margin": float(margin)}), routes=s["routes"])
        out["replay_filtered"] = mismatch_stats(logp(filt), logp(s), mask)
        out["replaced_fraction"] = float(np.mean(np.asarray(filt["replaced_fraction"])))
    return out
