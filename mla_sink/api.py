"""The entry points: :func:`sparse_mla_decode`, :func:`run` and :func:`prepare`, and the one internal
execute that serves them, the layer (:class:`mla_sink.layer.SparseMLADecode`) and the operators
(:mod:`mla_sink.ops`).

One call goes ``describe -> validate -> select -> plan -> launch -> finalize`` once per call
*signature* (the tensors' shapes, strides, dtypes and devices, the options, the platform): the first
call validates, describes and plans it and prepares the path's runner; every later call with that
signature only re-checks what metadata cannot show (``out`` overlapping an input, tensors that
require grad) and launches. Semantics: :mod:`mla_sink.core.reference`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Optional

import torch

from mla_sink.core.describe import spec_for_tensors, spec_of
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan, build_plan
from mla_sink.core.platform import arch_of, detect_platform
from mla_sink.core.dtypes import DTYPE_KEYS, kv_dtype_key, out_dtype_for
from mla_sink.core.records import D_QK, D_V, CallSpec, Platform, check_platform, check_spec
from mla_sink.core.trace import has_no_data, tracing
from mla_sink.core.validate import (
    FP32_SCALE_MAX,
    FP32_TINY,
    call_scalars,
    check_call_kinds,
    check_inputs,
    check_out_overlaps,
    check_sinks,
    check_sm_scale,
    grad_inputs,
    no_backward_error,
)

Result = tuple[torch.Tensor, Optional[torch.Tensor]]


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
        spec: the call description (:class:`CallSpec`; its fields were validated when it was built).
        platform: where it will run (:class:`Platform`; default: detected from the device of ``sinks`` when given,
            else this machine's current device).
        path: force a path (a path name of ``tables/mla_decode.yaml``; only rows naming it are considered,
            ``'reference'`` is always honoured); ``None``: the table's first match.
        sinks: the layer's fp32 ``[H]`` sinks (natural-log units, not scaled by ``sm_scale``), checked now
            (dtype, shape, device kind) if given; any stride.
        sm_scale: the score scale, checked now if given: a real in ``[2^-126, 2^126]``.

    Returns:
        The token-free :class:`LaunchPlan` (path and row, ``num_tokens=None``, ``launch=None``) every call of this
        configuration runs; the per-token-count launch is planned (and cached) at the first call with that count.
        On an AITER path the call is also planned once for one token, so its planner's refusals come now.

    Raises:
        ValueError: ``spec`` not a :class:`CallSpec` or ``platform`` neither ``None`` nor a :class:`Platform`;
            ``sinks`` malformed (not a tensor, not fp32, not ``[H]``), on a device of another kind than the
            platform's (a GPU platform needs CUDA/ROCm sinks) or on a CUDA device this machine lacks, or given
            while ``spec.sinks`` is False; ``sm_scale`` not a real in ``[2^-126, 2^126]``; ``path`` not a path of
            the table; on an AITER path, a call its planner refuses
            (:func:`mla_sink.paths.aiter.plan.plan_aiter`).
        NoKernelError: the rule table refuses the call on this platform, or no row accepts it (or the forced
            ``path``).
    """
    _check_records(spec, platform)
    if sinks is not None:  # checked before its device is read (a list of floats gave an AttributeError)
        if not spec.sinks:
            raise ValueError("'sinks' given but spec.sinks is False; build the spec with sinks=True")
        check_sinks(sinks, spec.num_heads)
    if platform is None:
        platform = detect_platform(sinks.device, tensor="sinks") if sinks is not None else detect_platform()
    if sinks is not None:
        want = "cpu" if platform.arch == "cpu" else "cuda"
        if sinks.device.type != want:
            raise ValueError(f"'sinks' must be on a {want} device for platform arch {platform.arch!r} "
                             f"(got {sinks.device})")
    if sm_scale is not None:
        check_sm_scale(sm_scale)
    plan = build_plan(spec, platform, path=path)
    if plan.path.startswith("aiter"):
        # Plan the AITER call now on a one-token shape: whatever its planner rejects (malformed params, a
        # path without LSE for a call that needs one) is rejected at construction, not at the first forward.
        build_plan(spec, platform, num_tokens=1, path=path)
    return plan


def _check_records(spec: Any, platform: Any, *, spec_given: bool = True) -> None:
    if spec_given:
        check_spec(spec)
    check_platform(platform, optional=True)


def check_dcp_args(dcp_world_size: int, dcp_group: Any, dcp_layout: Any,
                   num_kv_rows: Any) -> Optional[tuple[int, int]]:
    """Check the decode-context-parallel arguments of :func:`run` / the layer, before any collective.

    Returns:
        ``(world_size, rank)`` of ``dcp_group`` with DCP (``dcp_world_size > 1``), ``None`` without.

    Raises:
        ValueError: a layout other than ``interleaved``/``contiguous``; a group or ``num_kv_rows``
            given with ``dcp_world_size == 1``; with DCP, a missing group, a group that is not a
            process group of ``dcp_world_size`` ranks this rank belongs to, or ``num_kv_rows`` not an
            int >= 1.
    """
    from mla_sink.core.dcp import LAYOUTS, group_size_rank

    if dcp_layout not in LAYOUTS:
        raise ValueError(f"'dcp_layout' must be in {LAYOUTS} (got {dcp_layout!r})")
    if dcp_world_size == 1:
        for name, given in (("dcp_group", dcp_group), ("num_kv_rows", num_kv_rows)):
            if given is not None:
                raise ValueError(f"'{name}' must be None when dcp_world_size == 1, the call being on one rank's whole "
                                 f"pool (got {given!r}); pass dcp_world_size=W for a pool sharded over W ranks")
        return None
    if dcp_group is None:
        raise ValueError(f"'dcp_group' is required when dcp_world_size={dcp_world_size}")
    if isinstance(num_kv_rows, bool) or not isinstance(num_kv_rows, int) or num_kv_rows < 1:
        raise ValueError(f"'num_kv_rows' (the global pool size N) must be an int >= 1 with DCP (got {num_kv_rows!r})")
    size, rank = group_size_rank(dcp_group, "dcp_group", none_allowed=False)
    if size != dcp_world_size:
        raise ValueError(f"'dcp_group' has {size} ranks but dcp_world_size={dcp_world_size}")
    return size, rank


def check_spec_matches(spec: CallSpec, x: DecodeInputs) -> None:
    """Check that the tensors are those the spec describes (all but ``kv_rows_packed``, ``gather_aligned``,
    ``unit_rows`` and ``kv_cache_bytes``, which the tensors decide: :func:`mla_sink.core.describe.spec_for_tensors`).

    Raises:
        ValueError: q or kv_cache dtype, head count ``H``, ``topk``, sinks presence or ``logit_cap``
            differ from ``spec`` (message names the field, the tensors' value and the spec's).
    """
    got = {  # field: (the argument it comes from, its value there)
        "q_dtype": ("q", DTYPE_KEYS.get(x.q.dtype)),
        "kv_dtype": ("kv_cache", kv_dtype_key(x.kv_cache)),
        "num_heads": ("q", x.q.shape[1]),
        "topk": ("indices", x.indices.shape[1]),
        "sinks": ("sinks", x.sinks is not None),
        "logit_cap": ("logit_cap", max(x.logit_cap, 0.0)),
    }
    for name, (arg, value) in got.items():
        if getattr(spec, name) != value:
            raise ValueError(_mismatch_text(spec, [(name, arg, value)]))


def _mismatch_text(spec: CallSpec, mismatches: list) -> str:
    """The message of :func:`check_spec_matches` and :func:`check_dtypes_match`: each ``(field, argument, value)``
    named with the spec's value, then what the tensors must be."""
    named = "; ".join(f"'{arg}' gives {name}={value!r} but spec.{name}={getattr(spec, name)!r}"
                      for name, arg, value in mismatches)
    return f"{named} (the tensors must be those the spec, or the layer, was built for)"


def check_dtypes_match(spec: CallSpec, x: DecodeInputs) -> None:
    """Check, before the per-dtype input checks, that ``q`` and ``kv_cache`` are of the spec's dtypes, so that a
    tensor of another dtype is named as such (a layer built for ``fp8_ds_mla`` given an e4m3 cache would otherwise
    be told that its ``kv_scale`` is missing, and one built for bf16 given fp16 q and an fp16 cache that the cache
    alone differs); both are named when both differ. A q dtype with no key is left to
    :func:`mla_sink.core.validate.check_inputs`, which lists the allowed ones.

    Raises:
        ValueError: ``q``'s dtype key is not ``spec.q_dtype``, or ``kv_cache``'s
            (:func:`mla_sink.core.dtypes.kv_dtype_key`, which also refuses unknown dtypes and uint8 rows of no
            known size) is not ``spec.kv_dtype``.
    """
    mismatches = []
    if isinstance(x.q, torch.Tensor):
        q_key = DTYPE_KEYS.get(x.q.dtype)
        if q_key is not None and q_key != spec.q_dtype:
            mismatches.append(("q_dtype", "q", q_key))
    if isinstance(x.kv_cache, torch.Tensor):
        kv_key = kv_dtype_key(x.kv_cache)
        if kv_key != spec.kv_dtype:
            mismatches.append(("kv_dtype", "kv_cache", kv_key))
    if mismatches:
        raise ValueError(_mismatch_text(spec, mismatches))


def as_inputs(inputs: Any) -> DecodeInputs:
    """A checked :class:`DecodeInputs` from itself or from a mapping of its field names.

    Scalars are checked as the function checks them (``sm_scale`` a finite real in its bounds, default
    ``576 ** -0.5``; ``logit_cap`` a finite real, ``<= 0`` = no cap); tensors are checked by the call.

    Raises:
        ValueError: neither a DecodeInputs nor a mapping, unknown or missing keys, or a bad scalar.
    """
    if isinstance(inputs, Mapping):
        unknown = set(inputs) - set(DecodeInputs._fields)
        missing = {"q", "kv_cache", "indices"} - set(inputs)
        if unknown or missing:
            raise ValueError(f"'inputs' keys must be among {DecodeInputs._fields} and include q, kv_cache, indices "
                             f"(got unknown {sorted(unknown)}, missing {sorted(missing)})")
        fields = dict(inputs)
        if fields.get("sm_scale") is None:
            fields["sm_scale"] = D_QK ** -0.5
        inputs = DecodeInputs(**fields)
    if not isinstance(inputs, DecodeInputs):
        raise ValueError(f"'inputs' must be a DecodeInputs or a mapping of its fields (got {type(inputs).__name__})")
    sm_scale = D_QK ** -0.5 if inputs.sm_scale is None else inputs.sm_scale
    try:
        sm_scale, logit_cap = call_scalars(sm_scale, False, inputs.logit_cap)
    except ValueError as e:  # name the field as the caller wrote it
        hint = ""
        if isinstance(sm_scale, torch.Tensor):  # DecodeInputs(q, kv, idx, sinks): its 4th field is sm_scale, where
            # sparse_mla_decode's 4th argument is sinks (a break test, sixty-third session)
            hint = (" - DecodeInputs takes (q, kv_cache, indices, sm_scale, sinks, ...), sm_scale before sinks "
                    "unlike sparse_mla_decode's arguments: pass sinks=... by name")
        raise ValueError(str(e).replace("'sm_scale'", "'inputs.sm_scale'")
                         .replace("'logit_cap'", "'inputs.logit_cap'") + hint) from None
    if sm_scale is not inputs.sm_scale or logit_cap is not inputs.logit_cap:
        inputs = inputs._replace(sm_scale=sm_scale, logit_cap=logit_cap)
    return inputs


def run(
    spec: CallSpec,
    inputs: Any,
    *,
    platform: Optional[Platform] = None,
    path: Optional[str] = None,
    dcp_group: Any = None,
    dcp_layout: str = "interleaved",
    num_kv_rows: Optional[int] = None,
) -> Result:
    """Run one sparse MLA decode call described by ``spec``.

    Args:
        spec: the call description (see :func:`mla_sink.core.describe.describe`); its ``need_lse`` decides
            whether an LSE is returned.
        inputs: the tensors: a :class:`DecodeInputs`, or a mapping with its field names
            (``{'q': ..., 'kv_cache': ..., 'indices': ..., 'sinks': ...}``; ``sm_scale`` defaults to
            ``576 ** -0.5``). Shapes, dtypes and sentinels as :func:`sparse_mla_decode`. With DCP, ``kv_cache`` is
            this rank's shard and ``indices`` hold global ids.
        platform: the platform to plan for (default: detected from the tensors' device). It must
            describe the device the tensors are on.
        path: force a path instead of the table's first match.
        dcp_group: ``torch.distributed`` process group of ``spec.dcp_world_size`` ranks (DCP only).
        dcp_layout: how the pool is sharded over ranks: ``interleaved`` or ``contiguous`` (docs/DCP.md); checked but
            without effect when ``dcp_world_size == 1`` (one rank holds the whole pool either way), where a
            ``dcp_group`` or ``num_kv_rows`` is refused.
        num_kv_rows: global pool size N (DCP only).

    Returns:
        ``(out, lse)``: ``out`` ``[T, H, 512]`` in q's dtype (bf16 for fp8 q), written into
        ``inputs.out`` when given; ``lse`` fp32 ``[T, H]``, natural log, sink excluded, ``-inf`` on rows
        with no valid id, returned whenever ``spec.need_lse`` (sinks, DCP or ``return_lse=True``),
        else ``None`` (so the answer never depends on which path ran).

    Raises:
        ValueError: ``spec`` not a :class:`CallSpec` or ``platform`` neither ``None`` nor a :class:`Platform`;
            ``inputs`` neither a :class:`DecodeInputs` nor a mapping of its fields (unknown or missing keys);
            malformed tensors or scalars (as :func:`sparse_mla_decode`); tensors that disagree with ``spec``
            (dtypes, ``H``, ``topk``, sinks present or not; ``spec.kv_rows_packed``, ``gather_aligned``,
            ``unit_rows`` and ``kv_cache_bytes`` are not compared: the call is planned for its tensors' strides and
            size) or a positive
            ``inputs.logit_cap`` other than ``spec.logit_cap``; ``platform`` describing another arch than the tensors'
            device; an input that requires grad in grad mode (no backward); ``path`` not a path of the table. With DCP,
            before the call's exchange: the DCP arguments (:func:`check_dcp_args`) and a shard or ids that disagree
            with ``num_kv_rows`` and ``dcp_layout`` (:func:`mla_sink.core.dcp.dcp_sparse_mla_decode`); a rank that
            refuses a DCP call still joins its exchange, so the other ranks return NaN (LSE +inf) instead of waiting
            (:func:`mla_sink.core.dcp.join_refused_call`); without DCP, a
            ``dcp_group`` or ``num_kv_rows`` given, or a ``dcp_layout`` that is not a layout name.
        NoKernelError: no path serves the call on this platform (the message is the full explanation).
    """
    _check_records(spec, platform)
    x = as_inputs(inputs)
    if x.logit_cap > 0.0 and x.logit_cap != spec.logit_cap:
        raise ValueError(f"'inputs.logit_cap'={x.logit_cap!r} disagrees with spec.logit_cap={spec.logit_cap!r}")
    x = x._replace(logit_cap=spec.logit_cap)  # <= 0 means no cap; the spec chose the path, its cap is the call's
    if spec.dcp_world_size > 1:
        return execute_dcp(x, spec=spec, platform=platform, path=path, dcp_group=dcp_group, dcp_layout=dcp_layout,
                           num_kv_rows=num_kv_rows)
    if dcp_group is not None or num_kv_rows is not None or dcp_layout != "interleaved":
        check_dcp_args(1, dcp_group, dcp_layout, num_kv_rows)
    return execute(x, spec=spec, need_lse=spec.need_lse, platform=platform, path=path)


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
    """Sparse MLA decode with optional sinks, in one call.

    ``out = sum_j exp(s_j) v_j / (exp(lse) + exp(sink))`` with ``s_j = sm_scale * q.k_j`` over the
    valid ids j of each row and ``lse = log(sum_j exp(s_j))`` (natural log, sink excluded); see
    :mod:`mla_sink.core.reference` for the full semantics.

    Args:
        q: ``[T, H, 576]`` (``d_qk`` = 512 latent + 64 RoPE columns), bf16, fp16, ``torch.float8_e4m3fn``
            (``fp8_e4m3``) or ``torch.float8_e4m3fnuz`` (``fp8_e4m3fnuz``); innermost stride 1, any token and head
            strides. ``T >= 0``, ``H >= 1``.
        kv_cache: ``[N, 576]``, ``N >= 1``, one shared KV head, page size 1, innermost stride 1 (any row stride: a
            cache whose rows are not packed, e.g. a view of rows of 640, is not taken by AITER, whose paths the rule
            table then skips: ``mla-sink explain --no-kv-rows-packed``); value = first
            ``d_v = 512`` columns. Its dtype pairs with q's: q's own dtype, a half q with either fp8 format, or fp8 q
            with KV of the same fp8 format. Or the 656-byte V3.2 FP8 layout (``fp8_ds_mla``,
            :mod:`mla_sink.core.kv_layout`): uint8 ``[N, 656]`` or paged ``[num_blocks, block_size, 656]`` (ids
            ``block * block_size + offset``; the 656 bytes of a row contiguous, the rows of a block contiguous,
            data pointer and row / block strides multiples of 4 bytes), with bf16/fp16 q and no ``kv_scale``
            (:func:`mla_sink.quantize_kv_cache` writes one).
        indices: int32 ``[T, topk]``, ``1 <= topk <= 2^30``, global row ids; ``-1`` or any id outside
            ``[0, N)`` = skip, wherever it sits in the row; a duplicated id counts once per occurrence.
        sinks: optional fp32 ``[H]``, any stride: one sink logit per head, natural-log units, not scaled by
            ``sm_scale`` (``-inf`` changes nothing, ``+inf`` gives zeros; a NaN sink is not checked, which would
            read it back from the device: that head's ``out`` is NaN on rows with a valid id and 0 on empty rows,
            its ``lse`` unaffected, as in the float64 reference).
        sm_scale: multiplies ``q.k`` before the natural-exp softmax; a real in ``[2^-126, 2^126]``; default
            ``576 ** -0.5``.
        topk_length: optional int32 ``[T]``: use only the first ``topk_length[t]`` ids of row t (values are
            clamped to ``[0, topk]``: ``<= 0`` uses no id, ``>= topk`` every id).
        q_scale, kv_scale: fp32 ``[1]`` or ``[]`` per-tensor dequantisation scales (value = stored * scale),
            required exactly for fp8 q / fp8 KV (``kv_scale`` None for ``fp8_ds_mla``, whose scales are in its
            rows); on q's device.
        out: optional ``[T, H, 512]`` output buffer in the output dtype (q's dtype; bf16 for fp8 q), innermost
            stride 1, no overlap with itself or any input, not requiring grad; written in place and returned.
        return_lse: return the LSE even without sinks (it is always returned with sinks).
        logit_cap: ``> 0`` soft-caps the scaled scores, ``s = logit_cap * tanh(s / logit_cap)``, and must then
            lie in ``[2^-126, 2^126]``; a finite ``<= 0`` means no cap (default ``0.0``).
        platform, path: see :func:`run`.

    Returns:
        ``(out, lse)`` as :func:`run`: ``out`` ``[T, H, 512]`` in q's dtype (bf16 for fp8 q); ``lse`` fp32
        ``[T, H]``, natural log, sink excluded, ``-inf`` on a row with no valid id (where ``out`` is 0), or
        ``None`` when neither ``sinks`` nor ``return_lse`` asks for it.

    Raises:
        ValueError: naming the argument, before any kernel runs: a tensor of the wrong shape, dtype, strides or
            device (every tensor on q's device, a cpu or cuda one; ``meta`` only for shape inference, through the
            operator); a (q, kv_cache) dtype pair not allowed; a missing or superfluous ``q_scale`` / ``kv_scale``;
            ``sm_scale`` or a positive ``logit_cap`` outside ``[2^-126, 2^126]`` (or not a finite real);
            ``return_lse`` not a bool; an ``out`` that overlaps itself or an input, or an inference tensor (made
            under ``torch.inference_mode()``) while the call runs outside inference mode; a tensor not of q's kind
            (beside a ``q`` with data, a tensor without data, ``meta`` or a ``FakeTensor``; beside a ``q`` without
            data, one with data or a ``FakeTensor`` of another mode); an input that requires grad in grad mode (the
            decode has no backward); ``platform`` not a :class:`Platform` or describing another
            arch than the tensors'; ``path`` not a path of the table.
        NoKernelError: no path serves the call here (the message is the full explanation ``mla-sink explain``
            prints).

    Under ``torch.compile`` the call is the operator ``torch.ops.mla_sink.sparse_mla_decode`` (or ``..._out``),
    and the errors above surface while tracing, wrapped by Dynamo.

    Source: docs/DESIGN.md "The operation" (the definition; README "Semantics" for non-finite inputs and the fp32
    kernels' numeric limits); the sink formula of FlashMLA ``flash_mla/flash_mla_interface.py``; the kernel path
    is the rule table's (``tables/mla_decode.yaml``, ``mla-sink explain``).
    """
    if sm_scale is None:
        sm_scale = D_QK ** -0.5
    # under torch.compile's tracing a float is symbolic and comparing a NaN one raises in the tracer: call_scalars
    # leaves its range to the operator's real implementation; eagerly the common case is checked inline (hot path)
    compiling = tracing()
    if compiling or not (type(sm_scale) is float and type(logit_cap) is float and type(return_lse) is bool
                         and FP32_TINY <= sm_scale <= FP32_SCALE_MAX
                         and (-math.inf < logit_cap <= 0.0 or FP32_TINY <= logit_cap <= FP32_SCALE_MAX)):
        sm_scale, logit_cap = call_scalars(sm_scale, return_lse, logit_cap)
    x = DecodeInputs(q, kv_cache, indices, sm_scale, sinks, topk_length, q_scale, kv_scale, out, logit_cap)
    if compiling:
        return _traced(x, None, return_lse, platform, path)
    return _execute_eager(x, None, return_lse, platform, path)


# ---- the one execute -----------------------------------------------------------------------------

class _Prepared(NamedTuple):
    """What the first call of a signature settled: its plan and the path's runner."""

    plan: LaunchPlan
    run: Callable[[DecodeInputs], Result]
    need_lse: bool


_PREPARED: dict = {}
#: signatures kept; the table is cleared beyond this (eager calls with ever new shapes)
MAX_PREPARED = 4096
_PREPARED_LOCK = threading.Lock()
#: DCP calls prepared per signature and DCP arguments (:func:`execute_dcp`): their rank-local decode.
_PREPARED_DCP: dict = {}


def _find_prepared(cache: dict, x: DecodeInputs, *options: Any) -> tuple:
    """``(key, prepared)``: the key of ``x``'s signature with ``options`` in ``cache`` (:data:`_PREPARED` or
    :data:`_PREPARED_DCP`) and what it holds there, or ``None`` for a signature not prepared yet. ``(None, None)``
    where there is no key (not dense tensors, or unhashable options: the full checks say what is wrong); the entry
    is not used for a call with a freed storage (:meth:`DecodeInputs.has_freed_storage`: a new tensor of a known
    signature, which the full checks name)."""
    try:
        key = (x.signature(), *options, torch.is_grad_enabled())
        prepared = cache.get(key)
    except (AttributeError, TypeError, RuntimeError):
        return None, None
    if prepared is not None and x.has_freed_storage():
        prepared = None
    return key, prepared


def _keep_prepared(cache: dict, key: Any, value: Any) -> None:
    """Remember ``value`` under ``key`` in ``cache`` (:data:`_PREPARED` or :data:`_PREPARED_DCP`), clearing the
    cache first once it holds :data:`MAX_PREPARED` signatures (eager calls with ever new shapes)."""
    with _PREPARED_LOCK:
        if len(cache) >= MAX_PREPARED:
            cache.clear()
        cache[key] = value


def forget_prepared_calls() -> None:
    """Drop every prepared call (after a kernel failed to compile: later calls re-plan)."""
    with _PREPARED_LOCK:
        _PREPARED.clear()
        _PREPARED_DCP.clear()


def without_data_like(like: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` (a tensor with data) as a tensor without data of the same kind as ``like`` (for which
    :func:`has_no_data` holds): a meta tensor for a meta ``like``, else a FakeTensor of ``like``'s
    ``FakeTensorMode`` (on ``t``'s device), detached. Same shape, dtype and strides; no data is copied. Used by the
    layer, whose sinks live on its device, when it is called on tensors without data for shape inference."""
    if like.is_meta:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # a real tensor's detach, outside the mode (which refuses real tensors)
        t = t.detach()
    return like.fake_mode.from_tensor(t)


def refuse_jit_trace() -> None:
    """Raises ValueError under ``torch.jit.trace`` (about 0.14 us a call): it records the tensors' sizes as tensors,
    which the first call's checks met as ``'num_heads' must be an int (got tensor(8))``, and a prepared call's kernel
    launch is not an op it can record (a break test, sixty-third session). ``torch.compile`` and ``torch.export``
    trace the decode as one operator."""
    if torch.jit.is_tracing():
        raise ValueError("mla-sink cannot be traced by torch.jit.trace (its kernel launch is not an op the trace can "
                         "record): use torch.compile or torch.export, which trace the decode as one operator")


def execute(x: DecodeInputs, *, spec: Optional[CallSpec], need_lse: bool, platform: Optional[Platform],
            path: Optional[str]) -> Result:
    """The one execute behind the function, the layer and the operators (not DCP: :func:`run` does that).

    Args:
        x: the call's tensors, scalars already checked (:func:`as_inputs` / :func:`call_scalars`).
        spec: the layer's or :func:`run`'s record, checked against the tensors; ``None`` derives it.
        need_lse: the caller asked for the LSE (sinks imply it).
        platform: the platform to plan for (default: the tensors' device). path: a forced path.

    Returns:
        ``(out, lse)`` as :func:`run`.

    Raises:
        ValueError: malformed tensors, or tensors that disagree with ``spec`` / ``platform``.
        NoKernelError: no path serves the call.
    """
    if tracing():
        return _traced(x, spec, need_lse, platform, path)
    return _execute_eager(x, spec, need_lse, platform, path)


def _execute_eager(x: DecodeInputs, spec: Optional[CallSpec], need_lse: bool, platform: Optional[Platform],
                   path: Optional[str]) -> Result:
    """:func:`execute` outside torch.compile's tracing: the prepared runner of the call's signature (prepared on
    its first call), or the operator for tensors without data (meta, fake). Refused under ``torch.jit.trace``."""
    refuse_jit_trace()
    if has_no_data(x.q):
        check_call_kinds(x)  # every tensor without data of q's kind, before the operator meets a mix
        return _traced(x, spec, need_lse, platform, path)
    key, prepared = _find_prepared(_PREPARED, x, need_lse, spec, platform, path)
    if prepared is None:
        prepared = _prepare_call(x, spec, need_lse, platform, path)
        if key is not None:
            _keep_prepared(_PREPARED, key, prepared)
    elif x.out is not None:
        check_out_overlaps(x)  # data pointers: not part of the signature
    out, lse = prepared.run(x)
    return out, (lse if prepared.need_lse else None)


def _prepare_call(x: DecodeInputs, spec: Optional[CallSpec], need_lse: bool, platform: Optional[Platform],
                  path: Optional[str]) -> _Prepared:
    """validate -> describe -> select -> plan -> the path's runner, for the first call of a signature."""
    _check_records(spec, platform, spec_given=spec is not None)
    if spec is not None:
        check_dtypes_match(spec, x)
    check_inputs(x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, topk_length=x.topk_length, q_scale=x.q_scale,
                 kv_scale=x.kv_scale, out=x.out)
    if spec is None:
        spec = spec_of(x, need_lse=need_lse)
    else:
        check_spec_matches(spec, x)
        spec = spec_for_tensors(spec, x)  # the stride facts are the tensors' (tensor_facts)
    platform = _platform_of(x, platform)
    from mla_sink.paths import prepare_runner

    plan = build_plan(spec, platform, num_tokens=x.q.shape[0], path=path)
    return _Prepared(plan=plan, run=prepare_runner(plan, x), need_lse=spec.need_lse)


def _platform_of(x: DecodeInputs, platform: Optional[Platform]) -> Platform:
    """The platform a call plans for: the tensors' device's (detected), or the given one, which must
    describe that device (its SM count is read from the device when the record leaves it open)."""
    device_arch = arch_of(x.q.device)
    if platform is None:
        return detect_platform(x.q.device)
    if platform.arch != device_arch:
        raise ValueError(f"'platform' describes arch {platform.arch!r} but the tensors are on {x.q.device} "
                         f"(arch {device_arch!r})")
    if platform.num_sms is None:
        import attrs

        platform = attrs.evolve(platform, num_sms=detect_platform(x.q.device).num_sms)
    return platform


def execute_dcp(x: DecodeInputs, *, spec: CallSpec, platform: Optional[Platform], path: Optional[str],
                dcp_group: Any, dcp_layout: str, num_kv_rows: Optional[int]) -> Result:
    """The DCP execute behind :func:`run` and a DCP layer (``spec.dcp_world_size > 1``; ``x``'s scalars already
    checked and its ``logit_cap`` the spec's, as :func:`run` and the layer make them). DCP: validate, plan and
    prepare the rank-local decode on the first call of a signature (with these DCP
    arguments; later ones reuse it, as :func:`execute` does), then run this rank's shard and merge over the group
    (collectives: eager only). The merge checks each call's shard and ids itself, before any collective; a check
    that fails on this rank still joins the call's exchange before it raises (:func:`mla_sink.core.dcp.
    join_refused_call`), so the other ranks do not wait. Tensors
    without data (meta, fake: shape inference) are checked as a first call's and get outputs without data of the
    merged shapes, with no kernel and no collective (:func:`_dcp_shapes`)."""
    if tracing():
        return _dcp_outside_the_graph(spec, x, platform, path, dcp_group, dcp_layout, num_kv_rows)
    refuse_jit_trace()
    from mla_sink.core.dcp_run import local_decode_fp32, run_dcp

    key, local = _find_prepared(_PREPARED_DCP, x, spec, platform, path, dcp_group, dcp_layout, num_kv_rows)
    try:  # a check that fails on this rank only (its shard, its out) still joins the call's exchange
        if local is not None:
            if x.out is not None:
                check_out_overlaps(x)  # per call, as _execute_eager: not part of the signature
        else:
            check_dtypes_match(spec, x)
            check_inputs(x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, topk_length=x.topk_length,
                         q_scale=x.q_scale, kv_scale=x.kv_scale, out=x.out, allow_empty_pool=True)
            check_spec_matches(spec, x)
            size_rank = check_dcp_args(spec.dcp_world_size, dcp_group, dcp_layout, num_kv_rows)
            if has_no_data(x.q):  # a DCP layer's or run()'s shape inference (a break test, forty-sixth session: it
                # prepared the Triton runner for meta tensors, which asked the CUDA runtime for a device)
                from mla_sink.core.dcp import check_shard

                check_call_kinds(x)
                check_shard(x, num_kv_rows, *size_rank, dcp_layout)
                return _dcp_shapes(x)
            spec = spec_for_tensors(spec, x)  # the stride facts are the tensors' (tensor_facts)
            local = local_decode_fp32(build_plan(spec, _platform_of(x, platform), num_tokens=x.q.shape[0],
                                                 path=path))
            if key is not None:
                _keep_prepared(_PREPARED_DCP, key, local)
    except Exception as error:
        from mla_sink.core.dcp import join_refused_call

        join_refused_call(x.q, dcp_group, error)
        raise
    return run_dcp(local, x, group=dcp_group, layout=dcp_layout, num_kv_rows=num_kv_rows,
                   dcp_world_size=spec.dcp_world_size)


def _dcp_shapes(x: DecodeInputs) -> Result:
    """The outputs of a checked DCP call on tensors without data: ``out`` ``[T, H, 512]`` in the output dtype
    (``x.out`` when given) and fp32 ``lse`` ``[T, H]``, both without data like q (meta, or fake in q's mode)."""
    T, H = x.q.shape[0], x.q.shape[1]
    out = x.out if x.out is not None else x.q.new_empty((T, H, D_V), dtype=out_dtype_for(DTYPE_KEYS[x.q.dtype]))
    return out, x.q.new_empty((T, H), dtype=torch.float32)


def _dcp_outside_the_graph(spec, x, platform, path, dcp_group, dcp_layout, num_kv_rows) -> Result:
    """A DCP call met while tracing: run eagerly (a graph break; ``fullgraph=True`` refuses it)."""
    return run(spec, x, platform=platform, path=path, dcp_group=dcp_group, dcp_layout=dcp_layout,
               num_kv_rows=num_kv_rows)


try:  # ``reason`` (shown by fullgraph's refusal) is newer than some supported torch releases
    _dcp_outside_the_graph = torch.compiler.disable(
        _dcp_outside_the_graph, reason="decode context parallel runs collectives: it runs eagerly, outside the graph")
except TypeError:  # pragma: no cover - older torch
    _dcp_outside_the_graph = torch.compiler.disable(_dcp_outside_the_graph)


def _traced(x: DecodeInputs, spec: Optional[CallSpec], need_lse: bool, platform: Optional[Platform],
            path: Optional[str]) -> Result:
    """The traced form of a call: one custom op, so ``torch.compile`` sees no graph break. The op
    validates in its fake and real implementations; the CPU/GPU kind of ``platform`` is checked here
    (the exact GPU arch needs a device query, left to eager calls). Meta tensors (shape inference: no kernel runs)
    match any platform, so a layer built for a device also infers shapes on meta."""
    if platform is not None and x.q.device.type != "meta" and (platform.arch == "cpu") != (x.q.device.type == "cpu"):
        raise ValueError(f"'platform' describes arch {platform.arch!r} but the tensors are on {x.q.device}: pass the "
                         f"platform of the tensors' device (mla_sink.core.platform.detect_platform), or None")
    if x.out is not None and torch.is_grad_enabled():  # the out operator mutates: PyTorch takes no autograd formula
        # for it, so the out-of-place operator's refusal (mla_sink.ops) is made here, while tracing
        grads = grad_inputs(x.q, x.kv_cache, x.sinks, x.q_scale, x.kv_scale)
        if grads:
            raise no_backward_error(grads)
    if spec is not None:
        check_spec_matches(spec, x)
        need_lse = spec.need_lse
    return _call_op(x, need_lse, path)


def _call_op(x: DecodeInputs, need_lse: bool, path: Optional[str]) -> Result:
    args = (x.q, x.kv_cache, x.indices, x.sinks, float(x.sm_scale), x.topk_length, x.q_scale, x.kv_scale)
    tail = (need_lse, float(x.logit_cap), path or "")
    if x.out is not None:
        lse = torch.ops.mla_sink.sparse_mla_decode_out(*args, x.out, *tail)
        out = x.out
    else:
        out, lse = torch.ops.mla_sink.sparse_mla_decode(*args, *tail)
    return out, (lse if (need_lse or x.sinks is not None) else None)


from mla_sink import ops  # noqa: E402,F401  (registers torch.ops.mla_sink.*; ops calls execute)
