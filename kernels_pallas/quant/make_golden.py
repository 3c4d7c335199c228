"""Generate the committed golden vectors tests/data/kernels_quant_golden.npz (run once, needs torch).

    python -m kernels_pallas.quant.make_golden

Pinned oracle versions: torch 2.13.0, torchao 0.18.0 (recorded in the file). The MX boundary set's
golden bytes come from the integer RCEIL rule (`torch_refs.numpy_rceil`), because torchao 0.18.0 is
one step low there; torchao's own bytes for that set are stored too (`boundary_torchao_*`) so the
deviation stays documented by data.
"""
from __future__ import annotations

import os

import numpy as np

from kernels_pallas.quant import golden_inputs, torch_refs

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "kernels_quant_golden.npz")
ELEMS = {"e4m3": (8, 0x600000), "e5m2": (15, 0x600000), "e2m1": (2, 0x400000)}


def build() -> dict[str, np.ndarray]:
    import torch
    import torchao

    x = golden_inputs.general_inputs(0)
    d: dict[str, np.ndarray] = {"x": x, "versions": np.array([torch.__version__, torchao.__version__])}
    for e in ELEMS:
        s, c = torch_refs.torchao_mx(x, e)
        d[f"mx_{e}_scales"], d[f"mx_{e}_data"] = s, c
    for row in (False, True):
        c, s, g = torch_refs.te_nvfp4(x, row_scaled=row)
        key = "nvfp4_row" if row else "nvfp4"
        d[f"{key}_data"], d[f"{key}_scales"], d[f"{key}_sdec"] = c, s, g
    xw = np.concatenate([x, -x[::-1]])[:128]  # 128 x 256: one row of 128x128 tiles
    for tile in ("1x128", "128x128"):
        c, s = torch_refs.deepgemm_fp8(xw, tile)
        d[f"fp8_{tile}_data"], d[f"fp8_{tile}_scales"] = c, s
    rows, maxima = golden_inputs.boundary_maxima()
    d["boundary_x"] = rows
    for e, (emax, t) in ELEMS.items():
        d[f"boundary_rceil_{e}"] = torch_refs.numpy_rceil(np.abs(rows).max(-1), emax, t)
        d[f"boundary_torchao_{e}"] = torch_refs.torchao_mx(rows, e)[0].reshape(-1)
    return d


if __name__ == "__main__":
    d = build()
    np.savez_compressed(OUT, **d)
    print("wrote", os.path.abspath(OUT), {k: v.shape for k, v in d.items()})
