"""The ``reference`` path: the float64 reference (:mod:`mla_sink.core.reference`) as a launcher."""

from __future__ import annotations

from typing import Any

import torch

from mla_sink.core.dtypes import out_dtype_for
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.reference import sparse_mla_decode_reference


def run_reference(plan: Any, x: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute the call in float64 and return ``(out, lse)``: ``out [T, H, 512]`` in the out dtype (q's
    dtype; bf16 for fp8 q; ``x.out``'s dtype when given, written in place), ``lse`` fp32 ``[T, H]``
    natural log, sink excluded, ``-inf`` on rows with no valid id (an ``fp8_ds_mla`` ``kv_cache``'s pointer is
    checked per call by :func:`mla_sink.paths.prepare_runner`)."""
    out_dtype = x.out.dtype if x.out is not None else out_dtype_for(plan.spec.q_dtype)
    out, lse = sparse_mla_decode_reference(
        x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale,
        topk_length=x.topk_length, q_scale=x.q_scale, kv_scale=x.kv_scale, logit_cap=x.logit_cap,
        out_dtype=out_dtype,
    )
    if x.out is not None:
        x.out.copy_(out)
        out = x.out
    return out, lse
