"""The quickstart corpus is pinned: its manifest hash is a recorded constant, and a machine whose
sources differ gets an error naming each difference (before anything is read).

`test_quickstart_manifest_hash_is_the_recorded_one` builds the quickstart corpus (~5 s of CPU) and
compares its manifest hash with tests/data/quickstart_corpus_manifest.json; on a mismatch it names
the documents added, missing or changed. Regenerate the record (only when the pins or the corpus
code change on purpose) with:  python tests/data/test_data_corpus_pin.py
"""
from __future__ import annotations

import json
import os
import sys

import pytest
from _paths import REPO_ROOT, TESTS_DIR

from c2jax.data import presets
from c2jax.data.corpus import build_corpus
from c2jax.data.pins import CorpusPinError, check_pins, pin_differences

RECORD = os.path.join(TESTS_DIR, "data", "quickstart_corpus_manifest.json")


def _summary(manifest: dict) -> dict:
    return {s: sorted(f"{d['source']} {d['package']} {d['path']} {d['sha256'][:16]}" for d in docs)
            for s, docs in manifest["documents"].items()}


def _build(root: str) -> dict:
    corpus = build_corpus(presets.quickstart(), root, progress=False)
    with open(os.path.join(corpus.dir, "manifest.json")) as f:
        return json.load(f)


def _explain(got: dict, want: dict) -> str:
    lines = []
    for split in sorted(set(got) | set(want)):
        g, w = set(got.get(split, ())), set(want.get(split, ()))
        by_path = lambda xs: {x.rsplit(" ", 1)[0]: x for x in xs}  # noqa: E731
        gp, wp = by_path(g), by_path(w)
        for k in sorted(set(gp) - set(wp))[:10]:
            lines.append(f"{split}: extra {k}")
        for k in sorted(set(wp) - set(gp))[:10]:
            lines.append(f"{split}: missing {k}")
        for k in sorted(set(gp) & set(wp)):
            if gp[k] != wp[k]:
                lines.append(f"{split}: changed {k}")
    return "\n".join(lines[:40]) or "(same documents: the difference is in the config or counts)"


def test_pin_differences_name_each_problem():
    pins = {"python": "2.7.18", "packages": {"rich": "0.0.1", "c2jax-no-such-dist": "1.0", "numpy": None}}
    problems = pin_differences(pins)
    assert any(p.startswith("python ") and "2.7.18" in p for p in problems)
    assert any(p.startswith("rich ") and "pinned 0.0.1" in p and "pip install 'rich==0.0.1'" in p for p in problems)
    assert any("c2jax-no-such-dist is not installed" in p for p in problems)
    with pytest.raises(CorpusPinError, match="data.pins = {}"):
        check_pins(pins)
    check_pins({})  # no pins: no check
    check_pins(None)


def test_a_pin_mismatch_stops_the_build_before_anything_is_written(tmp_path):
    cfg = presets.quickstart()
    cfg.pins.packages["rich"] = "0.0.1"
    with pytest.raises(CorpusPinError, match="rich"):
        build_corpus(cfg, str(tmp_path), progress=False)
    assert not os.path.exists(tmp_path / "corpus")


def test_quickstart_reads_only_pinned_packages():
    cfg = presets.quickstart()
    pinned = sorted(cfg.pins.packages)
    for src in ("package_code", "package_docs"):
        assert sorted(cfg.sources[src].packages) == pinned and "*" not in cfg.sources[src].packages


def test_setup_extra_installs_exactly_the_pins():
    """`pip install -e '.[quickstart-corpus]'` installs the versions the preset checks."""
    import re

    with open(os.path.join(REPO_ROOT, "setup.py")) as f:
        extra = f.read().split('"quickstart-corpus"', 1)[1].split("]", 1)[0]
    pins = dict(x.split("==") for x in re.findall(r'"([A-Za-z0-9._\-]+==[^"]+)"', extra))
    assert pins == presets.QUICKSTART_PINS["packages"]


def test_quickstart_manifest_hash_is_the_recorded_one(tmp_path):
    problems = pin_differences(presets.quickstart().pins)
    if problems:  # a machine without the README's pinned install: say so, do not compare
        pytest.fail("this machine's sources differ from the quickstart pins:\n" + "\n".join(problems), pytrace=False)
    with open(RECORD) as f:
        want = json.load(f)
    m = _build(str(tmp_path))
    assert m["hash"] == want["hash"], ("quickstart corpus manifest differs from the recorded one:\n"
                                       + _explain(_summary(m), want["documents"]))


if __name__ == "__main__":  # regenerate the record
    import tempfile

    m = _build(tempfile.mkdtemp(prefix="c2jax_qs_corpus_"))
    rec = {"_comment": "The quickstart corpus manifest recorded with the pinned sources (c2jax/data/presets.py "
                       "QUICKSTART_PINS); checked by tests/data/test_data_corpus_pin.py, which also regenerates it.",
           "hash": m["hash"], "python": m["python"], "documents": _summary(m)}
    with open(RECORD, "w") as f:
        json.dump(rec, f, indent=0, sort_keys=True)
    print("recorded", m["hash"], file=sys.stderr)
