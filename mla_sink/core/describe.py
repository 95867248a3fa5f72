"""describe: tensors + options -> (CallSpec, Platform)."""

from __future__ import annotations

import numbers
from typing import Optional

import torch

import attrs

from mla_sink.core.dtypes import dtype_key, kv_dtype_key
from mla_sink.core.kv_layout import rows_packed, span_bytes
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.platform import detect_platform
from mla_sink.core.records import CallSpec, Platform, check_platform
from mla_sink.core.validate import check_inputs, check_return_lse


def tensor_facts(x: DecodeInputs, *, dcp: bool = False) -> dict:
    """The :class:`CallSpec` fields only the call's tensors know, read from their strides (metadata only):
    ``kv_rows_packed`` (:func:`mla_sink.core.kv_layout.rows_packed` of ``x.kv_cache``), ``gather_aligned``
    (:func:`mla_sink.paths.triton.plan.gather_strides_aligned`: q's, kv_cache's and indices' gather strides are
    multiples of the tuning table's stride multiple) and ``unit_rows``
    (:func:`mla_sink.paths.triton.plan.rows_unit_stride`) and ``kv_cache_bytes`` (:func:`mla_sink.core.kv_layout.
    span_bytes`: the bytes the pool spans, a DCP call's shard's own). ``x`` must already be checked
    (:func:`mla_sink.core.validate.check_inputs`): this reads strides and checks nothing.

    Args:
        x: the call's tensors.
        dcp: a DCP call (``dcp_world_size > 1``), whose rank-local decode reads its own ids - a fresh ``[T, topk]``
            of row stride ``topk`` (:func:`mla_sink.core.dcp.local_indices`, :func:`~mla_sink.core.dcp.
            compact_local_indices`) - not the caller's: the ids' facts are those of contiguous ids, so padded or
            strided global ids do not keep the local decode off a Gluon kernel (a break test, forty-second session).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped tuning table is malformed.
    """
    from mla_sink.paths.triton.plan import gather_strides_aligned, rows_unit_stride

    ids = torch.empty(x.indices.shape, dtype=x.indices.dtype, device="meta") if dcp else x.indices
    return dict(kv_rows_packed=rows_packed(x.kv_cache), kv_cache_bytes=span_bytes(x.kv_cache),
                gather_aligned=gather_strides_aligned(x.q, x.kv_cache, ids),
                unit_rows=rows_unit_stride(x.q, x.kv_cache, ids))


def spec_of(x: DecodeInputs, *, need_lse: bool, dcp_world_size: int = 1) -> CallSpec:
    """The :class:`CallSpec` of tensors already checked by :func:`mla_sink.core.validate.check_inputs` (the stride
    facts from :func:`tensor_facts`).

    Args:
        x: the call's tensors: q ``[T, H, 576]``, kv_cache ``[N, 576]`` (or the uint8 ``fp8_ds_mla`` rows
            ``[N, 656]`` / ``[num_blocks, block_size, 656]``), indices int32 ``[T, topk]``, optional sinks fp32 ``[H]``.
        need_lse: the call needs an LSE (it has sinks, is a DCP call or asks for one).
        dcp_world_size: ranks of the DCP group (1: no DCP).

    Raises:
        ValueError: a field :class:`CallSpec` refuses (e.g. a dtype pair that ``tables/call_dtypes.yaml`` does not
            serve, a ``logit_cap`` out of range); dispatch.TableError / dispatch.TableCheckError as
            :func:`tensor_facts`.
    """
    return CallSpec(q_dtype=dtype_key(x.q.dtype), kv_dtype=kv_dtype_key(x.kv_cache), num_heads=x.q.shape[1],
                    topk=x.indices.shape[1], sinks=x.sinks is not None, dcp_world_size=dcp_world_size,
                    need_lse=need_lse, logit_cap=x.logit_cap, **tensor_facts(x, dcp=dcp_world_size > 1))


def spec_for_tensors(spec: CallSpec, x: DecodeInputs) -> CallSpec:
    """``spec`` with the facts only the call's tensors know taken from them (:func:`tensor_facts`:
    ``kv_rows_packed``, ``gather_aligned``, ``unit_rows``, ``kv_cache_bytes``). A spec built without tensors (the
    layer's, :func:`mla_sink.run`'s) assumes packed rows, aligned, unit-stride gathers and a small pool; the call is
    planned for the tensors it is given. ``x`` must already be checked (:func:`mla_sink.core.validate.check_inputs`).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: as :func:`tensor_facts`.
    """
    facts = tensor_facts(x, dcp=spec.dcp_world_size > 1)
    if all(getattr(spec, k) == v for k, v in facts.items()):
        return spec
    return attrs.evolve(spec, **facts)


def describe(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    *,
    dcp_world_size: int = 1,
    return_lse: bool = False,
    logit_cap: float = 0.0,
    platform: Optional[Platform] = None,
) -> tuple[CallSpec, Platform]:
    """Derive the call's :class:`CallSpec` and :class:`Platform` from its tensors.

    Only metadata is read (no value, no scale: fp8 calls need none here); the tensors' strides give
    ``kv_rows_packed`` (whether the cache's rows follow each other without a gap), ``gather_aligned`` and
    ``unit_rows`` (the strides the Gluon kernels gather with) and ``kv_cache_bytes`` (the bytes the pool spans:
    :func:`tensor_facts`).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 / ``float8_e4m3fn`` / ``float8_e4m3fnuz``. kv_cache: ``[N, 576]`` (a dtype
            that pairs with q's), or uint8 ``[N, 656]`` / ``[num_blocks, block_size, 656]`` (the ``fp8_ds_mla``
            layout). indices: int32 ``[T, topk]`` (``-1`` = no id).
        sinks: optional fp32 ``[H]`` natural-log sink logits (only their presence enters the spec).
        dcp_world_size: decode-context-parallel ranks (int ``>= 1``; default 1). return_lse: the caller wants the
            LSE (``CallSpec.need_lse``; sinks and DCP imply it).
        logit_cap: soft cap of the scaled scores (``<= 0`` disables; a positive one in ``[2^-126, 2^126]``).
        platform: explicit platform (default: detected from ``q.device``).

    Returns:
        ``(spec, platform)``, a tuple: the call's :class:`CallSpec` and the :class:`Platform` it runs on (the one
        given, or the detected one), as :func:`mla_sink.run` and :func:`mla_sink.plan_call` take them.

    Raises:
        ValueError: a tensor is malformed (see :func:`mla_sink.core.validate.check_inputs`; tensors on the
            ``meta`` device included; an empty pool ``[0, 576]`` only without DCP: a DCP rank's shard may be
            empty), ``return_lse`` is not a bool, a field is out of its domain
            (:class:`CallSpec`: e.g. ``dcp_world_size`` or ``logit_cap``), or ``platform`` is neither ``None`` nor
            a :class:`Platform`.
    """
    check_platform(platform, optional=True)
    # describe precedes a launch (no meta tensors); a DCP rank's shard may be empty, as run() takes it
    dcp = isinstance(dcp_world_size, numbers.Integral) and not isinstance(dcp_world_size, bool) and dcp_world_size > 1
    check_inputs(q, kv_cache, indices, sinks, check_scales=False, allow_meta=False, allow_empty_pool=dcp)
    check_return_lse(return_lse)
    spec = spec_of(DecodeInputs(q, kv_cache, indices, sinks=sinks, logit_cap=logit_cap), need_lse=return_lse,
                   dcp_world_size=dcp_world_size)
    return spec, platform if platform is not None else detect_platform(q.device)
