"""The DCP branch of :func:`mla_sink.api.run`: the local path computes a sink-free (out, lse) over
this rank's shard, in fp32, and :mod:`mla_sink.core.dcp` merges across ranks and applies the sink once."""

from __future__ import annotations

from typing import Any, Optional

import torch

from mla_sink.core.dcp import LocalDecode
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_V
from mla_sink.paths import launch


def local_decode_fp32(plan: LaunchPlan) -> LocalDecode:
    """The per-rank decode of a DCP call: ``plan``'s path on this rank's shard, sink-free, writing an
    **fp32** partial output (so partials that cancel across ranks keep their difference; it is rounded
    to the output dtype once, after the merge).

    Returns:
        ``DecodeInputs -> (out_r fp32 [T, H, 512], lse_r fp32 [T, H])``; every launcher writes the dtype of
        the ``out`` buffer it is given (AITER's own output is bf16, so its partials carry bf16 precision).

    Raises:
        ValueError: the path returned no LSE.
    """

    def local_decode(x: DecodeInputs):
        buf = torch.empty((x.q.shape[0], x.q.shape[1], D_V), dtype=torch.float32, device=x.q.device)
        out, lse = launch(plan, x._replace(out=buf))
        if lse is None:
            raise ValueError(f"path {plan.path!r} returned no LSE; DCP needs one")
        return out, lse

    return local_decode


def run_dcp(plan: LaunchPlan, inputs: DecodeInputs, *, group: Any, layout: str, num_kv_rows: Optional[int]):
    """Run ``plan`` (which must return an LSE) on this rank's shard and merge over ``group``.

    The DCP arguments were checked by :func:`mla_sink.api.check_dcp_args` before this is reached.
    Partials are computed and exchanged in fp32 (:func:`local_decode_fp32`, docs/DCP.md).

    Raises:
        ValueError: a plan whose path writes no LSE.
    """
    from mla_sink.core.dcp import dcp_sparse_mla_decode

    if plan.params.get("return_lse") is False:
        raise ValueError(f"path {plan.path!r} (row {plan.row_id}) writes no LSE and cannot serve DCP")
    return dcp_sparse_mla_decode(inputs, group=group, layout=layout, num_kv_rows=num_kv_rows,
                                 local_decode=local_decode_fp32(plan), dcp_world_size=plan.spec.dcp_world_size)
