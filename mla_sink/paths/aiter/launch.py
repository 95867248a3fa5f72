"""Run an AITER path: plan -> buffers -> ``aiter.mla.mla_decode_fwd`` -> finalize.

AITER is imported lazily, only when a call runs without an explicit ``impl``; importing
``mla_sink`` never imports AITER. Tests pass a contract fake as ``impl``.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
from typing import Any, Optional, Protocol

import torch

from mla_sink.core.dtypes import TORCH_DTYPES, dtype_key
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.kv_layout import rows_packed, span_bytes
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_V
from mla_sink.core.select import path_requirement_failures
from mla_sink.paths.aiter.buffers import AiterBuffers, allocate_buffers, fill_kv_buffers
from mla_sink.paths.aiter.chunks import AiterChunkedCall, AiterLaunch, plan_aiter_launch
from mla_sink.paths.aiter.finalize import finalize_aiter
from mla_sink.paths.aiter.plan import (
    AITER_PATHS,
    IS_CAUSAL,
    IS_SPARSE,
    MAX_SEQLEN_Q,
    NUM_KV_HEADS,
    PAGE_SIZE,
    AiterCall,
    AiterPersistentCall,
    PersistentMetadata,
    plan_aiter,
    with_meta_param,
)

#: Names of the six persistent metadata buffers, in the order ``get_mla_metadata_info_v1`` returns them.
METADATA_NAMES = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map",
                  "reduce_partial_map")


class AiterImpl(Protocol):
    """What :func:`launch_aiter` needs from AITER (the real module or a test fake).

    Source: ROCm/aiter ``aiter/mla.py`` (``mla_decode_fwd``, ``get_meta_param``) and
    ``aiter/ops/attention.py`` (``get_mla_metadata_info_v1``, ``get_mla_metadata_v1``, exported as
    ``aiter.get_mla_metadata_info_v1`` / ``aiter.get_mla_metadata_v1``).
    """

    def mla_decode_fwd(self, q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                       max_seqlen_q, **kwargs) -> tuple[Any, Optional[torch.Tensor]]: ...

    def get_meta_param(self, num_kv_splits, bs, total_kv, nhead, max_seqlen_q, dtype) -> tuple[int, Any]: ...

    def get_mla_metadata_info_v1(self, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype,
                                 is_sparse, **kwargs) -> tuple: ...

    def get_mla_metadata_v1(self, *args, **kwargs) -> None: ...


@functools.lru_cache(maxsize=1)
def load_aiter_impl() -> AiterImpl:
    """The real AITER entry points, imported on first use and cached (one object per process, so the
    workspace keyed by it is reused across calls).

    Raises:
        RuntimeError: AITER is not importable on this machine (the message carries the import error).
    """
    try:
        import aiter  # noqa: F401
        import aiter.mla as aiter_mla
    except Exception as exc:  # ImportError, or AITER failing to load its kernels off ROCm
        raise RuntimeError(f"AITER not importable: {type(exc).__name__}: {exc}") from exc
    return types.SimpleNamespace(
        mla_decode_fwd=aiter_mla.mla_decode_fwd,
        get_meta_param=aiter_mla.get_meta_param,
        get_mla_metadata_info_v1=aiter.get_mla_metadata_info_v1,
        get_mla_metadata_v1=aiter.get_mla_metadata_v1,
    )


class AiterWorkspace:
    """Per-shape device buffers of AITER calls, allocated once and reused (stable pointers for graphs).

    Holds, per ``(call.buffer_key(), device)``: the :class:`~.buffers.AiterBuffers`, the padded-q and
    ``o`` scratch, and for persistent calls the six metadata buffers sized by
    ``impl.get_mla_metadata_info_v1``; and, per unresolved call (:attr:`AiterCall.needs_meta_param`),
    device and ``impl``, the call resolved with AITER's split heuristic. The library's calls (the function, the
    layer, the operators, DCP) share the process-wide default that :func:`launch_aiter` uses when given none. A
    lock per buffer set lets one call at a time fill, launch on and finalise from it (calls of one shape on several
    streams at once need a workspace each). A prepared runner holds its buffers, so buffers dropped beyond
    :attr:`MAX_ENTRIES` stay alive while a runner of theirs is cached (the library's prepared signatures).
    """

    #: shapes kept; the least recently used is dropped beyond this (eager calls with ever new T).
    MAX_ENTRIES = 32

    def __init__(self) -> None:
        self._entries: "collections.OrderedDict[tuple, dict[str, Any]]" = collections.OrderedDict()
        self._resolved: dict[tuple, AiterCall] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, call: AiterCall, device: torch.device, impl: AiterImpl) -> dict[str, Any]:
        """The cached buffers of ``call`` on ``device`` (allocated on first use)."""
        key = (call.buffer_key(), str(device), id(impl))
        with self._lock:
            got = self._entries.get(key)
            if got is None:
                got = self._allocate(call, device, impl)
                self._entries[key] = got
                while len(self._entries) > self.MAX_ENTRIES:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
            return got

    def resolve(self, call: AiterCall, device: torch.device, impl: AiterImpl) -> AiterCall:
        """``call`` with its split count resolved by AITER's heuristic (cached; see :func:`with_meta_param`)."""
        if not call.needs_meta_param:
            return call
        key = (call, str(device), id(impl))
        got = self._resolved.get(key)
        if got is None:
            meta_param = aiter_meta_param(impl, num_tokens=call.num_tokens, topk=call.topk,
                                          padded_heads=call.padded_heads, q_dtype=TORCH_DTYPES[call.q_dtype])
            got = with_meta_param(call, meta_param)
            with self._lock:
                if len(self._resolved) >= self.MAX_ENTRIES:
                    self._resolved.clear()
                self._resolved[key] = got
        return got

    @staticmethod
    def _allocate(call: AiterCall, device: torch.device, impl: AiterImpl) -> dict[str, Any]:
        # lock: one call at a time fills, launches on and finalises from these buffers (four threads' calls of one
        # shape read each other's ids and q: a break test, fortieth session; on a GPU the calls' work is ordered
        # by their stream, so calls of one shape on several streams at once need a workspace each)
        got: dict[str, Any] = {"impl": impl, "buffers": allocate_buffers(call, device), "lock": threading.Lock()}
        got["q_pad"] = (torch.zeros(call.q_shape, dtype=TORCH_DTYPES[call.q_dtype], device=device)
                        if call.padded_heads > call.num_heads else None)
        got["o"] = torch.empty(call.o_shape, dtype=TORCH_DTYPES[call.out_dtype], device=device)
        if isinstance(call, AiterPersistentCall):
            got["metadata"] = allocate_metadata(call.metadata, device, impl)
        return got


_DEFAULT_WORKSPACE = AiterWorkspace()


def allocate_metadata(meta: PersistentMetadata, device: torch.device, impl: AiterImpl) -> dict[str, torch.Tensor]:
    """Allocate the six persistent metadata buffers with the sizes ``get_mla_metadata_info_v1`` reports.

    Args:
        meta: the planned metadata (padded heads, dtypes, sparse).
        device: where the kernel runs.
        impl: the AITER entry points.

    Returns:
        ``{name: tensor}`` for :data:`METADATA_NAMES` (info order: meta, work_indptr, work_info_set, ...).
    """
    # max_split_per_batch (AITER 0.1.16 and newer; the AITER paths require 0.1.19): AITER sizes reduce_partial_map
    # from it, so the buffers are sized with the cap the fill will use
    info = impl.get_mla_metadata_info_v1(
        meta.batch_size, MAX_SEQLEN_Q, meta.num_heads, TORCH_DTYPES[meta.q_dtype],
        TORCH_DTYPES[meta.kv_dtype], IS_SPARSE, fast_mode=meta.fast_mode,
        num_kv_splits=meta.max_split_per_batch, max_split_per_batch=meta.max_split_per_batch,
    )
    return {name: torch.empty(size, dtype=dt, device=device) for name, (size, dt) in zip(METADATA_NAMES, info)}


def fill_metadata(meta: PersistentMetadata, md: dict[str, torch.Tensor], buffers: AiterBuffers,
                  impl: AiterImpl) -> None:
    """Refill the metadata buffers in place from the current ``kv_indptr`` (every call; no host sync).

    Note the argument order of ``get_mla_metadata_v1``: ``work_info_set`` *before* ``work_indptr``,
    the reverse of ``get_mla_metadata_info_v1``'s return order.

    Source: ROCm/aiter ``aiter/ops/attention.py`` (``get_mla_metadata_v1``); vllm-project/vllm
    ``vllm/v1/attention/backends/mla/rocm_aiter_mla.py`` (same call with ``dtype_q`` / ``dtype_kv``).
    """
    impl.get_mla_metadata_v1(
        buffers.qo_indptr, buffers.kv_indptr, buffers.kv_last_page_lens,
        meta.num_heads // NUM_KV_HEADS, NUM_KV_HEADS, IS_CAUSAL,
        md["work_meta_data"], md["work_info_set"], md["work_indptr"],
        md["reduce_indptr"], md["reduce_final_map"], md["reduce_partial_map"],
        page_size=PAGE_SIZE, kv_granularity=meta.kv_granularity,
        max_seqlen_qo=MAX_SEQLEN_Q, uni_seqlen_qo=MAX_SEQLEN_Q, fast_mode=meta.fast_mode,
        topk=meta.topk, max_split_per_batch=meta.max_split_per_batch,
        dtype_q=TORCH_DTYPES[meta.q_dtype], dtype_kv=TORCH_DTYPES[meta.kv_dtype],
    )


def aiter_meta_param(impl: AiterImpl, *, num_tokens: int, topk: int, padded_heads: int,
                     q_dtype: torch.dtype) -> tuple[int, int]:
    """AITER's split heuristic for our call, as ``(num_kv_splits, batch_size)`` (the planner's ``meta_param``).

    Asks ``get_meta_param(None, T, T * topk, Hp, 1, q.dtype)`` (1 = :data:`~.plan.MAX_SEQLEN_Q`):
    exactly what ``mla_decode_fwd`` would compute itself (``bs = len(qo_indptr) - 1``, ``total_kv =
    kv_indices.shape[0]``); the count is a host int, so no device sync.

    Args:
        impl: AITER's entry points (:class:`AiterImpl`).
        num_tokens: T. topk: ids per token. padded_heads: Hp given to AITER. q_dtype: q's torch dtype.

    Returns:
        ``(num_kv_splits, num_tokens)``.

    Source: ROCm/aiter ``aiter/mla.py`` (``get_meta_param`` call inside ``mla_decode_fwd``).
    """
    splits, _indptr = impl.get_meta_param(None, num_tokens, num_tokens * topk, padded_heads, MAX_SEQLEN_Q, q_dtype)
    return int(splits), num_tokens


def _check_inputs(call: AiterCall, x: DecodeInputs) -> None:
    if dtype_key(x.q.dtype) != call.q_dtype:
        raise ValueError(f"'q' dtype must be {call.q_dtype} as planned (got {x.q.dtype})")
    if dtype_key(x.kv_cache.dtype) != call.kv_dtype:
        raise ValueError(f"'kv_cache' dtype must be {call.kv_dtype} as planned (got {x.kv_cache.dtype})")
    want_q = (call.num_tokens, call.num_heads, call.q_shape[2])
    if tuple(x.q.shape) != want_q:
        raise ValueError(f"'q' must have shape {want_q} as planned (got {tuple(x.q.shape)})")
    if tuple(x.indices.shape) != (call.num_tokens, call.topk):
        raise ValueError(f"'indices' must have shape {(call.num_tokens, call.topk)} as planned "
                         f"(got {tuple(x.indices.shape)})")
    if x.kv_cache.dim() != 2 or x.kv_cache.shape[1] != call.q_shape[2]:
        raise ValueError(f"'kv_cache' must have shape [N, {call.q_shape[2]}] (got {tuple(x.kv_cache.shape)})")
    if x.kv_cache.stride(-1) != 1:  # (the public entry points refuse it; launch_aiter may be called directly)
        raise ValueError(f"'kv_cache' must have unit stride along its last dim (got stride "
                         f"{tuple(x.kv_cache.stride())})")
    # the tensors' facts that a path's table row requires (a plan made for other tensors - a spec built without
    # tensors assumes packed rows and 0 bytes - may name a path these ones do not meet): checked through the table's
    # own requirements, so that the bounds live there only (tables/mla_decode.yaml, kv_rows_packed, kv_cache_bytes)
    facts = {"kv_rows_packed": rows_packed(x.kv_cache), "kv_cache_bytes": span_bytes(x.kv_cache)}
    failures = path_requirement_failures(call.path, facts)
    if failures:
        unmet = "; ".join(f"{f.field}={f.actual}, needs {f.needs()}" for f in failures)
        raise ValueError(f"'kv_cache' (shape {tuple(x.kv_cache.shape)}, stride {tuple(x.kv_cache.stride())}, spanning "
                         f"{facts['kv_cache_bytes']} bytes) does not meet path {call.path!r}: {unmet}; the library "
                         "plans a call on such a cache on the triton path (tables/mla_decode.yaml says why)")
    if call.pass_q_scale and x.q_scale is None:
        raise ValueError(f"'q_scale' (fp32 [1]) is required for {call.q_dtype} q on AITER")
    if call.pass_kv_scale and x.kv_scale is None:
        raise ValueError(f"'kv_scale' (fp32 [1]) is required for {call.kv_dtype} KV on AITER")
    # what the public entry points' validation also checks, for launch_aiter called directly (a [1] sinks
    # broadcast over the heads; other shapes ended in torch's RuntimeError: a break test, fortieth session)
    for name in ("q_scale", "kv_scale"):
        scale = getattr(x, name)
        if scale is not None and scale.numel() != 1:
            raise ValueError(f"'{name}' must be fp32 [1] or [] (got shape {tuple(scale.shape)})")
    if x.sinks is not None and tuple(x.sinks.shape) != (call.num_heads,):
        raise ValueError(f"'sinks' must be fp32 [{call.num_heads}] as planned (got shape {tuple(x.sinks.shape)})")
    if x.out is not None and tuple(x.out.shape) != (call.num_tokens, call.num_heads, call.o_shape[2]):
        raise ValueError(f"'out' must have shape {(call.num_tokens, call.num_heads, call.o_shape[2])} as planned "
                         f"(got {tuple(x.out.shape)})")


def launch_aiter(
    plan: LaunchPlan,
    inputs: DecodeInputs,
    *,
    impl: Optional[AiterImpl] = None,
    workspace: Optional[AiterWorkspace] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Run one AITER path end to end and return the FINAL result.

    Takes the planned launch ``plan.launch`` when it is an :class:`AiterCall` (or an
    :class:`~.chunks.AiterChunkedCall`) of this path planned for this T (a plan cached per ``(spec, platform,
    T)``), else plans it now (:func:`~.chunks.plan_aiter_launch`); an unresolved split count
    (:attr:`AiterCall.needs_meta_param`) is resolved with AITER's heuristic (:func:`aiter_meta_param`, cached in
    the workspace). A call of more id slots (``T * topk``) than one AITER call indexes runs as consecutive token
    chunks, each one call as below whose rows of ``out`` and ``lse`` are the call's. Then :func:`run_call`: pads heads
    (zero q rows), builds ``kv_indptr`` / ``kv_indices`` from the valid ids on the device, refills persistent
    metadata when the path is persistent, calls ``mla_decode_fwd(q, kv.view(-1, 1, 1, 576), o,
    qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, 1, sm_scale=inputs.sm_scale, **kwargs)``
    (``o`` written in place; ``max_seqlen_q = 1``: one query row per batch), then
    :func:`.finalize.finalize_aiter`.

    Args:
        plan: a :class:`~mla_sink.core.plan.LaunchPlan` whose path is an AITER path (optionally with a
            ``launch`` attribute holding the planned :class:`AiterCall` or :class:`~.chunks.AiterChunkedCall`).
        inputs: the call's tensors (:class:`~mla_sink.core.inputs.DecodeInputs`): ``q [T, H, 576]`` bf16/fp8,
            ``kv_cache [N, 576]`` contiguous, ``indices`` int32 ``[T, topk]`` (``-1`` / out-of-range =
            skip anywhere), optional ``topk_length [T]``, ``sinks`` fp32 ``[H]``, fp32 ``[1]`` scales
            for fp8, optional ``out [T, H, 512]``, ``sm_scale``. With DCP, pass ``sinks=None`` (the sink
            is applied once after the merge).
        impl: AITER's entry points (:class:`AiterImpl`); default: the real ``aiter`` imported now.
        workspace: buffer cache (:class:`AiterWorkspace`); default: a process-wide one.

    Returns:
        ``(out, lse)``: ``out [T, H, 512]`` in q's dtype (bf16 for fp8 q), written into ``inputs.out``
        when given, 0 on rows with no valid id, sink applied; ``lse`` fp32 ``[T, H]``, natural log, sink
        excluded, ``-inf`` on empty rows, or ``None`` from a persistent call without LSE.

    Raises:
        ValueError: a non-AITER path, inputs that disagree with the plan, or what
            :func:`~.chunks.plan_aiter_launch` raises.
        RuntimeError: AITER is not importable (only when ``impl`` is None).
    """
    return prepare_aiter(plan, inputs, impl=impl, workspace=workspace)(inputs)


def prepare_aiter(
    plan: LaunchPlan,
    inputs: DecodeInputs,
    *,
    impl: Optional[AiterImpl] = None,
    workspace: Optional[AiterWorkspace] = None,
):
    """The runner of an AITER path for calls shaped like ``inputs`` (the first call of a signature; the library's
    eager calls reuse it, :mod:`mla_sink.paths`): what :func:`launch_aiter` settles once - the planned and resolved
    call (each chunk's, for a call in token chunks), AITER's entry points, the checks of the inputs against the
    call, the workspace's buffers and the call's constant keyword arguments. The runner then fills the id buffers
    (and the persistent metadata), calls AITER and finalises (:func:`run_call`'s steps), once per chunk.

    Returns:
        ``DecodeInputs -> (out, lse)`` as :func:`launch_aiter` returns them, for inputs of this signature.

    Raises:
        ValueError, RuntimeError: as :func:`launch_aiter`.
    """
    if plan.path not in AITER_PATHS:
        raise ValueError(f"'plan.path' must be one of {AITER_PATHS} (got {plan.path!r})")
    if inputs.q.dim() != 3:
        raise ValueError(f"'q' must be [T, H, 576] (got {tuple(inputs.q.shape)})")
    num_tokens = inputs.q.shape[0]
    if num_tokens == 0:  # nothing to launch (AITER takes no empty batch): empty results, as on the other paths
        return _empty_runner(plan_aiter(plan, num_tokens=1))
    launch = getattr(plan, "launch", None)
    if not (isinstance(launch, (AiterCall, AiterChunkedCall)) and launch.path == plan.path
            and launch.num_tokens == num_tokens):
        launch = plan_aiter_launch(plan, num_tokens=num_tokens)
    if impl is None:
        impl = load_aiter_impl()
    workspace = _DEFAULT_WORKSPACE if workspace is None else workspace
    return _runner(launch, inputs, impl, workspace)


def _runner(launch: AiterLaunch, inputs: DecodeInputs, impl: AiterImpl, workspace: AiterWorkspace):
    """The runner of a planned launch: one call's (:func:`_call_runner`), or the chunks' (:func:`_chunked_runner`);
    split counts left to AITER's heuristic resolved now."""
    if isinstance(launch, AiterChunkedCall):
        return _chunked_runner(launch, inputs, impl, workspace)
    return _call_runner(workspace.resolve(launch, inputs.device, impl), inputs, impl, workspace)


def _chunked_runner(chunked: AiterChunkedCall, inputs: DecodeInputs, impl: AiterImpl, workspace: AiterWorkspace):
    """The runner of a call in token chunks (:class:`~.chunks.AiterChunkedCall`): each chunk's call prepared once
    per chunk length (on the rows of the first chunk of that length: the full chunks share one runner and one
    buffer set, a shorter last chunk has its own), each chunk run on its rows of ``q``, ``indices``,
    ``topk_length`` and ``out`` and its LSE copied into its rows of the call's. The chunks run one after another
    on the stream, so a chunk refills the shared id buffers only after the chunk before has read them."""
    runners: dict = {}
    for a, b in chunked.chunks:
        if b - a not in runners:
            call = workspace.resolve(chunked.call_of(b - a), inputs.device, impl)
            runners[b - a] = _call_runner(call, inputs.token_slice(a, b), impl, workspace)
    shape = (chunked.num_tokens, chunked.num_heads)
    out_dtype = TORCH_DTYPES[chunked.out_dtype]

    def run(x: DecodeInputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        out = x.out if x.out is not None else torch.empty((*shape, D_V), dtype=out_dtype, device=x.q.device)
        lse = torch.empty(shape, dtype=torch.float32, device=x.q.device) if chunked.return_lse else None
        for a, b in chunked.chunks:
            _, part = runners[b - a](x._replace(out=out).token_slice(a, b))
            if lse is not None:
                lse[a:b].copy_(part)
        return out, lse

    return run


def _empty_runner(call: AiterCall):
    """The runner of calls with no token (T = 0 launches nothing; it failed in plan_aiter, a break test, fortieth
    session), given the plan's call for one token (its heads, output dtype and whether it returns an LSE):
    ``out [0, H, 512]`` (``inputs.out`` when given) and, where the call returns one, ``lse [0, H]``."""
    out_dtype = TORCH_DTYPES[call.out_dtype]

    def run(x: DecodeInputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        out = x.out if x.out is not None else torch.empty((0, call.num_heads, call.o_shape[2]), dtype=out_dtype,
                                                          device=x.q.device)
        lse = torch.empty((0, call.num_heads), dtype=torch.float32, device=x.q.device) if call.return_lse else None
        return out, lse

    return run


def run_call(call: AiterLaunch, inputs: DecodeInputs, *, impl: AiterImpl,
             workspace: AiterWorkspace) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Execute an already planned :class:`AiterCall` (or :class:`~.chunks.AiterChunkedCall`, chunk by chunk) on
    the inputs (see :func:`launch_aiter` for the contract).

    ``N`` and ``sm_scale`` come with the inputs (the KV cache is viewed as ``(-1, 1, 1, 576)``), so one
    call serves every call of its shape.

    Raises:
        ValueError: the call's split count is unresolved (:attr:`AiterCall.needs_meta_param`: plan it
            with ``meta_param``, resolve it with :func:`~.plan.with_meta_param`, or run it through
            :func:`launch_aiter`; a chunked call's are resolved here), or the inputs disagree with the call
            (dtypes, shapes, a KV cache whose rows are not packed, missing fp8 scales).
    """
    if isinstance(call, AiterChunkedCall):
        return _chunked_runner(call, inputs, impl, workspace)(inputs)
    return _call_runner(call, inputs, impl, workspace)(inputs)


def _call_runner(call: AiterCall, inputs: DecodeInputs, impl: AiterImpl, workspace: AiterWorkspace):
    """The runner of a planned, resolved ``call`` for inputs shaped like ``inputs``: the inputs checked against the
    call and the workspace's buffers fetched once; per call, the id buffers filled, q padded, AITER called and the
    result finalised (see :func:`launch_aiter`). Keeps no tensor of ``inputs``.

    Raises:
        ValueError: as :func:`run_call`.
    """
    if call.needs_meta_param:
        raise ValueError(
            f"'call' has an unresolved split count (num_kv_splits=None with min_kv_splits={call.min_kv_splits}): "
            "plan it with meta_param=aiter_meta_param(...), resolve it with with_meta_param(), or run it "
            "through launch_aiter"
        )
    _check_inputs(call, inputs)
    ws = workspace.entry(call, inputs.device, impl)
    bufs: AiterBuffers = ws["buffers"]
    q_pad, o, lock = ws["q_pad"], ws["o"], ws["lock"]
    persistent = isinstance(call, AiterPersistentCall)
    md = ws["metadata"] if persistent else None
    constant = call.scalar_kwargs()
    if not persistent and bufs.num_kv_splits_indptr is not None:
        constant["num_kv_splits_indptr"] = bufs.num_kv_splits_indptr
    out_dtype = TORCH_DTYPES[call.out_dtype]

    def run(x: DecodeInputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        with lock:
            return launch(x)

    def launch(x: DecodeInputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        fill_kv_buffers(bufs.kv_indptr, bufs.kv_indices, x.indices, x.num_kv_rows, x.topk_length,
                        layout=call.kv_indices_layout)
        if q_pad is not None:
            q_pad[:, : call.num_heads].copy_(x.q)
            q = q_pad
        else:
            q = x.q.contiguous()
        kwargs = dict(constant, sm_scale=x.sm_scale)
        if call.pass_q_scale:
            kwargs["q_scale"] = x.q_scale.reshape(1)  # [] or [1]: AITER takes [1]
        if call.pass_kv_scale:
            kwargs["kv_scale"] = x.kv_scale.reshape(1)
        if persistent:
            fill_metadata(call.metadata, md, bufs, impl)
            kwargs.update(md)
        _logits, lse = impl.mla_decode_fwd(
            q, x.kv_cache.view(call.kv_view_shape), o, bufs.qo_indptr, bufs.kv_indptr, bufs.kv_indices,
            bufs.kv_last_page_lens, MAX_SEQLEN_Q, **kwargs,
        )
        if not call.return_lse:
            lse = None
        return finalize_aiter(o, lse, bufs.kv_indptr, num_heads=call.num_heads, sinks=x.sinks, out_dtype=out_dtype,
                              out=x.out)

    return run
