"""A layer-style object that engines build once per attention layer.

Everything that can be rejected is rejected in ``__init__`` (validation of the configuration and
the sinks, rule-table selection), so nothing is first refused at the first forward or inside
CUDA-graph capture.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from mla_sink.core.dtypes import DTYPE_KEYS, KV_DTYPE_KEYS
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_QK, CallSpec, Platform
from mla_sink.api import Result, check_dcp_args, execute, execute_dcp, has_no_data, prepare, without_data_like
from mla_sink.core.validate import call_scalars
from mla_sink.core.trace import tracing


def _key(name: str, dtype: Union[str, torch.dtype]) -> Union[str, torch.dtype]:
    """A torch dtype -> its dtype key; anything else passes through for CallSpec to check."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_KEYS:
            keys = KV_DTYPE_KEYS if name == "kv_dtype" else sorted(DTYPE_KEYS.values())
            note = "; a uint8 layout is named by its key" if name == "kv_dtype" else ""
            raise ValueError(f"'{name}' must be in {tuple(keys)} or the torch dtype of one of "
                             f"{tuple(sorted(DTYPE_KEYS.values()))} (got {dtype}{note})")
        return DTYPE_KEYS[dtype]
    return dtype


def _sinks_for(q: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """The layer's real sinks for a call on ``q`` without data: as they are (detached) where q's ``FakeTensorMode``
    takes real tensors - a non-strict ``torch.export``'s does, and its tracer lifts them as a constant that shares
    their storage (a fake copy's fresh symbolic sizes were unknown to that tracer: a ``RuntimeError`` inside
    PyTorch, fortieth session's break test); else a copy without data of q's kind (meta, or a fake tensor of its
    mode, which refuses real tensors)."""
    mode = getattr(q, "fake_mode", None)
    if mode is not None and mode.allow_non_fake_inputs:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # a real tensor's detach, outside the mode
            return source.detach()
    return without_data_like(q, source)


def _held_sinks(sinks: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The layer's copy of its sinks (detached; a tensor: :func:`mla_sink.prepare` checked it), or None.

    Raises:
        ValueError: naming ``sinks``, where it holds data while a ``FakeTensorMode`` is active (torch refuses to
            detach it there, with an ``AssertionError`` of its own: a break test, seventy-second session).
    """
    if sinks is None:
        return None
    try:
        return sinks.detach()
    except AssertionError as e:  # FakeTensorMode refuses a tensor with data ("convert all Tensors to FakeTensors")
        raise ValueError("'sinks' is a tensor with data while a FakeTensorMode is active; build the layer outside "
                         "the mode (a call on fake q then takes these sinks as they are), or pass sinks as a "
                         f"FakeTensor of that mode (torch: {str(e).splitlines()[0]})") from None


class SparseMLADecode:
    """Sparse MLA decode for one attention layer: configuration fixed at construction.

    Args (keyword-only):
        num_heads: H, query heads of this rank, an int in ``[1, 2^31 - 1]``.
        q_dtype, kv_dtype: dtype keys (``bf16``, ``fp16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``; for
            ``kv_dtype`` also ``fp8_ds_mla``, the 656-byte V3.2 rows) or the matching torch dtypes; the pair must be
            allowed (:class:`mla_sink.CallSpec`).
        topk: ids per token in ``indices [T, topk]``, an int in ``[1, 2^30]``.
        sinks: optional fp32 ``[H]`` learned sink logits (natural log, not scaled by ``sm_scale``),
            checked now (dtype, shape, device; any stride) and used by every call. A parameter that
            requires grad is held detached (the decode has no backward), sharing its memory, so a later
            in-place load of the weights is seen and no call is refused for it; a parameter whose storage is
            replaced (``p.data = ...``, a module's ``.to()``) is detached again at the next call, whose
            validation then checks the new tensor. A new tensor object is not this tensor, and the layer keeps
            reading this one: ``load_state_dict(..., assign=True)``, ``module.to("meta")`` and ``module.to_empty(...)``
            (a parameter moved across the meta boundary is replaced), any conversion under
            ``torch.__future__.set_overwrite_module_params_on_conversion(True)``, and every conversion of a
            module's *buffer* (``.to()``, ``.half()``, ``.cuda()`` put a new buffer in the module, which
            ``load_state_dict`` then fills) put one in the module, and ``torch.func.functional_call``'s override is
            another tensor. So keep sinks as a parameter (``requires_grad=False`` if frozen), not a buffer, and build
            the layer with the module's new tensor after those, or load without ``assign`` (a break test,
            sixty-third session).
        sm_scale: multiplies ``q.k`` before the natural-exp softmax, a real in ``[2^-126, 2^126]``; default
            ``576 ** -0.5``.
        dcp_world_size, dcp_group, dcp_layout, num_kv_rows: decode context parallel (docs/DCP.md): the ranks
            (default 1: no DCP), their ``torch.distributed`` process group, the sharding layout
            (``'interleaved'``, the default, or ``'contiguous'``) and ``N``, the rows of the global pool; the group
            and ``num_kv_rows`` are required with ``dcp_world_size > 1`` and refused without.
        return_lse: return the LSE from every call (it is returned with sinks or DCP anyway).
        logit_cap: soft cap of the scaled scores, ``s = logit_cap * tanh(s / logit_cap)``; ``> 0`` must lie in
            ``[2^-126, 2^126]``; a finite ``<= 0`` disables (default ``0.0``).
        kv_rows_packed: whether the ``kv_cache`` the layer is called with has packed rows (a contiguous
            ``[N, 576]``; default True); False for e.g. a ``[N, 576]`` view of rows of 640, which AITER does not take
            (:attr:`mla_sink.CallSpec.kv_rows_packed`). Only the construction-time ``plan`` reads it: each call is
            planned for the cache it is given.
        kv_cache_bytes: the bytes the ``kv_cache`` the layer is called with spans (``N * 1152`` for a contiguous
            bf16 ``[N, 576]``; default 0: a small pool); the AITER paths take pools of at most 2^32 bytes
            (:attr:`mla_sink.CallSpec.kv_cache_bytes`). Only the construction-time ``plan`` reads it, as
            ``kv_rows_packed``.
        platform: where the layer runs (default: detected from the device of ``sinks`` when given, else this
            machine's current device); the call tensors must be on a device of that arch.
        path: force a kernel path (a path name of ``tables/mla_decode.yaml``); default: the table's choice.

    Attributes (read-only: the configuration is fixed at construction, where it was checked; assigning or deleting
    one of them, or the private state behind them, raises ``AttributeError`` - build another layer for another
    configuration; other attributes, a subclass's own included, are as on any object):
        spec, platform, plan: the records the layer runs under (``plan.path`` names the kernel path; a call whose
            ``kv_cache`` rows are packed or not, or whose size is other than ``kv_rows_packed`` and ``kv_cache_bytes``
            say, is planned for its own cache, and
            every call for its own tensors' strides: ``plan`` assumes ``gather_aligned`` and ``unit_rows``, so a call
            with e.g. ``q = buf[..., :576]`` of a ``[T, H, 580]`` buffer runs the portable kernel where ``plan``
            names a Gluon one; :func:`mla_sink.describe` of the call's tensors gives its own plan).
        sm_scale: the float the kernels take. sinks: the sinks tensor as the layer holds it (detached), or None.
        path: the forced path, or None.

    Raises:
        ValueError: a dtype key or torch dtype outside the keys, a dtype pair not allowed, ``num_heads`` /
            ``topk`` / ``dcp_world_size`` out of range, ``sm_scale`` or ``logit_cap`` out of range, ``return_lse``
            or ``kv_rows_packed`` not a bool, ``kv_cache_bytes`` not an int in ``[0, 2^63 - 1]``, malformed sinks (as
            :func:`mla_sink.prepare`), DCP arguments that do not fit (:func:`mla_sink.api.check_dcp_args`: unknown
            layout, a group or ``num_kv_rows`` without DCP, a missing or unusable group, a group size other than
            ``dcp_world_size``, ``num_kv_rows`` not an int ``>= 1``), ``platform`` not a :class:`Platform`, ``path``
            not a path of the table, ``sinks`` with data while a ``FakeTensorMode`` is active.
        NoKernelError: no path serves the configuration on this platform (or not the forced ``path``).
        AttributeError: later, on assigning or deleting a read-only attribute (above).
    """

    #: The layer's state behind its read-only attributes: set by ``__init__``, then fixed (``_sinks`` follows the
    #: caller's parameter when its storage is replaced, :meth:`__call__`).
    _STATE = ("_spec", "_sm_scale", "_plan", "_platform", "_sinks", "_sinks_source", "_path", "_dcp", "_built")

    def __init__(self, *, num_heads: int, q_dtype: Union[str, torch.dtype], kv_dtype: Union[str, torch.dtype],
                 topk: int, sinks: Optional[torch.Tensor] = None, sm_scale: Optional[float] = None,
                 dcp_world_size: int = 1, dcp_group: Any = None,
                 dcp_layout: str = "interleaved", num_kv_rows: Optional[int] = None,
                 return_lse: bool = False, logit_cap: float = 0.0, kv_rows_packed: bool = True,
                 kv_cache_bytes: int = 0, platform: Optional[Platform] = None, path: Optional[str] = None) -> None:
        if sm_scale is None:
            sm_scale = D_QK ** -0.5
        self._sm_scale, logit_cap = call_scalars(sm_scale, return_lse, logit_cap)
        self._spec = CallSpec(q_dtype=_key("q_dtype", q_dtype), kv_dtype=_key("kv_dtype", kv_dtype),
                              num_heads=num_heads, topk=topk, sinks=sinks is not None,
                              dcp_world_size=dcp_world_size, need_lse=return_lse, logit_cap=logit_cap,
                              kv_rows_packed=kv_rows_packed, kv_cache_bytes=kv_cache_bytes)
        check_dcp_args(dcp_world_size, dcp_group, dcp_layout, num_kv_rows)
        self._plan: LaunchPlan = prepare(self._spec, platform, path=path, sinks=sinks, sm_scale=self._sm_scale)
        self._platform = self._plan.platform
        self._sinks = _held_sinks(sinks)
        self._sinks_source = sinks  # the caller's tensor: its storage may be replaced later (__call__)
        self._path = path
        self._dcp = (dict(dcp_group=dcp_group, dcp_layout=dcp_layout, num_kv_rows=num_kv_rows)
                     if dcp_world_size > 1 else None)
        self._built = True  # from here on, _refuse keeps the state as checked

    def _refuse(self, name: str) -> None:
        """AttributeError for a change of the configuration (a read-only attribute, or once built its state)."""
        # the read-only attributes are this class's properties (a subclass's own properties are its own business)
        if isinstance(vars(SparseMLADecode).get(name), property) or (
                name in SparseMLADecode._STATE and self.__dict__.get("_built")):
            raise AttributeError(f"{type(self).__name__}.{name} is fixed at construction, where it was checked "
                                 f"(build another layer for another configuration)")

    def __setattr__(self, name: str, value: Any) -> None:
        self._refuse(name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._refuse(name)
        object.__delattr__(self, name)

    spec = property(lambda self: self._spec, doc="The layer's :class:`CallSpec`.")
    platform = property(lambda self: self._platform, doc="The :class:`Platform` the layer runs on.")
    plan = property(lambda self: self._plan, doc="The :class:`LaunchPlan` the layer's calls run under.")
    sm_scale = property(lambda self: self._sm_scale, doc="The float ``sm_scale`` the kernels take.")
    sinks = property(lambda self: self._sinks, doc="The sinks as the layer holds them (detached), or None.")
    path = property(lambda self: self._path, doc="The forced kernel path, or None.")

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
                 topk_length: Optional[torch.Tensor] = None, q_scale: Optional[torch.Tensor] = None,
                 kv_scale: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None) -> Result:
        """Run the layer's decode on one call's tensors (the sinks, ``sm_scale``, ``logit_cap`` and DCP arguments
        are the layer's).

        Args:
            q: ``[T, H, 576]`` in the layer's ``q_dtype``, ``H = num_heads``.
            kv_cache: ``[N, 576]`` in the layer's ``kv_dtype``, or for ``fp8_ds_mla`` uint8 ``[N, 656]`` /
                ``[num_blocks, block_size, 656]``; with DCP, this rank's shard.
            indices: int32 ``[T, topk]`` (the layer's ``topk``) global row ids; ``-1`` or any id outside
                ``[0, N)`` is skipped.
            topk_length, q_scale, kv_scale, out: as :func:`mla_sink.sparse_mla_decode`.

        Returns:
            ``(out, lse)``: ``out`` ``[T, H, 512]`` in q's dtype (bf16 for fp8 q); ``lse`` fp32 ``[T, H]``,
            natural log, sink excluded, ``-inf`` on rows with no valid id, or ``None`` unless the layer has sinks,
            DCP or ``return_lse=True``.

        Raises:
            ValueError: q's head count or any tensor disagrees with the layer's configuration (dtypes, ``topk``),
                or a tensor is malformed (as :func:`mla_sink.sparse_mla_decode`); with DCP, a shard or ids that do
                not fit ``num_kv_rows`` and the layout (:func:`mla_sink.core.dcp.dcp_sparse_mla_decode`).
        """
        spec = self._spec
        if (isinstance(q, torch.Tensor) and q.layout == torch.strided and not q.is_nested and q.dim() == 3
                and q.shape[1] != spec.num_heads):  # (other layouts: the validation's refusal names them)
            raise ValueError(f"'q' has {q.shape[1]} heads but the layer was built with num_heads={spec.num_heads}")
        sinks, source = self._sinks, self._sinks_source
        if source is not None:
            # traced by Dynamo (or with fake sinks): a detach is free in the graph (data_ptr is not traceable); a
            # fake mode of this thread over the layer's real sinks - a non-strict export's, or shape inference
            # while another thread compiles (which sets is_compiling) - takes the shape-inference branch below
            if tracing() and (torch.compiler.is_dynamo_compiling() or has_no_data(source)):
                sinks = source.detach()
                if q.is_meta and not sinks.is_meta:  # a compiled call's shape inference
                    sinks = without_data_like(q, sinks)
            elif has_no_data(q):  # shape inference (meta or fake q) on a layer built for a device: the current sinks
                sinks = _sinks_for(q, source)  # (whose storage may have been replaced), without data where needed
            elif (source.data_ptr() != sinks.data_ptr() or source.shape != sinks.shape
                  or source.stride() != sinks.stride() or source.dtype is not sinks.dtype
                  or source.is_neg() != sinks.is_neg()):  # new storage, or a view at the same address
                # (p.data = p.data[:4], p.data[:1].expand(H), p.data.view(bf16)[::2], a negated c.conj().imag)
                sinks = source.detach()
                self.__dict__["_sinks"] = sinks  # the state's one change: the caller's parameter, new storage
        x = DecodeInputs(q, kv_cache, indices, self._sm_scale, sinks, topk_length, q_scale, kv_scale, out,
                         spec.logit_cap)
        if self._dcp is not None:
            return execute_dcp(x, spec=spec, platform=self._platform, path=self._path, **self._dcp)
        return execute(x, spec=spec, need_lse=spec.need_lse, platform=self._platform, path=self._path)

    def __repr__(self) -> str:
        return f"SparseMLADecode({self._spec} on {self._platform} -> {self._plan.path}, row {self._plan.row_id})"
