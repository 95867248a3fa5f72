"""The DCP branch of :func:`mla_sink.api.run`: the local path computes a sink-free (out, lse) over
this rank's shard, :mod:`mla_sink.core.dcp` merges across ranks and applies the sink once."""

from __future__ import annotations

from typing import Any, Optional

from mla_sink.core.inputs import DecodeInputs
from mla_sink.paths import launch
from mla_sink.core.plan import LaunchPlan


def run_dcp(plan: LaunchPlan, inputs: DecodeInputs, *, group: Any, layout: str, num_kv_rows: Optional[int]):
    """Run ``plan`` (which must return an LSE) on this rank's shard and merge over ``group``.

    The DCP arguments were checked by :func:`mla_sink.api.check_dcp_args` before this is reached.

    Raises:
        ValueError: a plan whose path writes no LSE.
    """
    from mla_sink.core.dcp import dcp_sparse_mla_decode

    if plan.params.get("return_lse") is False:
        raise ValueError(f"path {plan.path!r} (row {plan.row_id}) writes no LSE and cannot serve DCP")

    def local_decode(x: DecodeInputs):
        out, lse = launch(plan, x)
        if lse is None:
            raise ValueError(f"path {plan.path!r} returned no LSE; DCP needs one")
        return out, lse

    return dcp_sparse_mla_decode(inputs, group=group, layout=layout, num_kv_rows=num_kv_rows,
                                 local_decode=local_decode, dcp_world_size=plan.spec.dcp_world_size)
