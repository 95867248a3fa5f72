"""The pipeline end to end: describe -> validate -> select -> plan -> launch -> finalize.

:func:`run` takes a :class:`CallSpec` and the call's tensors; :func:`sparse_mla_decode` derives the
spec from the tensors. :func:`prepare` does everything that needs no tensors (validation and
selection), so engines reject a configuration when they build a layer, never during CUDA-graph
capture. Semantics: :mod:`mla_sink.core.reference`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Optional

import torch

from mla_sink.core.describe import describe
from mla_sink import ops  # noqa: F401  (registers torch.ops.mla_sink.*)
from mla_sink.core.dtypes import DTYPE_KEYS
from mla_sink.core.inputs import DecodeInputs
from mla_sink.paths import launch
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.platform import arch_of, detect_platform
from mla_sink.core.records import D_QK, CallSpec, Platform
from mla_sink.core.select import plan_call
from mla_sink.core.validate import call_scalars, check_inputs, check_sinks, check_sm_scale

Result = tuple[torch.Tensor, Optional[torch.Tensor]]


def _cached_plan(spec: CallSpec, platform: Platform, path: Optional[str]) -> LaunchPlan:
    if path is not None and not isinstance(path, str):  # before the cache, which would fail to hash it
        raise ValueError(f"'path' must be a path name (str) or None (got {path!r})")
    return _plan_cache(spec, platform, path)


@functools.lru_cache(maxsize=1024)
def _plan_cache(spec: CallSpec, platform: Platform, path: Optional[str]) -> LaunchPlan:
    return plan_call(spec, platform, path=path)


def prepare(
    spec: CallSpec,
    platform: Optional[Platform] = None,
    *,
    path: Optional[str] = None,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
) -> LaunchPlan:
    """Validate and select with no call tensors: the layer-construction-time check.

    Args:
        spec: the call description (fields already validated by construction).
        platform: where it will run (default: this machine's current device).
        path: force a path (only rows naming it are considered).
        sinks: the layer's fp32 ``[H]`` sinks, checked now (dtype, shape, contiguity) if given.
        sm_scale: checked now if given.

    Returns:
        The cached :class:`LaunchPlan` that every later call of this shape will run.

    Raises:
        ValueError: sinks or sm_scale malformed, sinks on a device of another kind than the
            platform's (a GPU platform needs CUDA/ROCm sinks), or sinks given while ``spec.sinks`` is False.
        NoKernelError: the rule table refuses the call on this platform.
    """
    _check_records(spec, platform)
    if platform is None:
        platform = detect_platform(sinks.device if sinks is not None else None)
    if sinks is not None:
        if not spec.sinks:
            raise ValueError("'sinks' given but spec.sinks is False; build the spec with sinks=True")
        check_sinks(sinks, spec.num_heads)
        want = "cpu" if platform.arch == "cpu" else "cuda"
        if sinks.device.type != want:
            raise ValueError(f"'sinks' must be on a {want} device for platform arch {platform.arch!r} (got {sinks.device})")
    if sm_scale is not None:
        check_sm_scale(sm_scale)
    plan = _cached_plan(spec, platform, path)
    if plan.path.startswith("aiter"):
        # Run the AITER planner now on a one-token shape: whatever it rejects (malformed params, a
        # path without LSE for a call that needs one) is rejected at construction, not at the first forward.
        from mla_sink.paths.aiter import plan_aiter

        plan_aiter(plan, num_tokens=1, meta_param=(1, 1))
    return plan


def _check_records(spec: Any, platform: Any) -> None:
    if not isinstance(spec, CallSpec):
        raise ValueError(f"'spec' must be a mla_sink.CallSpec (got {type(spec).__name__})")
    if platform is not None and not isinstance(platform, Platform):
        raise ValueError(f"'platform' must be a mla_sink.Platform or None (got {platform!r}); "
                         "build one with Platform('gfx942', aiter_version='0.1.20')")


def check_dcp_args(dcp_world_size: int, dcp_group: Any, dcp_layout: Any, num_kv_rows: Any) -> None:
    """Check the decode-context-parallel arguments of :func:`run` / the layer, before any collective.

    Raises:
        ValueError: a layout other than ``interleaved``/``contiguous``; a group or ``num_kv_rows``
            given with ``dcp_world_size == 1``; with DCP, a missing group, a group that is not a
            process group of ``dcp_world_size`` ranks this rank belongs to, or ``num_kv_rows`` not an
            int >= 1.
    """
    if dcp_layout not in ("interleaved", "contiguous"):
        raise ValueError(f"'dcp_layout' must be in ('interleaved', 'contiguous') (got {dcp_layout!r})")
    if dcp_world_size == 1:
        if dcp_group is not None or num_kv_rows is not None:
            raise ValueError("'dcp_group' / 'num_kv_rows' given but dcp_world_size == 1")
        return
    if dcp_group is None:
        raise ValueError(f"'dcp_group' is required when dcp_world_size={dcp_world_size}")
    if isinstance(num_kv_rows, bool) or not isinstance(num_kv_rows, int) or num_kv_rows < 1:
        raise ValueError(f"'num_kv_rows' (the global pool size N) must be an int >= 1 with DCP (got {num_kv_rows!r})")
    from mla_sink.core.dcp import group_size_rank

    size, _ = group_size_rank(dcp_group, "dcp_group")
    if size != dcp_world_size:
        raise ValueError(f"'dcp_group' has {size} ranks but dcp_world_size={dcp_world_size}")


def check_spec_matches(spec: CallSpec, inputs: DecodeInputs) -> None:
    """Check that the tensors are those the spec describes.

    Args:
        spec: the call description the plan was chosen for.
        inputs: the call's tensors (already shape-checked by :func:`check_inputs`).

    Raises:
        ValueError: q or kv_cache dtype, head count ``H``, ``topk`` or sinks presence differ from
            ``spec`` (message names the field, the tensors' value and the spec's).
    """
    got = {
        "q_dtype": DTYPE_KEYS.get(inputs.q.dtype),
        "kv_dtype": DTYPE_KEYS.get(inputs.kv_cache.dtype),
        "num_heads": inputs.q.shape[1],
        "topk": inputs.indices.shape[1],
        "sinks": inputs.sinks is not None,
    }
    for name, value in got.items():
        if getattr(spec, name) != value:
            raise ValueError(f"the tensors give {name}={value!r} but spec.{name}={getattr(spec, name)!r}")


def run(
    spec: CallSpec,
    inputs: DecodeInputs,
    *,
    platform: Optional[Platform] = None,
    path: Optional[str] = None,
    dcp_group: Any = None,
    dcp_layout: str = "interleaved",
    num_kv_rows: Optional[int] = None,
) -> Result:
    """Run one sparse MLA decode call.

    Args:
        spec: the call description (see :func:`mla_sink.core.describe.describe`).
        inputs: the tensors: a :class:`DecodeInputs`, or a mapping with its field names
            (``{'q': ..., 'kv_cache': ..., 'indices': ..., 'sinks': ...}``; ``sm_scale`` defaults to
            ``576 ** -0.5``). With DCP, ``kv_cache`` is this rank's shard and ``indices`` hold global ids.
        platform: the platform to plan for (default: detected from the tensors' device). It must
            describe the device the tensors are on.
        path: force a path instead of the table's first match.
        dcp_group: ``torch.distributed`` process group of ``spec.dcp_world_size`` ranks (DCP only).
        dcp_layout: how the pool is sharded over ranks: ``interleaved`` or ``contiguous`` (docs/DCP.md).
        num_kv_rows: global pool size N (DCP only; default: shard rows * world size is NOT assumed).

    Returns:
        ``(out, lse)``: ``out`` ``[T, H, 512]`` in q's dtype (bf16 for fp8 q), written into
        ``inputs.out`` when given; ``lse`` fp32 ``[T, H]``, natural log, sink excluded, ``-inf`` on rows
        with no valid id, returned whenever ``spec.need_lse`` (sinks, DCP or ``return_lse=True``),
        else ``None`` (so the answer never depends on which path ran).

    Raises:
        ValueError: malformed tensors, or tensors that disagree with ``spec`` or ``platform``.
        NoKernelError: no path serves the call on this platform.
    """
    x = as_inputs(inputs)
    if isinstance(spec, CallSpec) and max(x.logit_cap, 0.0) != spec.logit_cap:  # <= 0: no cap (CallSpec stores 0.0)
        if x.logit_cap > 0.0:
            raise ValueError(f"'inputs.logit_cap'={x.logit_cap!r} disagrees with spec.logit_cap={spec.logit_cap!r}")
        x = x._replace(logit_cap=spec.logit_cap)  # the spec chose the path; its cap is the call's cap
    dcp = isinstance(spec, CallSpec) and spec.dcp_world_size > 1
    check_inputs(x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, topk_length=x.topk_length,
                 q_scale=x.q_scale, kv_scale=x.kv_scale, out=x.out, allow_empty_pool=dcp)
    check_spec_matches(spec, x)
    if torch.compiler.is_compiling():
        # traced: the op detects the platform itself; a CPU/GPU mismatch is still refused here (the exact
        # GPU arch needs a device query, which is left to eager calls)
        if platform is not None and (platform.arch == "cpu") != (x.device.type == "cpu"):
            raise ValueError(f"'platform' describes arch {platform.arch!r} but the tensors are on {x.device}")
        if spec.dcp_world_size > 1:
            return _dcp_outside_the_graph(spec, x, platform, path, dcp_group, dcp_layout, num_kv_rows)
        return _run_op(spec, x, path)
    _check_records(spec, platform)
    device_arch = arch_of(x.device)
    if platform is None:
        platform = detect_platform(x.device)
    elif platform.arch != device_arch:
        raise ValueError(
            f"'platform' describes arch {platform.arch!r} but the tensors are on {x.device} (arch {device_arch!r})"
        )
    check_dcp_args(spec.dcp_world_size, dcp_group, dcp_layout, num_kv_rows)
    plan = _cached_plan(spec, platform, path)
    if spec.dcp_world_size > 1:
        from mla_sink.core.dcp_run import run_dcp

        return run_dcp(plan, x, group=dcp_group, layout=dcp_layout, num_kv_rows=num_kv_rows)
    out, lse = launch(plan, x)
    return out, (lse if spec.need_lse else None)


def as_inputs(inputs: Any) -> DecodeInputs:
    """A :class:`DecodeInputs` from itself or from a mapping of its field names.

    Raises:
        ValueError: neither, or the mapping has unknown or missing keys.
    """
    if isinstance(inputs, DecodeInputs):
        return inputs
    if isinstance(inputs, Mapping):
        unknown = set(inputs) - set(DecodeInputs._fields)
        missing = {"q", "kv_cache", "indices"} - set(inputs)
        if unknown or missing:
            raise ValueError(f"'inputs' keys must be among {DecodeInputs._fields} and include q, kv_cache, indices "
                             f"(got unknown {sorted(unknown)}, missing {sorted(missing)})")
        fields = dict(inputs)
        if fields.get("sm_scale") is None:
            fields["sm_scale"] = D_QK ** -0.5
        return DecodeInputs(**fields)
    raise ValueError(f"'inputs' must be a DecodeInputs or a mapping of its fields (got {type(inputs).__name__})")


def _dcp_outside_the_graph(spec, x, platform, path, dcp_group, dcp_layout, num_kv_rows) -> Result:
    """A DCP call met while tracing: run eagerly (a graph break; ``fullgraph=True`` refuses it)."""
    return run(spec, x, platform=platform, path=path, dcp_group=dcp_group, dcp_layout=dcp_layout,
               num_kv_rows=num_kv_rows)


try:  # ``reason`` (shown by fullgraph's refusal) is newer than some supported torch releases
    _dcp_outside_the_graph = torch.compiler.disable(
        _dcp_outside_the_graph, reason="decode context parallel runs collectives: it runs eagerly, outside the graph")
except TypeError:  # pragma: no cover - older torch
    _dcp_outside_the_graph = torch.compiler.disable(_dcp_outside_the_graph)


def _run_op(spec: CallSpec, x: DecodeInputs, path: Optional[str]) -> Result:
    """The traced form of :func:`run`: one custom op, so ``torch.compile`` sees no graph break."""
    return _call_op(x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, x.topk_length, x.q_scale, x.kv_scale,
                    x.out, spec.need_lse, spec.logit_cap, path)


def _call_op(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out,
             return_lse, logit_cap, path) -> Result:
    args = (q, kv_cache, indices, sinks, float(sm_scale), topk_length, q_scale, kv_scale)
    tail = (return_lse, float(logit_cap), path or "")
    if out is not None:
        lse = torch.ops.mla_sink.sparse_mla_decode_out(*args, out, *tail)
    else:
        out, lse = torch.ops.mla_sink.sparse_mla_decode(*args, *tail)
    need_lse = return_lse or sinks is not None
    return out, (lse if need_lse else None)


def sparse_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    *,
    topk_length: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    kv_scale: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    logit_cap: float = 0.0,
    platform: Optional[Platform] = None,
    path: Optional[str] = None,
) -> Result:
    """Sparse MLA decode with optional sinks: the one-call convenience over :func:`run`.

    ``out = sum_j exp(s_j) v_j / (exp(lse) + exp(sink))`` with ``s_j = sm_scale * q.k_j`` over the
    valid ids j of each row and ``lse = log(sum_j exp(s_j))`` (natural log, sink excluded); see
    :mod:`mla_sink.core.reference` for the full semantics.

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 / fp8 (innermost stride 1).
        kv_cache: ``[N, 576]`` one shared KV head, page size 1; value = first 512 columns.
        indices: int32 ``[T, topk]`` global row ids; ``-1`` or any id outside ``[0, N)`` = skip.
        sinks: optional fp32 ``[H]`` natural-log sink logits, not scaled by ``sm_scale``.
        sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]``: use only the first ``topk_length[t]`` ids of row t.
        q_scale, kv_scale: fp32 ``[1]`` dequantisation scales, required for fp8 q / fp8 KV.
        out: optional ``[T, H, 512]`` output buffer.
        return_lse: guarantee the LSE is returned (it is always returned with sinks).
        logit_cap: ``> 0`` soft-caps the scaled logits.
        platform, path: see :func:`run`.

    Returns:
        ``(out, lse)`` as :func:`run`.

    Raises:
        ValueError: malformed input. NoKernelError: no path serves the call here.
    """
    if sm_scale is None:
        sm_scale = D_QK ** -0.5
    sm_scale, logit_cap = call_scalars(sm_scale, return_lse, logit_cap)
    # Validation: describe() and run() in eager mode; the op's real and fake implementations when traced.
    if torch.compiler.is_compiling():  # records are built inside the op (frozen attrs do not trace)
        return _call_op(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out,
                        return_lse, logit_cap, path)
    spec, platform = describe(q, kv_cache, indices, sinks, return_lse=return_lse,
                              logit_cap=logit_cap, platform=platform)
    inputs = DecodeInputs(q=q, kv_cache=kv_cache, indices=indices, sm_scale=sm_scale, sinks=sinks,
                          topk_length=topk_length, q_scale=q_scale, kv_scale=kv_scale, out=out,
                          logit_cap=logit_cap)
    return run(spec, inputs, platform=platform, path=path)

