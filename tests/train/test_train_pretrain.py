"""Pretraining stages end to end on a small fake corpus (tests/_data_common.py): config validation,
bad input stopping before training with nothing lost, summary/metrics/plots, resume and chaining."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

from _data_common import fake_data_config
from c2jax.config import ConfigError, validate
from c2jax.model.config import model_config_dict
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT


def make_config(data, stages=("cpt",), steps=3, **model_over):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = list(stages)
    c.data = data
    over = {"vocab_size": 400, "num_layers": 2, "max_position_embeddings": 128, "moe.impl": "capacity"}
    over.update(model_over)
    c.model = model_config_dict("tiny", **over)
    c.train = dict(init_from="scratch", steps=steps, batch_size=2, seq_len=32, accum_steps=1,
                   loss={"xent": 1.0, "z_loss": 1e-4, "mtp_distill": 0.3}, mtp_start_step=1,
                   schedule={"name": "wsd", "peak_lr": 3e-3, "warmup_steps": 1},
                   log_every=1, eval_every=2, ckpt_every=2, keep_checkpoints=2,
                   eval={"batch_size": 2, "max_batches": 2, "probe_packages": 1, "probe_max_tokens": 64,
                         "bigram_baseline": True})
    return c


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pretrain_data"))
    return fake_data_config(root)


def _problems(excinfo) -> str:
    return str(excinfo.value)


def test_validators_report_every_bad_key(data):
    c = make_config(data, stages=("cpt", "long_context"))
    c.train.loss = {"xnet": 1.0}
    c.train.batch_size = 3
    c.train.accum_steps = 2
    c.train.init_from = "model.bin"
    c.train.schedule = {"name": "linear", "peak_lr": -1.0}
    c.long_context = {"seq_len": 4096, "yarn_factor": 2.0, "stepz": 3}
    with pytest.raises(ConfigError) as e:
        validate(c)
    msg = _problems(e)
    for key in ("train.loss.xnet", "train.batch_size", "train.init_from", "train.schedule.name",
                "train.schedule.peak_lr", "long_context.seq_len", "long_context.stepz"):
        assert key in msg, (key, msg)
    assert "beyond the model's positions" in msg and "256" in msg  # 128 positions x yarn 2
    ok = make_config(data, stages=("cpt", "long_context", "sft"))
    ok.long_context = {"seq_len": 64, "yarn_factor": 2.0, "steps": 2}
    validate(ok)


def _run(config, workdir):
    from c2jax.train.stages import run_stages

    return run_stages(config, workdir)


def test_bad_inputs_stop_before_training_and_lose_nothing(data, tmp_path):
    from c2jax.data.build import build

    # Tokenizer larger than the model's vocabulary.
    wd = str(tmp_path / "vocab")
    with pytest.raises(ConfigError, match="model.vocab_size") as e:
        _run(make_config(data, vocab_size=300), wd)
    assert "400" in str(e.value)
    assert not os.path.exists(os.path.join(wd, "cpt", "checkpoints"))
    # Sequence length beyond the positions of a later stage (checked before the first stage trains).
    c = make_config(data, stages=("cpt", "long_context"))
    c.long_context = {"seq_len": 256, "steps": 1}
    with pytest.raises(ConfigError, match="beyond the model's positions"):
        _run(c, str(tmp_path / "pos"))
    assert not os.path.exists(str(tmp_path / "pos" / "cpt" / "checkpoints"))
    # A workdir holding another run's stage: refused, its files untouched.
    wd = str(tmp_path / "other")
    os.makedirs(os.path.join(wd, "cpt"))
    marker = {"model": "0000", "optimizer": "adamw", "data": "x", "seq_len": 32, "batch_size": 2, "steps": 3}
    with open(os.path.join(wd, "cpt", "run_config.json"), "w") as f:
        json.dump(marker, f)
    with pytest.raises(ConfigError, match="use a new --workdir"):
        _run(make_config(data), wd)
    with open(os.path.join(wd, "cpt", "run_config.json")) as f:
        assert json.load(f) == marker
    # Missing source (weighted but yields nothing) and an SFT stage without chat data.
    bad = fake_data_config(str(tmp_path / "site2"))
    bad.sources.package_code.packages = ["no-such-package"]
    with pytest.raises(ConfigError, match="package_code"):
        _run(make_config(bad), str(tmp_path / "missing"))
    # Corrupt shard of a run's pinned data (workdir/data.json): detected by its checksum, named,
    # before training. (A fresh `build` instead moves a corrupt store aside and rebuilds it.)
    corrupt = fake_data_config(str(tmp_path / "site3"))
    built = build(corrupt, progress=False)
    wd = str(tmp_path / "corrupt")
    built.save(os.path.join(wd, "data.json"))
    tok_dir = os.path.join(built.shards_dir, "train", "tokens")
    chunk = max((os.path.join(p, f) for p, _, fs in os.walk(tok_dir) for f in fs if f != "zarr.json"),
                key=os.path.getsize)
    with open(chunk, "r+b") as f:
        f.seek(os.path.getsize(chunk) // 2)
        f.write(b"\x00\xff\x13\x37")
    with pytest.raises(ConfigError) as e:
        _run(make_config(corrupt), wd)
    assert "tokens" in str(e.value) and ("corrupt" in str(e.value) or "unreadable" in str(e.value))
    assert not os.path.exists(os.path.join(wd, "cpt", "checkpoints"))


def test_cpt_stage_end_to_end_summary_metrics_plot_and_rerun(data, tmp_path):
    from c2jax.train.metrics import read_jsonl
    from c2jax.train.pretrain import init_params

    wd = str(tmp_path / "run")
    c = make_config(data, steps=3)
    summary = _run(c, wd)["cpt"]
    for k in ("steps", "tokens", "held_out_loss_initial", "held_out_loss_final", "train_loss_final",
              "tokens_per_s", "wall_time_s", "bigram_held_out_loss"):
        assert summary.get(k) is not None, k
    assert summary["steps"] == 3 and summary["tokens"] == 3 * 2 * 32
    assert np.isfinite(summary["held_out_loss_final"]) and summary["held_out_loss_final"] < summary["held_out_loss_initial"]
    with open(os.path.join(wd, "summary.json")) as f:
        assert json.load(f)["cpt"]["held_out_loss_final"] == summary["held_out_loss_final"]
    assert os.path.getsize(os.path.join(wd, "loss_curve.png")) > 1000
    assert os.path.exists(os.path.join(wd, "cpt", "loss_curve.png"))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(wd, "cpt", "tb")))
    tr = read_jsonl(os.path.join(wd, "cpt", "train.jsonl"))
    assert [r["step"] for r in tr] == [1, 2, 3] and all("loss/mtp_distill" in r for r in tr)
    ev = read_jsonl(os.path.join(wd, "cpt", "eval.jsonl"))
    assert [r["step"] for r in ev] == [0, 2, 3]
    assert "held_out/package_code" in ev[-1] and "probe_nll" in ev[-1]
    # Rerunning the same command finds the finished stage: nothing retrained, same numbers.
    again = _run(c, wd)["cpt"]
    assert again["resumed_from_step"] == 3 and again["held_out_loss_final"] == summary["held_out_loss_final"]
    assert len(read_jsonl(os.path.join(wd, "cpt", "train.jsonl"))) == 3
    # init_from='ckpt:...' loads the trained parameters into a fresh run.
    from c2jax.train.pretrain import base_model_config

    p = init_params(f"ckpt:{wd}/cpt", base_model_config(c), 0)
    assert p["embed"]["embedding"].shape == (400, 64)


@pytest.mark.slow
def test_three_phases_chain_checkpoints(data, tmp_path):
    """cpt -> long_context (YaRN, 2x length) -> sft (assistant-only loss), each from the previous one."""
    wd = str(tmp_path / "three")
    c = make_config(data, stages=("cpt", "long_context", "sft"), steps=2)
    c.long_context = {"seq_len": 64, "batch_size": 1, "yarn_factor": 2.0, "steps": 2}
    c.sft = {"seq_len": 256, "batch_size": 1, "yarn_factor": 4.0, "steps": 2}
    s = _run(c, wd)
    assert set(s) == {"cpt", "long_context", "sft"}
    assert s["long_context"]["yarn_factor"] == 2.0 and s["long_context"]["seq_len"] == 64
    assert s["sft"]["mix"] and all(k in ("sft_synth", "transcripts") for k in s["sft"]["mix"])
    # Each later stage starts from the previous one's final parameters: its initial held-out loss
    # equals the previous stage's final one on shared sources.
    assert abs(s["long_context"]["held_out_loss_initial"] - s["cpt"]["held_out_loss_final"]) < 0.5


@pytest.mark.slow
def test_real_pipeline_kill_9_resume_is_bit_exact(data, tmp_path):
    """experiments/run.py on the fake corpus, SIGKILLed mid-run and rerun: same losses as a clean run."""
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(
        "import sys\n"
        f"sys.path[:0] = [{os.path.join(ROOT, 'tests')!r}, {os.path.dirname(os.path.abspath(__file__))!r}]\n"
        "from test_train_pretrain import make_config\n"
        "from _data_common import fake_data_config\n"
        f"def get_config(arg=''):\n"
        f"    c = make_config(fake_data_config({str(tmp_path / 'site')!r}), steps=10)\n"
        "    c.train.ckpt_every = 3\n"
        "    return c\n")
    env = {**os.environ, "C2JAX_PROGRESS": "0", "JAX_PLATFORMS": "cpu"}
    run = [sys.executable, os.path.join(ROOT, "experiments", "run.py"), f"--config={cfg_file}"]
    subprocess.run(run + [f"--workdir={tmp_path / 'ref'}"], env=env, check=True, capture_output=True, timeout=900)
    from c2jax.train.metrics import read_jsonl

    cut = tmp_path / "cut"
    p = subprocess.Popen(run + [f"--workdir={cut}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 900:
        recs = read_jsonl(str(cut / "cpt" / "train.jsonl"))
        if recs and recs[-1]["step"] >= 5:
            break
        assert p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(run + [f"--workdir={cut}"], env=env, check=True, capture_output=True, timeout=900)
    want = {r["step"]: r["loss"] for r in read_jsonl(str(tmp_path / "ref" / "cpt" / "train.jsonl"))}
    got = {r["step"]: r["loss"] for r in read_jsonl(str(cut / "cpt" / "train.jsonl"))}
    assert got == want
    shutil.rmtree(str(cut), ignore_errors=True)


def test_init_from_hf_directory_round_trips_and_rejects_a_mismatched_model(tmp_path):
    import jax

    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.model.hf.io import save_pretrained
    from c2jax.train.pretrain import init_params

    cfg = preset("tiny").replace(num_layers=2, vocab_size=128)
    params = init(cfg, jax.random.PRNGKey(3))
    save_pretrained(params, cfg, str(tmp_path / "hf"))
    got = init_params(f"hf:{tmp_path / 'hf'}", cfg, 0)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ConfigError, match="train.init_from"):
        init_params(f"hf:{tmp_path / 'hf'}", cfg.replace(vocab_size=256), 0)
