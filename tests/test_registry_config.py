"""Registry and config validation: unknown names and bad values fail with the key and range."""
import pytest

from c2jax.config import ConfigError, validate
from c2jax.model.config import ModelConfig, model_config_dict, preset
from c2jax.registry import Registry, UnknownNameError


def test_registry_register_get_and_unknown_name_lists_known():
    reg = Registry("test_kind_a")

    @reg.register("alpha")
    def alpha():
        return 1

    reg.register("beta", lambda: 2)
    assert reg.get("alpha")() == 1 and reg.get("beta")() == 2
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg
    with pytest.raises(UnknownNameError, match="known: alpha, beta"):
        reg.get("gamma")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("alpha", lambda: 3)


def _cfg(**over):
    import ml_collections

    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = ["smoke"]
    c.model = model_config_dict("tiny", **over)
    return c


def test_valid_presets_pass():
    for name in ["tiny", "small", "kimi_k2", "deepseek_v3"]:
        validate(_cfg() if name == "tiny" else _with_model(name))


def _with_model(name):
    c = _cfg()
    c.model = model_config_dict(name)
    return c


@pytest.mark.parametrize(
    "over, key, text",
    [
        ({"moe.top_k": 9}, "model.moe.top_k", "n_routed_experts=8"),
        ({"attention.kv_lora_rank": 0}, "model.attention.kv_lora_rank", ">= 1"),
        ({"moe.impl": "magic"}, "model.moe.impl", "dropless"),
        ({"moe.precision": "fp2"}, "model.moe.precision", "nvfp4_fwd_mxfp8_bwd"),
        ({"moe.n_group": 3}, "model.moe.n_group", "divide"),
        ({"moe.topk_group": 3}, "model.moe.topk_group", "n_group=2"),
        ({"first_k_dense_replace": 7}, "model.first_k_dense_replace", "num_layers=3"),
        ({"attention.qk_rope_head_dim": 7}, "model.attention.qk_rope_head_dim", "even"),
    ],
)
def test_bad_values_name_key_and_range(over, key, text):
    with pytest.raises(ConfigError) as ei:
        validate(_cfg(**over))
    msg = str(ei.value)
    assert key in msg and text in msg, msg
    assert any(k == key for k, _ in ei.value.problems)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as ei:
        validate(_cfg(**{"moe.top_k": 99, "attention.v_head_dim": -1}))
    keys = {k for k, _ in ei.value.problems}
    assert {"model.moe.top_k", "model.attention.v_head_dim"} <= keys


def test_unknown_stage_rejected():
    c = _cfg()
    c.stages = ["smoke", "nope"]
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        validate(c)


def test_model_config_roundtrip_and_hashable():
    cfg = preset("kimi_k2")
    assert ModelConfig.from_config(cfg.to_config_dict()) == cfg
    assert hash(cfg) == hash(ModelConfig.from_config(cfg.to_config_dict()))
    assert cfg.replace(**{"moe.impl": "capacity"}).moe.impl == "capacity"
