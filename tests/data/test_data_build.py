"""Pipeline: corpus -> tokenizer -> shards; idempotent, resumable, injection-safe; CLI and pre-training checks."""
import json
import os

import ml_collections
import numpy as np
import pytest

from _data_common import fake_data_config
from c2jax.config import ConfigError, validate
from c2jax.data import build as B
from c2jax.data import tokenizer as T
from c2jax.data.__main__ import main as cli
from c2jax.data.chat_format import ChatFormat, Message
from c2jax.data.config_checks import check_built, check_data_ready, check_seq_len, check_vocab
from c2jax.data.corpus import Corpus, CorpusError
from c2jax.data.loader import DataError
from _paths import TESTS_DIR  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fake"))
    cfg = fake_data_config(root)
    return cfg, B.build(cfg, progress=False)


def test_shards_hold_exactly_the_corpus(built):
    cfg, b = built
    tok = b.tokenizer()
    assert tok.vocab_size == b.vocab_size <= 400
    fmt = ChatFormat(tok)
    corpus = Corpus.load(b.corpus_dir)
    for split in ("train", "heldout"):
        r = b.reader(split, verify="deep")
        docs = list(corpus.documents(split))
        assert r.n_docs == len(docs)
        assert r.meta["manifest_hash"] == b.manifest_hash
        for i, d in enumerate(docs):
            ids = r.doc_tokens(i)
            assert ids[-1] == tok.eos_id
            assert r.sources[r.doc_source[i]].name == d.source and r.packages[r.doc_package[i]] == d.package
            if d.kind == "text":
                assert tok.decode(ids[:-1]) == d.text
                # Corpus text never yields special ids: a file spelling <|im_end|> cannot inject a role.
                assert np.all(ids[:-1] >= T.NUM_RESERVED)
            else:
                obj = json.loads(d.text)
                rr = fmt.render([Message.from_openai(m) for m in obj["messages"]], tools=obj["tools"] or None)
                assert np.array_equal(ids[:-1], rr.ids)
                mask = r.read_spans([(r.doc_offsets[i], r.doc_offsets[i + 1])], "loss_mask")[0]
                assert np.array_equal(mask[:-1], rr.loss_mask) and mask[-1] == 0
    inject = [i for i, d in enumerate(corpus.documents("train")) if d.path == "alpha/inject.py"]
    assert inject, "the injection fixture must be in the corpus"


def test_build_is_idempotent(built):
    cfg, b = built
    meta = os.path.join(b.shards_dir, "train", "meta.json")
    before = os.path.getmtime(meta)
    b2 = B.build(cfg, progress=False)
    assert (b2.manifest_hash, b2.tokenizer_path, b2.shards_dir) == (b.manifest_hash, b.tokenizer_path, b.shards_dir)
    assert os.path.getmtime(meta) == before


def test_build_resumes_after_crash(tmp_path, monkeypatch):
    cfg = fake_data_config(str(tmp_path))
    clean = B.build(cfg, root=str(tmp_path / "clean"), progress=False)
    monkeypatch.setattr(B, "BATCH_DOCS", 3)
    from c2jax.data import shards

    real = shards.ShardWriter.write_batch
    calls = {"n": 0}

    def crashing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(self, *a, **k)

    monkeypatch.setattr(shards.ShardWriter, "write_batch", crashing)
    with pytest.raises(KeyboardInterrupt):
        B.build(cfg, root=str(tmp_path / "crash"), progress=False)
    monkeypatch.setattr(shards.ShardWriter, "write_batch", real)
    split_dir = os.path.join(str(tmp_path / "crash"), "shards", os.path.basename(clean.shards_dir), "train")
    assert json.load(open(os.path.join(split_dir, "progress.json")))["docs_done"] == 6
    assert not os.path.exists(os.path.join(split_dir, "meta.json"))
    b = B.build(cfg, root=str(tmp_path / "crash"), progress=False)
    assert b.manifest_hash == clean.manifest_hash
    for split in ("train", "heldout"):
        m1 = json.load(open(os.path.join(b.shards_dir, split, "meta.json")))
        m0 = json.load(open(os.path.join(clean.shards_dir, split, "meta.json")))
        assert m1["digests"] == m0["digests"] and m1["n_tokens"] == m0["n_tokens"]


def test_build_survives_kill_9_between_write_and_commit(tmp_path):
    """A real SIGKILL after a batch's arrays are written but before progress.json commits them."""
    import subprocess
    import sys

    cfg = fake_data_config(str(tmp_path))
    clean = B.build(cfg, root=str(tmp_path / "clean"), progress=False)
    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {TESTS_DIR!r})\n"
        "from _data_common import fake_data_config\n"
        "from c2jax.data import build as B, shards\n"
        "B.BATCH_DOCS = 4\n"
        "real = shards.ShardWriter._commit\n"
        "n = [0]\n"
        "def commit(self):\n"
        "    n[0] += 1\n"
        "    if n[0] == 4:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real(self)\n"
        "shards.ShardWriter._commit = commit\n"
        f"B.build(fake_data_config({str(tmp_path)!r}), root={str(tmp_path / 'killed')!r}, progress=False)\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr
    b = B.build(cfg, root=str(tmp_path / "killed"), progress=False)
    for split in ("train", "heldout"):
        m1 = json.load(open(os.path.join(b.shards_dir, split, "meta.json")))
        m0 = json.load(open(os.path.join(clean.shards_dir, split, "meta.json")))
        assert m1["digests"] == m0["digests"]


def test_build_replaces_a_corrupt_store(tmp_path):
    cfg = fake_data_config(str(tmp_path))
    b = B.build(cfg, progress=False)
    split = os.path.join(b.shards_dir, "train")
    meta = json.load(open(os.path.join(split, "meta.json")))
    meta["digests"]["loss_mask"][0] = "f" * 16
    json.dump(meta, open(os.path.join(split, "meta.json"), "w"))
    with pytest.warns(UserWarning, match="'loss_mask' is corrupt.*rebuilding"):
        b2 = B.build(cfg, progress=False)
    b2.reader("train", verify="deep")
    assert [p for p in os.listdir(b.shards_dir) if p.startswith("train.corrupt-")]


def test_loader_from_built_data_and_pinning(built, tmp_path):
    cfg, b = built
    with pytest.raises(DataError, match="no document of source 'transcripts' fits"):
        b.loader(seq_len=32, batch_size=4, seed=0)  # default weights include whole-packed chat sources
    text_mix = {"stdlib_code": 0.3, "package_code": 0.5, "package_docs": 0.2}
    loader = b.loader(seq_len=32, batch_size=4, seed=0, weights=text_mix)
    batch = loader.next_batch()
    assert batch["inputs"].shape == (4, 32) and batch["inputs"].max() < b.vocab_size
    pin = b.save(str(tmp_path / "data.json"))
    b2 = B.BuiltData.load(pin)
    assert b2 == b
    l2 = b2.loader(seq_len=32, batch_size=4, seed=0, weights=text_mix)
    assert np.array_equal(l2.next_batch()["inputs"], batch["inputs"])
    sft = b.loader(seq_len=512, batch_size=2, seed=0, weights={"sft_synth": 1.0, "transcripts": 1.0})
    bt = sft.next_batch()
    assert bt["loss_mask"].sum() > 0 and bt["loss_mask"].sum() < bt["loss_mask"].size


def test_pretraining_checks(built, tmp_path):
    cfg, b = built
    readers = check_data_ready(b, model_vocab_size=512, max_position_embeddings=128, seq_len=64)
    assert set(readers) == {"train", "heldout"}
    with pytest.raises(DataError, match="vocabulary mismatch"):
        check_vocab(b.vocab_size, b.vocab_size - 1)
    with pytest.raises(DataError, match="beyond the model's positions"):
        check_seq_len(4096, 2048)
    with pytest.raises(DataError, match="no training tokens|do not hold"):
        check_built(b, {"stdlib_code": 1.0, "nope": 1.0})
    # A corrupt shard stops before training, with the array named.
    import shutil
    copy = str(tmp_path / "copy")
    shutil.copytree(b.shards_dir, copy)
    meta = json.load(open(os.path.join(copy, "train", "meta.json")))
    meta["digests"]["tokens"][0] = "0" * 16
    json.dump(meta, open(os.path.join(copy, "train", "meta.json"), "w"))
    bad = B.BuiltData(**{**b.__dict__, "shards_dir": copy})
    with pytest.raises(DataError, match="'tokens' is corrupt"):
        check_built(bad)


def test_empty_weighted_source_stops_build(tmp_path):
    cfg = fake_data_config(str(tmp_path))
    cfg.sources.package_code.packages = ["does-not-exist"]
    with pytest.raises(CorpusError, match="package_code has weight 0.5 but produced no training documents"):
        B.build(cfg, progress=False)


def test_config_validator(tmp_path):
    c = ml_collections.ConfigDict({"data": fake_data_config(str(tmp_path)).to_dict()})
    validate(c)
    c.data.sources.transcripts.paths = [str(tmp_path / "missing.jsonl")]
    c.data.tokenizer.vocab_size = 100
    c.data.sources["bogus"] = {"weight": 1.0}
    c.data.shards.compression = "lz4"
    c.model = ml_collections.ConfigDict({"vocab_size": 300, "max_position_embeddings": 64})
    c.data.seq_len = 128
    with pytest.raises(ConfigError) as e:
        validate(c)
    keys = {k for k, _ in e.value.problems}
    assert {"data.sources.transcripts.paths", "data.tokenizer.vocab_size", "data.sources.bogus",
            "data.shards.compression", "data.seq_len"} <= keys


def test_cli_build_and_bad_config(tmp_path, capsys):
    root = str(tmp_path)
    fake_data_config(root)  # creates the fake site
    cfg_file = tmp_path / "exp.py"
    cfg_file.write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom _data_common import fake_data_config\n"
        "import ml_collections\n"
        "def get_config(arg=''):\n"
        "    c = ml_collections.ConfigDict()\n"
        "    c.data = fake_data_config(%r)\n"
        "    return c\n" % (TESTS_DIR, root))
    assert cli(["build", "--config", str(cfg_file), "--no-progress", "--pin", str(tmp_path / "pin.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vocab_size"] <= 400 and out["tokens"]["train"]["package_code"] > 0
    assert B.BuiltData.load(str(tmp_path / "pin.json")).manifest_hash == out["manifest_hash"]
    assert cli(["verify", "--config", str(cfg_file), "--no-progress"]) == 0
    assert cli(["build", "--config", str(cfg_file), "--no-progress", "--set", "data.sources.stdlib_code.weight=-1.0"]) == 2
    assert "data.sources.stdlib_code.weight" in capsys.readouterr().err


@pytest.mark.slow
def test_quickstart_preset_end_to_end(tmp_path):
    """The real quickstart mix on this machine's stdlib and packages (about half a minute)."""
    from c2jax.data import presets

    cfg = presets.quickstart(dir=str(tmp_path / "data"))
    b = B.build(cfg, progress=False)
    assert b.vocab_size == 4096
    corpus = Corpus.load(b.corpus_dir)
    m = corpus.manifest
    assert {"rich", "stdlib:json", "stdlib:email"} <= set(m["held_out_packages"])
    train_pkgs = set(m["packages"]["train"])
    assert not train_pkgs & set(m["held_out_packages"]) and len(train_pkgs) >= 20
    assert not any("/_vendor/" in d["path"] or "/vendor/" in d["path"] for d in m["documents"]["train"])
    assert sum(b.tokens["train"].values()) > 1_000_000 and b.tokens["heldout"]["package_code"] > 10_000
    text_mix = {k: v for k, v in b.default_weights.items() if v > 0}
    batch = b.loader(seq_len=256, batch_size=8, seed=0, weights=text_mix).next_batch()
    assert batch["loss_mask"].mean() > 0.9
    sft = b.loader(seq_len=1024, batch_size=4, seed=0, weights=presets.sft_weights()).next_batch()
    assert 0 < sft["loss_mask"].mean() < 1
