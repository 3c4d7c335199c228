"""Grouped (ragged) matmul for MoE experts: reference, Pallas kernels, per-precision custom_vjp."""
