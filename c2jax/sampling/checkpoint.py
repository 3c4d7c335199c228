"""What `python -m c2jax.serve --checkpoint PATH` loads: parameters, model config and tokenizer.

A serving checkpoint is a directory holding
* the weights: either Hugging Face format (``config.json`` + safetensors, `c2jax.model.hf.io`,
  what `save_serving_checkpoint` writes) or a c2jax training checkpoint (Orbax ``checkpoints/``
  of a stage directory, or the Orbax directory itself) plus ``model.json`` (`ModelConfig.to_dict`)
  or a preset name given with ``--model-preset``;
* ``tokenizer.json`` (`c2jax.data.tokenizer`), unless ``--tokenizer`` names one.
"""
from __future__ import annotations

import json
import os
from typing import Any

from c2jax.data.tokenizer import Tokenizer


class ServeCheckpointError(ValueError):
    """The checkpoint directory is missing a piece; the message says which and how to provide it."""


def save_serving_checkpoint(path: str, params: Any, cfg: Any, tokenizer: Tokenizer) -> str:
    """Write params (HF safetensors + config.json), ``model.json`` and ``tokenizer.json`` to `path`."""
    from c2jax.model.hf.io import save_pretrained

    os.makedirs(path, exist_ok=True)
    save_pretrained(params, cfg, path)
    with open(os.path.join(path, "model.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1, sort_keys=True, default=str)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    return path


def _model_config(path: str, preset: str | None):
    from c2jax.model.config import ModelConfig, preset as get_preset

    if preset:
        return get_preset(preset)
    mj = os.path.join(path, "model.json")
    if os.path.exists(mj):
        with open(mj) as f:
            return ModelConfig.from_config(json.load(f))
    raise ServeCheckpointError(f"{path}: no model.json next to the Orbax checkpoint; pass --model-preset NAME")


def load_serving_checkpoint(path: str, tokenizer: str | None = None, model_preset: str | None = None):
    """-> (params, ModelConfig, Tokenizer). Raises `ServeCheckpointError` with what is missing."""
    if not os.path.isdir(path):
        raise ServeCheckpointError(f"checkpoint directory {path!r} does not exist")
    tok_path = tokenizer or os.path.join(path, "tokenizer.json")
    if not os.path.exists(tok_path):
        raise ServeCheckpointError(f"no tokenizer at {tok_path}; pass --tokenizer PATH")
    tok = Tokenizer.load(tok_path)
    if os.path.exists(os.path.join(path, "config.json")):
        from c2jax.model.hf.io import from_pretrained

        params, cfg = from_pretrained(path)
        mj = os.path.join(path, "model.json")
        if os.path.exists(mj):  # exact c2jax settings (dtype, moe impl) when saved by c2jax
            from c2jax.model.config import ModelConfig

            with open(mj) as f:
                cfg = ModelConfig.from_config(json.load(f))
    else:
        from c2jax.checkpoint import Checkpointer

        ck = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        got = Checkpointer(ck).restore_params()
        if got is None:
            raise ServeCheckpointError(f"{path}: neither config.json + safetensors nor a usable Orbax checkpoint")
        params = got[1]
        cfg = _model_config(path, model_preset)
    if tok.vocab_size > cfg.vocab_size:
        raise ServeCheckpointError(f"tokenizer has {tok.vocab_size} tokens > model vocab_size {cfg.vocab_size}")
    return params, cfg, tok
