"""Ready-made ``config.data`` sections: `quickstart` (a few MB, CPU minutes) and `full` (everything).

    config.data = data_presets.quickstart()                  # in experiments/configs/NAME.py
    config.data = data_presets.full(held_out=["rich", "stdlib:json"])

The quickstart corpus is capped so corpus + tokenizer + shards take well under a minute on 2 cores;
its tokenizer has 4096 ids, matching the `small` model preset (set ``model.vocab_size`` from
``config.data.tokenizer.vocab_size``).
"""
from __future__ import annotations

from typing import Sequence

import ml_collections

from c2jax.data.licences import PERMISSIVE
from c2jax.data.pins import pinned_packages

# Held out by default: a permissive pure-Python package c2jax depends on (always installed) and
# two standard-library packages. Eval loss is measured on these codebases, never trained on.
DEFAULT_HELD_OUT = ("rich", "stdlib:json", "stdlib:email")

# The quickstart's sources, by exact version (`c2jax.data.pins`): the standard library of this Python
# and packages that `pip install -e .` always installs (setup.py install_requires, plus rich's own
# dependencies). Nothing else installed on a machine can enter the quickstart corpus, and a version
# difference is an error naming it, so the manifest hash (tests/data/test_data_corpus_pin.py) and the
# held-out margin are the same on every machine that builds it. The `quickstart-corpus` extra in
# setup.py installs exactly these versions.
QUICKSTART_PINS = {
    "python": "3.11.7",
    "packages": {"absl-py": "2.5.1", "flax": "0.12.8", "jax": "0.10.2", "jsonschema": "4.26.0",
                 "markdown-it-py": "4.3.0", "matplotlib": "3.11.2", "mdurl": "0.1.2", "ml-collections": "1.1.0",
                 "numpy": "2.4.6", "optax": "0.2.8", "orbax-checkpoint": "0.12.8", "pygments": "2.21.0",
                 "rich": "15.0.0", "tensorboardx": "2.6.5", "tqdm": "4.70.1"},
}
# Huge or generated code bases that would dominate a capped sample.
DEFAULT_EXCLUDE = ("torch", "torchao", "transformers", "jaxlib", "scipy", "sympy", "openai", "c2jax",
                   "nvidia-*", "triton", "tzdata", "fonttools", "networkx", "ray")


def _cfg(d: dict) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(d)


def quickstart(held_out: Sequence[str] = DEFAULT_HELD_OUT, vocab_size: int = 4096, dir: str = "runs/data",
               scale: float = 1.0) -> ml_collections.ConfigDict:
    """A ~4 MB code-heavy mix: stdlib and package code, docs, synthesised SFT (weight 0 in CPT)."""
    mb = int(1_000_000 * scale)
    return _cfg({
        "dir": dir,
        "sources": {
            "stdlib_code": {"weight": 0.4, "max_bytes": int(1.5 * mb), "held_out_max_bytes": int(0.25 * mb)},
            "package_code": {"weight": 0.4, "packages": pinned_packages(QUICKSTART_PINS), "exclude": list(DEFAULT_EXCLUDE),
                             "max_bytes": int(1.5 * mb), "held_out_max_bytes": int(0.25 * mb)},
            "package_docs": {"weight": 0.2, "packages": pinned_packages(QUICKSTART_PINS), "exclude": list(DEFAULT_EXCLUDE),
                             "include_stdlib": True, "max_bytes": int(0.5 * mb), "held_out_max_bytes": int(0.1 * mb)},
            "transcripts": {"weight": 0.0, "paths": [], "licence": ""},
            # Short examples so most fit the quickstart's 512-token SFT rows (whole-packed: a longer
            # conversation is skipped, never truncated).
            "sft_synth": {"weight": 0.0, "kinds": ["implement", "edit_diff"], "max_examples": 600,
                          "max_function_chars": 1200, "max_file_chars": 1400,
                          "from_sources": ["stdlib_code", "package_code"], "max_bytes": int(0.8 * mb),
                          "held_out_max_bytes": int(0.1 * mb)},
        },
        "licences": list(PERMISSIVE),
        "held_out": {"packages": list(held_out), "packages_file": ""},
        "pins": {"python": QUICKSTART_PINS["python"], "packages": dict(QUICKSTART_PINS["packages"])},
        "max_file_bytes": 100_000,
        "vendored": "drop",
        "tokenizer": {"vocab_size": int(vocab_size), "train_bytes": 8 * mb, "min_frequency": 2, "path": ""},
        "shards": {"chunk_tokens": 65536, "compression": "zstd"},
    })


def full(held_out: Sequence[str] = DEFAULT_HELD_OUT, vocab_size: int = 32768, dir: str = "runs/data_full"):
    """Every permissive installed package and the whole stdlib (no caps); tokenizer trained on 200 MB."""
    cfg = quickstart(held_out, vocab_size, dir)
    big = 1 << 40
    for s in cfg.sources.values():
        if "max_bytes" in s:
            s.max_bytes = big
            s.held_out_max_bytes = big
    cfg.pins = {}  # everything installed, by design: not reproducible across machines
    cfg.sources.package_code.packages = ["*"]
    cfg.sources.package_docs.packages = ["*"]
    cfg.sources.package_code.exclude = ["c2jax"]
    cfg.sources.package_docs.exclude = ["c2jax"]
    cfg.sources.sft_synth.max_examples = 50_000
    cfg.sources.sft_synth.max_function_chars = 4000
    cfg.sources.sft_synth.max_file_chars = 12000
    cfg.max_file_bytes = 400_000
    cfg.tokenizer.train_bytes = 200_000_000
    return cfg


def sft_weights() -> dict[str, float]:
    """Mix for the SFT phase: chat-formatted sources only (loss on assistant tokens)."""
    return {"sft_synth": 1.0, "transcripts": 0.0}
