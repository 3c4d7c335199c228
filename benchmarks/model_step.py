"""Forward+backward throughput of the `small` MoE model: c2jax (JAX) vs transformers DeepseekV3
(PyTorch eager, float32), same config, same batch, one process.

    python benchmarks/model_step.py                    # batch 8 x 512, both MoE impls
    python benchmarks/model_step.py --batch 2 --seq 128 --repeats 3

What is timed: one jitted `value_and_grad` of the next-token cross-entropy (JAX) against
`loss.backward()` of `DeepseekV3ForCausalLM(labels=...)` (PyTorch), same weights, same tokens;
the optimizer update is excluded on both sides. JAX and PyTorch steps are interleaved and the
median is reported so a noisy neighbour on the shared CPU hits both alike. The model is the
`small` preset with mtp_depth=0 (transformers' forward has no MTP).

MFU = model FLOPs per step / step time / matmul peak, with
    model FLOPs = 6 x active parameters x tokens + attention FLOPs,
    active parameters = count_active_params(cfg) (every weight a token touches: attention,
        dense MLP, router, shared + top_k routed experts, LM head; the input embedding excluded),
    attention FLOPs = 6 x layers x tokens x seq x heads x (qk_head_dim + v_head_dim)
        (QK^T and PV, forward + backward, the full S x S square as computed),
capacity padding excluded (dropped/padded expert rows do not count), and the matmul peak is the
best of a few 2048^3 float32 `jnp.dot`s measured in this run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from c2jax.model.config import count_active_params, preset  # noqa: E402
from c2jax.model.transformer import apply, init  # noqa: E402


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, b).block_until_ready()
    best = min(_timed(lambda: f(a, b).block_until_ready()) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_flops(cfg, batch: int, seq: int) -> float:
    a = cfg.attention
    tokens = batch * seq
    attn = 6 * cfg.num_layers * tokens * seq * cfg.num_heads * (a.qk_head_dim + a.v_head_dim)
    return 6 * count_active_params(cfg) * tokens + attn


def jax_step(cfg, params, tokens):
    def loss(p):
        logits = apply(p, tokens, cfg)["logits"][:, :-1]
        tgt = tokens[:, 1:]
        lse = jax.nn.logsumexp(logits, -1)
        return jnp.mean(lse - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])
    f = jax.jit(jax.value_and_grad(loss))
    return lambda: jax.block_until_ready(f(params))


def torch_step(cfg, params_np, tokens_np):
    import torch
    import transformers

    from c2jax.model.hf.config import hf_config_from_model_config
    from c2jax.model.hf.keys import hf_state_dict_from_params

    hf = {k: v for k, v in hf_config_from_model_config(cfg).items() if k != "architectures"}
    config = transformers.DeepseekV3Config(**hf)
    config._attn_implementation = "eager"
    model = transformers.DeepseekV3ForCausalLM(config).float().train()
    sd = hf_state_dict_from_params(params_np, cfg, layout="fused", mtp_shared_copies=False)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in sd.items()},
                                                strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    ids = torch.from_numpy(np.asarray(tokens_np, np.int64))

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return float(out.loss)
    return step, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", default="capacity,dropless")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    base = preset("small").replace(mtp_depth=0)
    b, s = args.batch, args.seq
    params = init(base, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (b, s), 0, base.vocab_size, jnp.int32)
    n_tok = b * s
    flops = model_flops(base, b, s)
    peak = matmul_peak_gflops()
    print(f"small preset (mtp off): {count_active_params(base):,} active params; batch {b}x{s}; "
          f"model FLOPs/step {flops / 1e9:.1f} G; matmul peak {peak:.1f} GFLOP/s; "
          f"jax {jax.__version__} devices {jax.devices()}")

    steps = {}
    for impl in args.impls.split(","):
        cfg = base.replace(**{"moe.impl": impl})
        fn = jax_step(cfg, params, tokens)
        t = _timed(fn)
        print(f"jax[{impl}] compile+first step {t:.1f} s")
        steps[f"jax[{impl}]"] = fn
    if not args.no_torch:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        pstep, _ = torch_step(base, jax.tree_util.tree_map(np.asarray, params), np.asarray(tokens))
        pstep()  # warm-up
        steps["torch"] = pstep

    times = {k: [] for k in steps}
    for _ in range(args.repeats):  # interleaved
        for k, fn in steps.items():
            times[k].append(_timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'impl':16s} {'step s':>8s} {'tok/s':>9s} {'MFU':>6s} {'vs torch':>9s}")
    for k, t in med.items():
        ratio = med["torch"] / t if "torch" in med else float("nan")
        print(f"{k:16s} {t:8.3f} {n_tok / t:9.0f} {flops / t / 1e9 / peak:6.1%} {ratio:8.2f}x")


if __name__ == "__main__":
    main()
