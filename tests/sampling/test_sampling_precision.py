"""Sampler numerics from the model config, and why router replay matters.

The sampler runs the tiny model in bf16 (``dtype='bfloat16'``, ``moe.precision='bf16'``); the
trainer recomputes the sampled tokens' logprobs in f32. Low-precision noise flips some expert
choices, and a flipped expert changes a token's logprob far more than rounding does. Replaying
the sampler's routes in the f32 forward must lower both the mean and the p99 of
|trainer logprob - sampler logprob| (numbers printed with ``pytest -s``)."""
import numpy as np
import pytest

from c2jax.sampling import Engine, Request, SamplingParams
from _sampling_common import CFG, ENGINE_CFG, forward, log_softmax, random_prompts, tiny_params


def test_bf16_sampler_routes_replay_lowers_logprob_mismatch():
    scfg = CFG.replace(dtype="bfloat16", **{"moe.precision": "bf16"})
    _check_replay_helps(scfg, "bf16", n_req=8, new=50)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp8_blockwise", "mxfp8", "nvfp4_fwd_mxfp8_bwd"])
def test_low_precision_moe_sampler_routes_replay_lowers_mismatch(precision):
    """Expert matmuls through kernels_pallas (the trainer's low-precision recipes)."""
    _check_replay_helps(CFG.replace(**{"moe.precision": precision}), precision, n_req=4, new=30)


def _check_replay_helps(scfg, name, n_req, new):
    params = tiny_params(0, 4.0)
    eng = Engine(params, scfg, ENGINE_CFG)
    assert eng.run_cfg.moe.precision == scfg.moe.precision and eng.run_cfg.dtype == scfg.dtype
    rng = np.random.default_rng(0)
    res = eng.generate([Request(p, SamplingParams(temperature=1.0, max_new_tokens=new, seed=i))
                        for i, p in enumerate(random_prompts(rng, [20] * n_req))])
    free, rep, flips = [], [], []
    for r in res:
        P, g = r.prompt_len, r.output_tokens
        i = np.arange(len(g))
        f = forward(params, r.tokens)
        rp = forward(params, r.tokens, routes=r.routes)
        free.append(np.abs(log_softmax(f["logits"][P - 1:-1])[i, g] - r.raw_logprobs))
        rep.append(np.abs(log_softmax(rp["logits"][P - 1:-1])[i, g] - r.raw_logprobs))
        flips.append((np.sort(f["routes"], -1) != np.sort(r.routes, -1)).any(-1).mean())
    free, rep = np.concatenate(free), np.concatenate(rep)
    stats = dict(route_flip_fraction=float(np.mean(flips)),
                 no_replay_mean=float(free.mean()), no_replay_p99=float(np.percentile(free, 99)),
                 replay_mean=float(rep.mean()), replay_p99=float(np.percentile(rep, 99)))
    print(f"\n{name} sampler vs f32 trainer logprob mismatch:", {k: f"{v:.3e}" for k, v in stats.items()})
    assert stats["route_flip_fraction"] > 0, f"{name} noise should flip some routes on this model"
    assert stats["replay_mean"] < stats["no_replay_mean"]
    assert stats["replay_p99"] < stats["no_replay_p99"]
