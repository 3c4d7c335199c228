"""Held-out codebases: the evaluation split's packages, exported so pretraining excludes them.

The corpus builder (c2jax/data/corpus.py) reads `data.held_out.packages_file` (.txt one name per
line, .json list, or a task .jsonl with `source.package`). Point it at the file `write()` makes:

    python -m c2jax.bench heldout --out heldout.json
    # data config: data.held_out.packages_file = "heldout.json"

Names use the corpus's convention: PEP 503-normalised distribution names, and `stdlib:<module>`
for standard-library modules.
"""
from __future__ import annotations

import json
import os

# Codebases of the c2bench evaluation split (the training split uses the other codebases).
EVAL_PACKAGES: tuple[str, ...] = ("markdown", "sqlparse", "webcolors")
EVAL_STDLIB_MODULES: tuple[str, ...] = ()


def held_out_packages() -> list[str]:
    """Package names (corpus convention) whose code must stay out of the pretraining corpus."""
    return sorted(set(EVAL_PACKAGES) | {f"stdlib:{m}" for m in EVAL_STDLIB_MODULES})


def write(path: str) -> str:
    """Write the list as JSON ({"packages": [...]}) for `data.held_out.packages_file`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"packages": held_out_packages(), "source": "c2jax.envs.synth.heldout"}, f, indent=1)
    return path
