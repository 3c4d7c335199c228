"""Smoke run of the tiny MoE model: a forward pass and a few train steps on random tokens.

    python experiments/run.py --config experiments/configs/tiny.py
    python experiments/run.py --config experiments/configs/tiny.py:small --config.model.moe.impl=dropless
"""
import ml_collections

from c2jax.model.config import model_config_dict


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.stages = ["smoke"]
    config.model = model_config_dict(arg or "tiny")
    config.smoke = ml_collections.ConfigDict(dict(batch_size=2, seq_len=64, steps=3, learning_rate=1e-3))
    return config
