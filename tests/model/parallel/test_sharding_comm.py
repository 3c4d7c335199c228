"""Collective bytes from HLO text: every replica-group syntax XLA prints maps to the right mesh
axes, and while-loop bodies count once per trip."""
from __future__ import annotations

import pytest

from c2jax.model.parallel.comm_stats import collective_stats
from c2jax.model.parallel.sharding import MeshConfig, make_mesh

HLO = """HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %ag = f32[16,4]{1,0} all-gather(f32[4,4]{1,0} %x), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}
  %ar = f32[8]{0} all-reduce(f32[8]{0} %y), channel_id=2, replica_groups=[4,2]<=[8], to_apply=%add
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %a2a = f32[2,3]{1,0} all-to-all(f32[2,3]{1,0} %z), channel_id=3, replica_groups={{0,2},{1,3},{4,6},{5,7}}, dimensions={0}
  %cp = bf16[10]{0} collective-permute(bf16[10]{0} %q), channel_id=4, source_target_pairs={{0,1},{1,0}}
  %all = f32[4]{0} all-reduce(f32[4]{0} %r), channel_id=5, replica_groups={}, to_apply=%add
  %ag2 = f32[2]{0} all-gather(f32[1]{0} %s), channel_id=6, replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(1,0,2)) {'axis_0'}, dimensions={0}
}
"""


def test_group_syntaxes_and_trip_counts():
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, expert=2))  # 8 devices: (data, fsdp, expert, context)
    st = collective_stats(HLO, mesh)
    ops = {o[0] + str(o[2]): o for o in st["ops"]}
    assert ops["all-gather256"][1] == "fsdp+expert" and ops["all-gather256"][3] == 3  # axis_1 = ids 0..3 of a row
    assert ops["all-reduce32"][1] == "expert" and ops["all-reduce32"][3] == 3  # pairs {0,1}: innermost axis
    assert ops["all-to-all24"][1] == "fsdp"  # {0,2}: stride 2
    assert ops["collective-permute20"][1] == "expert"  # bf16: 2 bytes x 10
    assert ops["all-reduce16"][1] == "data+fsdp+expert"  # {} = every device
    # ids = iota([2,2,2]).T(1,0,2) read as [2,4]: row 0 = 0,1,4,5; groups along axis_0 = {0,2},{1,3},...
    assert ops["all-gather8"][1] == "fsdp"
    assert st["by_kind"]["all-gather"] == 3 * 256 + 8 and st["total"] == 3 * 256 + 8 + 3 * 32 + 24 + 20 + 16
