"""A pretraining stage (the owner's run_stages / train loop / checkpointer) with ``config.mesh``:
same train losses as the single-device run, and a rerun resumes from the sharded checkpoint."""
import ml_collections
import numpy as np
import pytest

from _data_common import fake_data_config
from c2jax.model.config import model_config_dict
from c2jax.model.parallel.sharding import mesh_config_dict


def _config(data, mesh=None):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = ["cpt"]
    c.data = data
    c.model = model_config_dict("tiny", **{"vocab_size": 400, "num_layers": 2, "max_position_embeddings": 128,
                                           "moe.impl": "dropless"})
    c.train = dict(init_from="scratch", steps=2, batch_size=4, seq_len=32, accum_steps=1,
                   loss={"xent": 1.0, "z_loss": 1e-4, "mtp_distill": 0.3}, mtp_start_step=1,
                   schedule={"name": "wsd", "peak_lr": 3e-3, "warmup_steps": 1},
                   log_every=1, eval_every=2, ckpt_every=2, keep_checkpoints=2,
                   eval={"batch_size": 2, "max_batches": 1, "probe_packages": 0, "probe_max_tokens": 64,
                         "bigram_baseline": False})
    if mesh is not None:
        c.mesh = mesh
    return c


@pytest.mark.slow
def test_cpt_stage_on_a_mesh_matches_one_device_and_resumes(tmp_path):
    from c2jax.config import validate
    from c2jax.train.metrics import read_jsonl
    from c2jax.train.stages import run_stages

    data = fake_data_config(str(tmp_path / "data"))
    one = _config(data)
    sharded = _config(data, mesh_config_dict("cpu8"))  # fsdp=2, expert=2, context=2
    validate(sharded)
    run_stages(one, str(tmp_path / "one"))
    s = run_stages(sharded, str(tmp_path / "mesh"))["cpt"]
    a = [r["loss"] for r in read_jsonl(str(tmp_path / "one" / "cpt" / "train.jsonl"))]
    b = [r["loss"] for r in read_jsonl(str(tmp_path / "mesh" / "cpt" / "train.jsonl"))]
    np.testing.assert_allclose(b, a, rtol=2e-5)
    again = run_stages(sharded, str(tmp_path / "mesh"))["cpt"]
    assert again["resumed_from_step"] == 2 and again["held_out_loss_final"] == s["held_out_loss_final"]
