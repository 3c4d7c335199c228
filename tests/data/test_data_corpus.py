"""Corpus rules: licences, held-out split by package, vendored copies, dedup, manifest hash, SFT synthesis."""
import json
import os
import shutil
import subprocess

import pytest

from _data_common import BETA_CORE, fake_data_config
from c2jax.data import licences
from c2jax.data.corpus import Corpus, CorpusError, build_corpus, read_held_out_file
from c2jax.data.corpus import collect_documents as collect
from c2jax.data.sources import docstring_text, normalize_package, vendored_package


@pytest.fixture()
def cfg(tmp_path):
    return fake_data_config(str(tmp_path))


def by_split(out):
    return {s: [(d.source, d.package, d.path) for d in docs] for s, docs in out.items()}


def test_licence_expressions():
    ok = licences.PERMISSIVE
    assert licences.is_permissive("MIT", ok)
    assert licences.is_permissive("Apache-2.0 OR BSD-2-Clause", ok)
    assert licences.is_permissive("MIT OR GPL-3.0", ok)
    assert not licences.is_permissive("MPL-2.0 AND MIT", ok)
    assert licences.is_permissive("Apache-2.0 WITH LLVM-exception AND (MIT OR GPL-2.0)", ok)
    assert not licences.is_permissive("GPL-3.0-or-later", ok)
    assert not licences.is_permissive("UNKNOWN", ok)
    assert not licences.is_permissive("MIT AND (", ok)
    assert licences.from_text("Apache 2.0").expression == "Apache-2.0"
    assert licences.from_text("BSD 3-Clause License\n\nCopyright (c) 2020").expression == "BSD-3-Clause"
    assert licences.from_text("Copyright (c) 2001\nRedistribution and use in source and binary forms").expression == "BSD"
    assert licences.from_text("MIT OR AFL-2.1").expression == "MIT OR AFL-2.1"
    assert licences.from_text("Some proprietary terms").expression == licences.UNKNOWN


def test_vendored_and_names():
    assert vendored_package("pip/_vendor/rich/console.py") == ("rich", "pip")
    assert vendored_package("setuptools/_vendor/typing_extensions.py") == ("typing-extensions", "setuptools")
    assert vendored_package("pip/_vendor/__init__.py") == (None, None)
    assert vendored_package("alpha/core.py") == (None, None)
    assert normalize_package("Typing_Extensions") == "typing-extensions"
    assert normalize_package("stdlib:json") == "stdlib:json"
    doc = docstring_text(BETA_CORE, "beta")
    assert doc.startswith("Module beta\n\nBeta: the held-out package.") and "mul(a, b)\n\nMultiply" in doc


def test_rules_licence_heldout_dedup_vendored(cfg):
    out, dropped, held = collect(cfg, progress=False)
    s = by_split(out)
    pk = {sp: {p for _, p, _ in s[sp]} for sp in s}
    assert held == ["beta", "stdlib:textish"]
    assert "gamma" not in pk["train"] | pk["heldout"] and dropped["licence:GPL-3.0"] == 3
    assert pk["heldout"] == {"beta", "stdlib:textish"}
    assert not pk["train"] & pk["heldout"]
    # No training document equals, or derives from, a held-out file (delta ships a copy of beta).
    held_hashes = {d.sha256 for d in out["heldout"]} | {d.origin_sha256 for d in out["heldout"]} - {None}
    assert all(d.sha256 not in held_hashes and d.origin_sha256 not in held_hashes for d in out["train"])
    assert not any("copy_of_beta" in p for _, _, p in s["train"])
    assert dropped["duplicate of (or derived from) a held-out document"] >= 2
    # Vendored directories never enter by default.
    assert not any("_vendor" in p for sp in s for _, _, p in s[sp])
    # Every document records source, package, licence; all are permissive.
    for d in out["train"] + out["heldout"]:
        assert d.source and d.package and licences.is_permissive(d.licence)
    kinds = {d.source: d.kind for d in out["train"]}
    assert kinds["transcripts"] == "chat" and kinds["sft_synth"] == "chat" and kinds["package_code"] == "text"


def test_vendored_attribute_mode(cfg):
    cfg.vendored = "attribute"
    out, dropped, _ = collect(cfg, progress=False)
    train = by_split(out)["train"]
    assert ("package_code", "eps", "alpha/_vendor/eps/x.py") in train  # attributed to the vendored package
    assert dropped["vendored copy of a held-out package"] >= 1  # alpha/_vendor/beta never trains
    assert not any("_vendor/beta" in p for _, _, p in train)


def test_held_out_file_export(cfg, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "source": {"package": "Alpha", "licence": "MIT"}}) + "\n")
    cfg.held_out.packages_file = str(tasks)
    out, _, held = collect(cfg, progress=False)
    assert held == ["alpha", "beta", "stdlib:textish"]
    assert {d.package for d in out["heldout"]} >= {"alpha", "beta"}
    assert "alpha" not in {d.package for d in out["train"]}
    txt = tmp_path / "held.txt"
    txt.write_text("# exported\nrich\nstdlib:json  # comment\n")
    assert read_held_out_file(str(txt)) == ["rich", "stdlib:json"]
    js = tmp_path / "held.json"
    js.write_text(json.dumps({"packages": ["A_b"]}))
    assert read_held_out_file(str(js)) == ["a-b"]
    with pytest.raises(CorpusError, match="does not exist"):
        read_held_out_file(str(tmp_path / "nope.txt"))


def test_manifest_hash_is_content_addressed(cfg, tmp_path):
    c1 = build_corpus(cfg, str(tmp_path / "out"), progress=False)
    c2 = build_corpus(cfg, str(tmp_path / "out"), progress=False)
    assert c1.manifest_hash == c2.manifest_hash and c1.dir == c2.dir
    m = json.load(open(os.path.join(c1.dir, "manifest.json")))
    assert m["hash"] == c1.manifest_hash and m["held_out_packages"] == ["beta", "stdlib:textish"]
    assert sum(len(v) for v in m["documents"].values()) == sum(1 for s in ("train", "heldout") for _ in c1.documents(s))
    assert all(not os.path.isabs(d["path"]) for d in m["documents"]["train"])
    # Weights do not change the corpus; content does.
    cfg.sources.stdlib_code.weight = 0.9
    assert build_corpus(cfg, str(tmp_path / "out"), progress=False).manifest_hash == c1.manifest_hash
    site = cfg.sources.package_code.site_dirs[0]
    with open(os.path.join(site, "alpha", "__init__.py"), "a") as f:
        f.write("\n# changed\n")
    assert build_corpus(cfg, str(tmp_path / "out"), progress=False).manifest_hash != c1.manifest_hash
    assert Corpus.load(c1.dir).manifest_hash == c1.manifest_hash


def test_unknown_or_bad_sources(cfg):
    cfg.sources["nope"] = {"weight": 1.0}
    with pytest.raises(CorpusError, match="unknown source 'nope'"):
        collect(cfg, progress=False)
    del cfg.sources["nope"]
    with open(cfg.sources.transcripts.paths[0], "a") as f:
        f.write('{"messages": [{"role": "user", "content": "no answer"}]}\n')
    with pytest.raises(CorpusError, match="no assistant message"):
        collect(cfg, progress=False)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
@pytest.mark.parametrize("max_file_chars,context", [(6000, 12), (250, 2)])  # whole files; excerpts
def test_synthesised_examples_are_correct(cfg, tmp_path, monkeypatch, max_file_chars, context):
    import ast

    from c2jax.data import synth
    from c2jax.data.synth import _functions, stub_function

    monkeypatch.setattr(synth, "EXCERPT_CONTEXT", context)
    cfg.sources.sft_synth.max_file_chars = max_file_chars
    out, _, _ = collect(cfg, progress=False)
    synth = [d for d in out["train"] + out["heldout"] if d.source == "sft_synth"]
    kinds = {d.path.rsplit("#", 1)[1] for d in synth}
    assert kinds == {"implement", "edit_diff"}
    site = cfg.sources.package_code.site_dirs[0]
    checked = excerpts = 0
    for d in synth:
        msgs = json.loads(d.text)["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
        file_path, qual = d.path.split("#")[0].split("::")
        if not d.path.endswith("#edit_diff") or d.package not in ("alpha", "beta"):
            continue
        original = open(os.path.join(site, file_path)).read()
        fn = dict(_functions(ast.parse(original)))[qual]
        before = "".join(stub_function(original.splitlines(keepends=True), fn))
        shown = msgs[1]["content"].split("```python\n", 1)[1].rsplit("```", 1)[0]
        assert "raise NotImplementedError" in shown and shown in before
        assert (shown == before) == (len(before) <= max_file_chars)
        excerpts += shown != before
        work = tmp_path / f"apply{checked}"
        (work / os.path.dirname(file_path)).mkdir(parents=True)
        (work / file_path).write_text(before)
        (work / "answer.diff").write_text(msgs[2]["content"])
        subprocess.run(["git", "apply", "answer.diff"], cwd=work, check=True, capture_output=True)
        assert (work / file_path).read_text() == original
        checked += 1
    assert checked >= 3 and (excerpts > 0) == (max_file_chars < 1000)
    impl = next(d for d in synth if d.path.endswith("add#implement") and d.package == "alpha")
    ans = json.loads(impl.text)["messages"][2]["content"]
    assert "result = a + b" in ans and "def add(a, b):" in ans
