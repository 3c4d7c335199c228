"""Research workflow helpers: config loading as ``experiments/run.py`` does it, ablation sweeps
(grid / random search over ``--config.*`` keys, one ``run.py`` subprocess per cell, resumable),
results tables with seed confidence intervals, and the claims ledger's verdicts.

Floor: just below ``experiments/`` (it launches ``experiments/run.py`` as a subprocess and reads
``summary.json``; it imports only ``c2jax.config`` from the library).
"""
