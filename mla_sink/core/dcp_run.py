"""The DCP branch of :func:`mla_sink.api.run`: the local path computes a sink-free (out, lse) over
this rank's shard, in fp32, and :mod:`mla_sink.core.dcp` merges across ranks and applies the sink once."""

from __future__ import annotations

from typing import Any, Optional

import torch

from mla_sink.core.dcp import LocalDecode
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_V
from mla_sink.paths import prepare_runner


def local_decode_fp32(plan: LaunchPlan) -> LocalDecode:
    """The per-rank decode of a DCP call: ``plan``'s path on this rank's shard, sink-free, writing an
    **fp32** partial output (so partials that cancel across ranks keep their difference; it is rounded
    to the output dtype once, after the merge). The path's runner is prepared on the first shard of each
    signature (:meth:`~mla_sink.core.inputs.DecodeInputs.signature`: the shard's rows and the local ids' shape
    may differ between calls) and reused, as eager calls reuse theirs.

    Returns:
        ``DecodeInputs -> (out_r fp32 [T, H, 512], lse_r fp32 [T, H])``; every launcher writes the dtype of
        the ``out`` buffer it is given (AITER's own output is bf16, so its partials carry bf16 precision).

    Raises:
        ValueError: ``plan``'s path writes no LSE (here), or returned none (at the call).
    """
    if plan.params.get("return_lse") is False:
        raise ValueError(f"path {plan.path!r} (row {plan.row_id}) writes no LSE and cannot serve DCP")
    runners: dict = {}

    def local_decode(x: DecodeInputs):
        buf = torch.empty((x.q.shape[0], x.q.shape[1], D_V), dtype=torch.float32, device=x.q.device)
        x = x._replace(out=buf)
        key = x.signature()
        runner = runners.get(key)
        if runner is None:
            if len(runners) >= MAX_SHARD_RUNNERS:
                runners.clear()
            runner = runners[key] = prepare_runner(plan, x)
        out, lse = runner(x)
        if lse is None:
            raise ValueError(f"path {plan.path!r} returned no LSE; DCP needs one")
        return out, lse

    return local_decode


#: Shard signatures one prepared DCP call keeps runners for; beyond this they are cleared (ever new shapes).
MAX_SHARD_RUNNERS = 64


def run_dcp(local: LocalDecode, inputs: DecodeInputs, *, group: Any, layout: str, num_kv_rows: Optional[int],
            dcp_world_size: int):
    """Run the prepared rank-local decode ``local`` (:func:`local_decode_fp32`) on this rank's shard and merge over
    ``group`` (``dcp_world_size`` ranks). The DCP arguments were checked by :func:`mla_sink.api.check_dcp_args`
    when ``local`` was prepared; the merge checks this call's shard and ids before any collective.
    Partials are computed and exchanged in fp32 (docs/DCP.md).

    Raises:
        ValueError: a shard or ids that disagree with ``num_kv_rows`` and the layout
            (:func:`mla_sink.core.dcp.dcp_sparse_mla_decode`).
    """
    from mla_sink.core.dcp import dcp_sparse_mla_decode

    return dcp_sparse_mla_decode(inputs, group=group, layout=layout, num_kv_rows=num_kv_rows, local_decode=local,
                                 dcp_world_size=dcp_world_size)
