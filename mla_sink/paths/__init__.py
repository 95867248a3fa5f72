"""The paths' launchers: each turns a complete :class:`~mla_sink.core.plan.LaunchPlan` into a runner.

``PREPARERS[path](plan, x)`` returns ``run(x) -> (out, lse)`` for every call whose tensors have the
metadata (shapes, strides, dtypes, devices) of ``x``'s; :mod:`mla_sink.api` keeps one runner per call
signature, so the per-call work is the launch alone. Every runner returns ``out [T, H, 512]`` final
(sink applied, empty rows 0) in the out dtype (q's dtype; bf16 for fp8 q; the dtype of ``x.out`` when
given) and ``lse`` fp32 ``[T, H]`` natural log, sink excluded (``-inf`` on empty rows), or ``None``
from a path that writes no LSE. Launchers only execute: every choice was made while planning.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from mla_sink.core.dtypes import DS_MLA_KEYS
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.validate import check_ds_mla_pointer

Result = tuple[torch.Tensor, Optional[torch.Tensor]]
Runner = Callable[[DecodeInputs], Result]


def _prepare_reference(plan: LaunchPlan, x: DecodeInputs) -> Runner:
    from mla_sink.paths.reference import run_reference

    return lambda x: run_reference(plan, x)


def _prepare_triton(plan: LaunchPlan, x: DecodeInputs) -> Runner:
    from mla_sink.paths.triton.launch import prepare_triton

    return prepare_triton(plan, x)


def _prepare_aiter(plan: LaunchPlan, x: DecodeInputs) -> Runner:
    from mla_sink.paths.aiter.launch import prepare_aiter

    return prepare_aiter(plan, x)


PREPARERS: dict[str, Callable[[LaunchPlan, DecodeInputs], Runner]] = {
    "reference": _prepare_reference,
    "triton": _prepare_triton,
    "aiter_persistent": _prepare_aiter,
    "aiter_lse": _prepare_aiter,
    "aiter_lse_single_split": _prepare_aiter,
    "aiter_lse_fp8_two_split": _prepare_aiter,
}
#: the paths the runtime can launch (``tests/test_rules.py`` proves they are the rule table's paths)
LAUNCHERS = PREPARERS


def prepare_runner(plan: LaunchPlan, x: DecodeInputs) -> Runner:
    """The runner of ``plan`` for calls shaped like ``x`` (see the module docstring). Strided ``sinks`` (e.g. a
    column ``[:, layer]`` of a ``[H, layers]`` parameter, or a broadcast ``expand``) are read through a contiguous
    copy made per call (``[H]`` fp32: one small copy), as every kernel reads them at unit stride; contiguous ones
    cost nothing more. An ``fp8_ds_mla`` ``kv_cache``'s data pointer is checked on every call, on every path: it is
    no part of the signature the runner was prepared for, and a misaligned view reads its float32 scales shifted
    (the reference read them as NaN: a break test, forty-fourth session). The runner passes any further arguments
    (the Triton runners' ``lse`` buffer) through.

    Raises:
        KeyError: ``plan.path`` has no launcher (cannot happen for plans from the shipped table).
        ValueError: (from the runner) an ``fp8_ds_mla`` ``kv_cache`` whose data pointer is not a multiple of 4 bytes.
    """
    if x.sinks is not None and not x.sinks.is_contiguous():
        inner = PREPARERS[plan.path](plan, x._replace(sinks=x.sinks.contiguous()))

        def run(x: DecodeInputs, *rest) -> Result:
            return inner(x._replace(sinks=x.sinks.contiguous()), *rest)
    else:
        run = PREPARERS[plan.path](plan, x)
    if plan.spec.kv_dtype not in DS_MLA_KEYS:
        return run

    def checked(x: DecodeInputs, *rest) -> Result:
        check_ds_mla_pointer(x.kv_cache)
        return run(x, *rest)

    return checked

