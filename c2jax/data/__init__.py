"""Data for continued pretraining and SFT: corpus sources, tokenizer, chat format, shards, loader.

    python -m c2jax.data build --config experiments/configs/quickstart.py   # corpus + tokenizer + shards

Modules: `tokenizer` (byte-level BPE with reserved chat/tool special tokens), `chat_format` (THE
token-level chat template), `sources` (corpus sources registry), `corpus` (licence filter, dedup,
held-out split, manifest), `shards` (tensorstore zarr3 arrays), `build` (idempotent, resumable
pipeline), `loader` (deterministic, resumable, packed batches), `config_checks` (config validator
and pre-training checks).
"""
