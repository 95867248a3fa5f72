"""launch: run a :class:`LaunchPlan` on a call's tensors. The only impure stage of the pipeline.

Every launcher returns ``(out, lse)``: ``out [T, H, 512]`` final (sink applied, empty rows 0) in
the out dtype (q's dtype; bf16 for fp8 q) and ``lse`` fp32 ``[T, H]`` natural log, sink excluded
(``-inf`` on empty rows), or ``None`` from a path that writes no LSE.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from mla_sink.core.dtypes import out_dtype_for
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.reference import sparse_mla_decode_reference

Result = tuple[torch.Tensor, Optional[torch.Tensor]]


def _launch_reference(plan: LaunchPlan, x: DecodeInputs) -> Result:
    out, lse = sparse_mla_decode_reference(
        x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale,
        topk_length=x.topk_length, q_scale=x.q_scale, kv_scale=x.kv_scale, logit_cap=x.logit_cap,
        out_dtype=out_dtype_for(plan.spec.q_dtype),
    )
    if x.out is not None:
        x.out.copy_(out)
        out = x.out
    return out, lse


def _launch_triton(plan: LaunchPlan, x: DecodeInputs) -> Result:
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    return sparse_mla_decode_triton(
        x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale,
        topk_length=x.topk_length, q_scale=x.q_scale, kv_scale=x.kv_scale, logit_cap=x.logit_cap,
        out=x.out, num_kv_splits=plan.params.get("num_kv_splits"),
    )


def _launch_aiter(plan: LaunchPlan, x: DecodeInputs) -> Result:
    from mla_sink.paths.aiter import launch_aiter

    return launch_aiter(plan, x)


LAUNCHERS: dict[str, Callable[[LaunchPlan, DecodeInputs], Result]] = {
    "reference": _launch_reference,
    "triton": _launch_triton,
    "aiter_persistent": _launch_aiter,
    "aiter_lse": _launch_aiter,
    "aiter_lse_single_split": _launch_aiter,
    "aiter_lse_fp8_two_split": _launch_aiter,
}


def launch(plan: LaunchPlan, inputs: DecodeInputs) -> Result:
    """Run ``plan`` on ``inputs`` (already validated against ``plan.spec``).

    Returns:
        ``(out, lse)`` as described in the module docstring.

    Raises:
        KeyError: ``plan.path`` has no launcher (cannot happen for plans from the shipped table:
            ``tests/test_rules.py`` proves the table's paths equal :data:`LAUNCHERS`).
    """
    return LAUNCHERS[plan.path](plan, inputs)
