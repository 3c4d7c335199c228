"""Low-precision MoE kernels (MXFP8, MXFP4, NVFP4, FP8 blockwise) in JAX/Pallas.

Layout (tokamax style): one folder per op, each with a plain-jnp `reference.py` (the oracle) beside
its Pallas kernel(s); `api.py` is the public entry point (`quantize`, `dequantize`,
`grouped_matmul`). See `kernels_pallas/README.md` for formats, rounding rules and what ran where.
"""
