"""The test-runner wheelhouse: pytest and its dependencies as wheels, made offline.

Task environments need pytest in their virtualenv (/env), but tests must not touch the network.
The wheels are rebuilt from the distributions installed in *this* Python (`repack_installed`):
a pure-Python distribution installed from a wheel is exactly its RECORD's files, so zipping them
back with the same dist-info gives an installable wheel. With `source="download"` the prefetch
command instead runs `pip download` of pinned versions (needs the package registry).

Only pure-Python (`Root-Is-Purelib: true`) distributions are repacked; anything else raises.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as md
import io
import os
import re
import zipfile

from c2jax.atomic import atomic_open

# pytest's runtime closure on Python 3.11 (pygments is needed by pytest >= 8.4).
RUNNER_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack_installed(name: str, out_dir: str) -> str:
    """Write an installed pure-Python distribution back as a wheel in `out_dir`; returns its path."""
    dist = md.distribution(name)
    wheel_meta = dist.read_text("WHEEL") or ""
    if "Root-Is-Purelib: true" not in wheel_meta:
        raise ValueError(f"{name}: not a pure-Python wheel install, cannot repack")
    files = dist.files or []
    dist_info = next((str(f).split("/")[0] for f in files if str(f).endswith(".dist-info/RECORD")), None)
    if dist_info is None:
        raise ValueError(f"{name}: no RECORD, cannot repack")
    canon = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = os.path.join(out_dir, f"{canon}-{dist.version}-py3-none-any.whl")
    if os.path.exists(path):
        return path
    os.makedirs(out_dir, exist_ok=True)
    rows, buf = [], io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(files, key=str):
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith((".pyc", "/RECORD", "/INSTALLER",
                                                                               "/REQUESTED", "direct_url.json")):
                continue
            data = f.locate().read_bytes()
            info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible bytes
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
            rows.append((rel, _record_hash(data), str(len(data))))
        record = io.StringIO()
        w = csv.writer(record, lineterminator="\n")
        w.writerows(rows + [(f"{dist_info}/RECORD", "", "")])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, record.getvalue())
    with atomic_open(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path


def runner_wheelhouse(out_dir: str) -> tuple[str, list[str]]:
    """(wheelhouse dir, requirement lines) for pytest, repacked from this Python's installs."""
    reqs = []
    for name in RUNNER_DISTS:
        repack_installed(name, out_dir)
        reqs.append(f"{name}=={md.version(name)}")
    return out_dir, reqs
