"""Command line: build environments and clean up after crashed processes.

    python -m c2jax.envs build DIR [-r requirements.txt] [--wheelhouse DIR] [--python PATH] [--network]
    python -m c2jax.envs reap          # remove sandboxes whose owning process is dead
    python -m c2jax.envs check         # is a usable bwrap installed, which limits can be enforced
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2jax.envs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) the environment of a repository; prints its id")
    b.add_argument("repo", help="repository directory at its base state")
    b.add_argument("-r", "--requirements", help="requirements file installed into the env's venv")
    b.add_argument("--wheelhouse", help="install only from this directory of wheels (pip --no-index)")
    b.add_argument("--python", help="interpreter for the venv (default /usr/bin/python3)")
    b.add_argument("--network", action="store_true", help="let pip use its index (no wheelhouse)")
    sub.add_parser("reap", help="remove sandboxes left by dead processes")
    sub.add_parser("check", help="report bwrap and the enforceable limits on this machine")
    args = parser.parse_args(argv)

    from c2jax.envs.errors import SandboxError

    try:
        if args.cmd == "build":
            from c2jax.envs.env_build import build_env

            print(build_env(args.repo, args.requirements, wheelhouse=args.wheelhouse, python=args.python,
                            network=args.network))
        elif args.cmd == "reap":
            from c2jax.envs.state import reap_orphans

            print(json.dumps(reap_orphans()))
        else:
            import os
            import tempfile

            from c2jax.envs import build_env, start
            from c2jax.envs.bwrap import bwrap_path

            with tempfile.TemporaryDirectory() as repo:
                with start(build_env(repo)) as sb:
                    print(json.dumps({"bwrap": bwrap_path(), "root": os.geteuid() == 0,
                                      "limits": sb.limits_report}, indent=1))
    except (SandboxError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
