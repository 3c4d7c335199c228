"""Block-scaled quantisers: `reference.py` (plain jnp oracle) and `pallas_quant.py` (kernels)."""
