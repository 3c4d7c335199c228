"""Command line: build, inspect and verify the data of an experiment config.

    python -m c2jax.data build  --config experiments/configs/quickstart.py[:arg] [--dir DIR] [--pin FILE]
    python -m c2jax.data verify --config experiments/configs/quickstart.py      # deep checksum check
    python -m c2jax.data show   --config experiments/configs/quickstart.py      # manifest summary

`build` validates ``config.data`` first (a bad config exits with status 2 before any work), then
builds corpus, tokenizer and shards (idempotent: a second call finds everything; resumable: a
killed build continues where it stopped) and prints a JSON summary. Overrides use dotted keys:
``--set data.sources.stdlib_code.max_bytes=100000``.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from typing import Any


def load_config(spec: str) -> Any:
    """`get_config(arg)` of an experiment file given as ``PATH[:arg]`` (exits naming a missing file)."""
    from c2jax.config import load_config_file

    try:
        return load_config_file(spec)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from None


def apply_override(config: Any, item: str) -> None:
    key, _, raw = item.partition("=")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    parts = key.split(".")
    cur = config
    for p in parts[:-1]:
        cur = cur[p]
    cur[parts[-1]] = value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2jax.data", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["build", "verify", "show"])
    ap.add_argument("--config", required=True, help="experiment config file[:arg]")
    ap.add_argument("--dir", default=None, help="data root (default: config.data.dir)")
    ap.add_argument("--pin", default=None, help="write the BuiltData JSON here (pins a run's data)")
    ap.add_argument("--set", action="append", default=[], help="override, e.g. data.tokenizer.vocab_size=2048")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    from c2jax.config import Checker, ConfigError
    from c2jax.data.config_checks import validate_data
    from c2jax.data.corpus import CorpusError
    from c2jax.data.loader import DataError
    from c2jax.data.shards import ShardError
    from c2jax.data.tokenizer import TokenizerError

    config = load_config(args.config)
    for item in args.set:
        apply_override(config, item)
    if "data" not in config:
        print(f"error: {args.config} has no `data` section", file=sys.stderr)
        return 2
    check = Checker("data")
    validate_data(check, config["data"], config)
    if check.problems:
        print(f"error: {ConfigError(check.problems)}", file=sys.stderr)
        return 2
    from c2jax.data.build import build

    try:
        built = build(config["data"], root=args.dir, progress=not args.no_progress)
        if args.command == "verify":
            for split in ("train", "heldout"):
                built.reader(split, verify="deep")
        if args.pin:
            built.save(args.pin)
    except (CorpusError, ShardError, TokenizerError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out: dict[str, Any] = {
        "manifest_hash": built.manifest_hash,
        "corpus": built.corpus_dir,
        "tokenizer": built.tokenizer_path,
        "vocab_size": built.vocab_size,
        "shards": built.shards_dir,
        "tokens": built.tokens,
    }
    if args.command == "show":
        with open(os.path.join(built.corpus_dir, "manifest.json")) as f:
            m = json.load(f)
        out.update(sources=m["sources"], dropped=m["dropped"], held_out_packages=m["held_out_packages"],
                   n_packages={k: len(v) for k, v in m["packages"].items()})
    if args.command == "verify":
        out["verified"] = True
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
