"""Decode context parallel (DCP): the KV pool sharded over ranks, merged through the LSE, the sink applied once.

With DCP the ``N`` rows of the KV pool are split over the ``W`` ranks of a ``torch.distributed``
process group. Every rank holds the same ``q [T, H, 576]`` and the same *global* ``indices
[T, topk]``; it keeps only its shard of ``kv_cache`` and computes a **sink-free** partial state
``(out_r, lse_r)`` over the ids it owns. The ranks then exchange those states, merge them in fp32
natural log (:func:`mla_sink.core.lse.merge_states`)::

    lse = logsumexp_r(lse_r)
    out = sum_r out_r * exp(lse_r - lse)

and only then apply the sink, once (:func:`mla_sink.core.lse.apply_sink`):
``out *= sigmoid(lse - sink)``. Folding the sink into each rank's normaliser would count it ``W``
times; merging base-2 LSEs as natural logs mixes the parts with wrong weights. Neither can happen
here because the local call never sees the sinks and every LSE is natural log.

Sharding layouts (selected by name, :data:`LAYOUTS`):

* ``interleaved``: global row ``g`` lives on rank ``g % W`` at local row ``g // W`` (vLLM's DCP
  layout: consecutive tokens of a sequence land on different ranks, so the work of a recent-window
  indexer stays balanced).
* ``contiguous``: rank ``r`` owns rows ``[r * S, min((r + 1) * S, N))`` with ``S = ceil(N / W)`` at
  local row ``g - r * S``; the last shard is shorter and may be empty when ``W > ceil(N / S)``.

Exchange (one packed collective): each rank packs its partial output **in fp32** and its fp32 LSE
into one byte buffer and the ranks all-gather it (``all_gather_into_tensor``), so every rank merges
all ``W`` states itself and returns the same full ``[T, H, 512]`` result, rounded to the output
dtype once, after the merge. Per rank that receives ``(W - 1) * T * H * (512 * 4 + 4)`` bytes in one
collective latency. Partials in the output dtype (bf16) would halve that but round every partial
separately, which loses far more than one bf16 ulp where partials of different ranks cancel
(W = 2, rows 0 and 2 of V at 1.0 and 1.0078125, rows 1 and 3 at -1.0, equal scores: the answer
0.001953125 came out as 0.0). The alternative (vLLM's ``cp_lse_ag_out_rs``), an all-gather of the
fp32 LSEs then a reduce-scatter over heads of fp32 pre-scaled outputs, receives
``(W - 1) * T * H * 4 + (W - 1) / W * T * H * 512 * 4`` bytes in two collectives and leaves each rank
only ``H / W`` heads; to return full heads it needs a third collective (an all-gather of the bf16
head slices). It moves fewer bytes at every ``W`` (1540 against 2052 ``T * H`` bytes at ``W = 2``);
see docs/DCP.md for the table and why one collective was kept.

Source: docs/DESIGN.md "Decode context parallel"; vLLM ``vllm/v1/attention/backends/mla`` and
``vllm/attention/ops/common.py`` (``cp_lse_ag_out_rs``, the interleaved ``% dcp_world_size`` layout);
the split-KV combine of lightllm/sglang decode kernels.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from mla_sink.core.dtypes import DTYPE_KEYS, out_dtype_for
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.kv_layout import one_head_hint
from mla_sink.core.lse import merge_states, sink_applied
from mla_sink.core.records import D_V
from mla_sink.core.trace import has_no_data
from mla_sink.core.validate import (check_data, check_out_writable, check_sinks, check_topk_length, overlaps_itself,
                                   require_tensor)

#: Names of the supported sharding layouts.
LAYOUTS: tuple[str, ...] = ("interleaved", "contiguous")

#: Signature of the per-rank sink-free decode: ``DecodeInputs -> (out_r [T, H, 512], lse_r fp32 [T, H])``.
LocalDecode = Callable[[DecodeInputs], "tuple[torch.Tensor, torch.Tensor]"]

_PACK_ALIGN = 16  # bytes; keeps every unpacked view aligned for any element size

#: The tensors of a DCP call that :func:`dcp_sparse_mla_decode`'s own code reads or writes before and after the local
#: decode: the ids it maps and masks, and the sinks and ``out`` of the merge.
_READ_HERE = ("indices", "topk_length", "sinks", "out")


def _check_int(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"'{name}' must be an int >= {lo} (got {value!r})")
    return value


def _check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"'layout' must be in {LAYOUTS} (got {layout!r})")
    return layout  # type: ignore[return-value]


def _check_rank(world_size: int, rank: object) -> int:
    _check_int("world_size", world_size, 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"'rank' must be an int in [0, {world_size}) (got {rank!r})")
    return rank


def contiguous_shard_size(num_kv_rows: int, world_size: int) -> int:
    """``S = ceil(N / W)``: rows per shard of the ``contiguous`` layout (the last shard may be shorter).

    Args:
        num_kv_rows: N, rows of the global pool (>= 0).
        world_size: W, ranks (>= 1).

    Returns:
        ``S`` (0 for ``N = 0``).

    Raises:
        ValueError: an argument is not an int in its domain.
    """
    _check_int("num_kv_rows", num_kv_rows, 0)
    _check_int("world_size", world_size, 1)
    return -(-num_kv_rows // world_size)


def shard_num_rows(num_kv_rows: int, world_size: int, rank: int, layout: str) -> int:
    """Rows of the global pool that ``rank`` keeps under ``layout``.

    ``interleaved``: ``ceil((N - r) / W)`` (0 when ``r >= N``); ``contiguous``:
    ``max(0, min(N, (r + 1) * S) - r * S)`` with ``S = ceil(N / W)``.

    Args:
        num_kv_rows: N, rows of the global pool (>= 0).
        world_size: W, ranks in the DCP group (>= 1).
        rank: this rank's index in the group, ``0 <= rank < W``.
        layout: ``'interleaved'`` or ``'contiguous'``.

    Returns:
        ``N_r``, the row count of ``rank``'s shard (``>= 0``; :func:`shard_kv_cache` returns that many rows).

    Raises:
        ValueError: unknown layout, or an argument outside its domain (the message names it).
    """
    _check_layout(layout)
    _check_int("num_kv_rows", num_kv_rows, 0)
    _check_rank(world_size, rank)
    if layout == "interleaved":
        return max(0, -(-(num_kv_rows - rank) // world_size))
    s = contiguous_shard_size(num_kv_rows, world_size)
    return max(0, min(num_kv_rows, (rank + 1) * s) - rank * s)


def global_row_ids(num_kv_rows: int, world_size: int, rank: int, layout: str,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Global row id of each local row of ``rank``'s shard (the inverse of :func:`local_indices`).

    Args:
        num_kv_rows: N, rows of the global pool.
        world_size: W, ranks in the DCP group.
        rank: this rank, ``0 <= rank < W``.
        layout: ``'interleaved'`` or ``'contiguous'``.
        device: device of the result.

    Returns:
        int64 ``[N_r]`` with ``N_r = shard_num_rows(...)``: local row ``i`` holds global row ``ids[i]``.

    Raises:
        ValueError: as :func:`shard_num_rows`.
    """
    n_r = shard_num_rows(num_kv_rows, world_size, rank, layout)
    local = torch.arange(n_r, dtype=torch.int64, device=device)
    if layout == "interleaved":
        return local * world_size + rank
    return local + rank * contiguous_shard_size(num_kv_rows, world_size)


def shard_kv_cache(kv_cache: torch.Tensor, world_size: int, rank: int, layout: str, *,
                   copy: bool = False) -> torch.Tensor:
    """The rows of the global KV pool that ``rank`` keeps.

    Args:
        kv_cache: ``[N, 576]`` the global pool (any dtype; one shared KV head, page size 1), or the
            ``fp8_ds_mla`` pool as uint8 ``[N, 656]`` (rows are sharded whole: each rank keeps ``[N_r, 656]``).
        world_size: W, ranks in the DCP group.
        rank: this rank, ``0 <= rank < W``.
        layout: ``'interleaved'`` (rows ``rank::W``) or ``'contiguous'`` (rows ``[r*S, (r+1)*S)``,
            ``S = ceil(N / W)``).
        copy: return a contiguous copy with its own storage (what a rank keeps in production)
            instead of a view into ``kv_cache`` (row-strided for ``interleaved``).

    Returns:
        ``[N_r, 576]`` (``[N_r, 656]``) same dtype and device as ``kv_cache``; local row ``i`` is global row
        ``global_row_ids(N, W, rank, layout)[i]``. ``N_r`` may be 0.

    Raises:
        ValueError: ``kv_cache`` is not 2-D, unknown layout, or ``world_size`` / ``rank`` out of range.
    """
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 2:
        raise ValueError(f"'kv_cache' must be a 2-D tensor: [N, 576], or the fp8_ds_mla rows as uint8 [N, 656] (a "
                         f"paged [blocks, block_size, 656] pool is sharded by its rows: pass "
                         f"kv_cache.reshape(-1, 656)) (got {getattr(kv_cache, 'shape', type(kv_cache))})")
    n = kv_cache.shape[0]
    n_r = shard_num_rows(n, world_size, rank, layout)
    if layout == "interleaved":
        shard = kv_cache[rank::world_size]
    else:
        start = rank * contiguous_shard_size(n, world_size)
        shard = kv_cache[start : start + n_r]
    assert shard.shape[0] == n_r  # internal consistency of the two formulas
    return shard.clone(memory_format=torch.contiguous_format) if copy else shard


def local_indices(indices: torch.Tensor, *, world_size: int, rank: int, layout: str, num_kv_rows: int) -> torch.Tensor:
    """Map global row ids to this rank's local row ids (pure tensor ops, no host sync).

    Args:
        indices: integer ``[T, topk]`` global row ids; ``-1``, any negative id and any id ``>= N``
            are invalid ("skip"), wherever they sit in a row.
        world_size: W, ranks in the DCP group.
        rank: this rank, ``0 <= rank < W``.
        layout: ``'interleaved'`` (``g -> g // W`` on rank ``g % W``) or ``'contiguous'``
            (``g -> g - r * S`` on rank ``g // S``, ``S = ceil(N / W)``).
        num_kv_rows: N, rows of the *global* pool.

    Returns:
        int32 ``[T, topk]`` (same device, same positions): the local row id where this rank owns
        the global id, ``-1`` where it does not and where the global id is invalid.

    Raises:
        ValueError: ``indices`` is not a 2-D integer tensor, unknown layout, an int argument outside its
            domain, or a pool whose shards hold more rows than int32 local ids can number
            (``ceil(N / W) > 2^31``: the ids would wrap, a break test of the sixtieth session).
    """
    if (not isinstance(indices, torch.Tensor) or indices.dim() != 2 or indices.dtype.is_floating_point
            or indices.dtype == torch.bool):
        raise ValueError(
            f"'indices' must be an integer tensor [T, topk] (got {getattr(indices, 'dtype', type(indices))} "
            f"{tuple(getattr(indices, 'shape', ()))})"
        )
    _check_layout(layout)
    _check_int("num_kv_rows", num_kv_rows, 0)
    _check_rank(world_size, rank)
    shard_rows = contiguous_shard_size(num_kv_rows, world_size)  # the most rows of any rank, in either layout
    id_max = torch.iinfo(torch.int32).max
    if shard_rows - 1 > id_max:
        raise ValueError(f"'num_kv_rows' over 'world_size' ranks gives shards of up to {shard_rows} rows, whose local "
                         f"ids int32 cannot hold (at most {id_max + 1} rows a shard; got num_kv_rows={num_kv_rows}, "
                         f"world_size={world_size})")
    g = indices.long()
    valid = (g >= 0) & (g < num_kv_rows)
    if layout == "interleaved":
        own = valid & (torch.remainder(g, world_size) == rank)
        local = torch.div(g, world_size, rounding_mode="floor")
    else:
        s = contiguous_shard_size(num_kv_rows, world_size)
        lo, hi = rank * s, min(num_kv_rows, (rank + 1) * s)
        own = valid & (g >= lo) & (g < hi)
        local = g - lo
    return torch.where(own, local, torch.full_like(local, -1)).to(torch.int32)


def compact_local_indices(loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the valid (``>= 0``) local ids of each row to its front, keeping their order (no host sync).

    Args:
        loc: int32 ``[T, topk]`` local ids, ``-1`` = not owned / invalid (from :func:`local_indices`).

    Returns:
        ``(ids, length)``: int32 ``[T, topk]`` with the ``length[t]`` valid ids of row t first and
        ``-1`` after them, and int32 ``[T]`` ``length`` (usable as ``topk_length``).

    Raises:
        ValueError: ``loc`` not an int32 ``[T, topk]`` tensor.
    """
    if not isinstance(loc, torch.Tensor) or loc.dim() != 2 or loc.dtype != torch.int32:
        got = f"{loc.dtype} of shape {list(loc.shape)}" if isinstance(loc, torch.Tensor) else type(loc).__name__
        raise ValueError(f"'loc' must be an int32 [T, topk] tensor of local ids (got {got})")
    t, topk = loc.shape
    owned = loc >= 0
    # Owned ids go to their rank among the owned; the rest all write -1 into a spare column.
    dest = torch.where(owned, torch.cumsum(owned, dim=1) - 1, torch.full_like(loc, topk, dtype=torch.int64))
    buf = torch.full((t, topk + 1), -1, dtype=loc.dtype, device=loc.device)
    buf.scatter_(1, dest, loc)
    # a fresh [T, topk] of row stride topk: at T = 1 `.contiguous()` keeps the view's stride topk + 1 (torch calls a
    # size-1 dimension contiguous whatever its stride), which the seesaw's gather cannot take and its plan, made from
    # the caller's ids, did not foresee (a break test, forty-second session: PlanMismatchError on every T=1 DCP call)
    return buf[:, :topk].clone(memory_format=torch.contiguous_format), owned.sum(dim=1, dtype=torch.int32)


def _out_dtype(q: torch.Tensor) -> torch.dtype:
    """q's dtype for bf16/fp16 (and fp32/fp64 test inputs), bf16 for fp8 q."""
    key = DTYPE_KEYS.get(q.dtype)
    return out_dtype_for(key) if key is not None else q.dtype


def group_size_rank(group: Optional[dist.ProcessGroup], name: str = "group", *,
                    none_allowed: bool = True) -> tuple[int, int]:
    """``(world size, rank)`` of ``group`` (``None`` = the default group).

    Args:
        group: a ``torch.distributed`` process group, or ``None`` for the default group.
        name: the argument's name in the caller, for the messages (``'group'``, ``'dcp_group'``).
        none_allowed: whether the caller takes ``None`` (the default group), so the message offers it; ``run`` and
            the layer require their ``dcp_group`` (a break test found "or None" offered where ``None`` is refused).

    Raises:
        ValueError: naming the argument ``name``: torch.distributed is not initialised, or ``group``
            is not a process group this rank belongs to.
    """
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        allowed = "a torch.distributed ProcessGroup" + (" or None" if none_allowed else "")
        raise ValueError(f"'{name}' must be {allowed} (got {group!r})")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"'{name}' needs an initialised torch.distributed default process group "
                         f"(call init_process_group first)")
    try:
        return dist.get_world_size(group), dist.get_rank(group)
    except (RuntimeError, ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"'{name}' must be a torch.distributed ProcessGroup this rank belongs to "
                         f"(got {group!r}: {e})") from None


def _all_gather_flat(out_flat: torch.Tensor, inp: torch.Tensor, group: Optional[dist.ProcessGroup]) -> None:
    # torch >= 2.12 names it all_gather_single (all_gather_into_tensor is deprecated there); a flat
    # [W * n] output is accepted by both, on gloo and NCCL.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out_flat, inp, group=group)


def exchange_states(
    out_r: torch.Tensor, lse_r: torch.Tensor, *, group: Optional[dist.ProcessGroup],
    wire_dtype: torch.dtype = torch.float32,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """All-gather every rank's sink-free partial state in one packed collective.

    Each rank packs ``out_r`` (cast to ``wire_dtype``) and ``lse_r`` (fp32) into one uint8 buffer
    padded to 16 bytes and calls a single ``all_gather_into_tensor``; the result is unpacked into
    zero-copy views.

    Args:
        out_r: ``[T, H, d_v]`` this rank's sink-free output (any float dtype).
        lse_r: ``[T, H]`` this rank's natural-log, sink-free LSE (``-inf`` = no owned valid id).
        group: the DCP process group (``None`` = default group).
        wire_dtype: dtype ``out_r`` travels in: fp32 (the default, what :func:`dcp_sparse_mla_decode`
            uses; a narrower dtype rounds each partial before the merge).

    Returns:
        ``(outs, lses)``: W tensors ``[T, H, d_v]`` in ``wire_dtype`` and W fp32 ``[T, H]``, in rank
        order, identical on every rank.

    Bytes moved per rank (ring all-gather): ``(W - 1) * pad16(T * H * (d_v * b + 4))`` in and out,
    ``b`` = bytes of ``wire_dtype`` (4 for fp32).

    Raises:
        Nothing of its own (:func:`dcp_sparse_mla_decode` checks its inputs first): torch.distributed's errors pass
        through, e.g. its ``ValueError`` when no default process group is initialised.
    """
    w = dist.get_world_size(group)
    shape = tuple(out_r.shape)
    out_b = out_r.to(wire_dtype).contiguous().reshape(-1).view(torch.uint8)
    lse_b = lse_r.to(torch.float32).contiguous().reshape(-1).view(torch.uint8)
    n_out, n_lse = out_b.numel(), lse_b.numel()
    n = -(-(n_out + n_lse) // _PACK_ALIGN) * _PACK_ALIGN
    pad = torch.zeros(n - n_out - n_lse, dtype=torch.uint8, device=out_r.device)
    packed = torch.cat([out_b, lse_b, pad])
    gathered = torch.empty(w * n, dtype=torch.uint8, device=out_r.device)
    _all_gather_flat(gathered, packed, group)
    gathered = gathered.view(w, n)
    outs = [gathered[r, :n_out].view(wire_dtype).view(shape) for r in range(w)]
    lses = [gathered[r, n_out : n_out + n_lse].view(torch.float32).view(shape[:-1]) for r in range(w)]
    return outs, lses


#: The note a refused DCP call's error carries once this rank joined the call's exchange (:func:`join_refused_call`).
REFUSED_NOTE = ("mla-sink DCP: this rank still joined the call's all-gather, with a poisoned partial state (LSE +inf), "
                "so the other ranks of the group return out = NaN, lse = +inf for this call instead of waiting for "
                "it, and the group stays in step for the next call (docs/DCP.md)")


def join_refused_call(q: Any, group: Optional[dist.ProcessGroup], error: BaseException) -> bool:
    """Join a refused DCP call's one exchange, so a call that fails on some ranks only leaves none waiting.

    A DCP call's checks and local decode run before its one collective. Checks on what every rank shares fail on
    every rank, but a rank's own shard and ``out`` are checked on that rank only (a wrong dtype, shape, stride or
    storage, an alignment), and its local decode may fail alone. Without this, the other ranks would wait in the
    all-gather until the group's timeout, and a rank that carried on would pair its next call's all-gather with
    their pending one and merge the wrong states (a break test, sixty-third session). So a failing rank all-gathers
    a poisoned partial state ``(out_r = NaN, lse_r = +inf)`` of the call's shape (:func:`exchange_states`) and then
    raises. The other ranks' merge gives every row ``lse = +inf`` and ``out = NaN``, as
    :func:`mla_sink.core.lse.merge_states` documents for a ``+inf`` part and the GPU combine does
    (tests/test_combine_gpu.py); not a NaN LSE, which the GPU's ``max`` may drop. A call that fails on every rank
    joins one exchange on every rank, so the group stays in step either way.

    Args:
        q: the call's ``q`` ``[T, H, 576]`` (shared by every rank): the exchange's shape.
        group: the call's process group (``None`` = the default group).
        error: the exception being raised; it gets :data:`REFUSED_NOTE` when the exchange was joined.

    Returns:
        Whether this rank joined the exchange. Not joined - the call's other ranks skip the exchange too or never
        reach it: a group that is not usable or of one rank, a ``q`` that is not a 3-D tensor with data (shape
        inference runs no collective), ``T = 0`` (every rank returns before the exchange). An error of the exchange
        itself (e.g. a ``q`` on a device the backend does not take) is dropped: the call's own error is raised.
    """
    try:
        world = group_size_rank(group)[0]
    except Exception:  # the group itself is what the call's error is about
        return False
    if world < 2 or not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[0] == 0 or has_no_data(q):
        return False
    t, h = q.shape[0], q.shape[1]
    try:
        exchange_states(torch.full((t, h, D_V), float("nan"), dtype=torch.float32, device=q.device),
                        torch.full((t, h), float("inf"), dtype=torch.float32, device=q.device), group=group)
    except Exception:
        return False
    error.add_note(REFUSED_NOTE)
    return True


def check_shard(inputs: DecodeInputs, num_kv_rows: int, world: int, rank: int, layout: str) -> int:
    """Raises ValueError unless ``inputs.kv_cache`` is rank ``rank``'s shard of a pool of ``num_kv_rows`` rows over
    ``world`` ranks under ``layout`` (:func:`shard_num_rows` rows: ``[N_r, 576]``, uint8 ``[N_r, 656]`` or a paged
    ``fp8_ds_mla`` shard ``[num_blocks, block_size, 656]``); returns ``N_r``. Checked before any collective, by the
    merge and by a DCP call's shape inference (:func:`mla_sink.api.execute_dcp`)."""
    kv = inputs.kv_cache
    paged = kv.dim() == 3 and kv.dtype == torch.uint8  # an fp8_ds_mla shard [num_blocks, block_size, 656]
    if kv.dim() != 2 and not paged:
        raise ValueError(f"'inputs.kv_cache' must be this rank's shard [N_r, 576] (or uint8 [N_r, 656] or "
                         f"[num_blocks, block_size, 656]) (got shape {tuple(kv.shape)}){one_head_hint(kv)}")
    expect_rows = shard_num_rows(num_kv_rows, world, rank, layout)
    if inputs.num_kv_rows != expect_rows:
        raise ValueError(
            f"'inputs.kv_cache' must hold this rank's shard: {expect_rows} rows for num_kv_rows={num_kv_rows}, "
            f"layout={layout!r}, rank {rank} of {world} (got {inputs.num_kv_rows} rows)"
        )
    return expect_rows


def dcp_sparse_mla_decode(
    inputs: DecodeInputs,
    *,
    group: Optional[dist.ProcessGroup],
    layout: str,
    num_kv_rows: int,
    local_decode: LocalDecode,
    dcp_world_size: Optional[int] = None,
    compact_ids: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode with sinks over a KV pool sharded across the ranks of ``group``.

    Every rank of ``group`` calls this with the same ``q``, ``indices``, ``sinks``, ``sm_scale``,
    ``topk_length`` and scales, and its own shard as ``inputs.kv_cache``. Steps: map the global ids
    to local rows (:func:`local_indices`, ``-1`` where not owned); run ``local_decode`` sink-free on
    the shard (skipped on an empty shard, which contributes ``lse = -inf``); all-gather the packed
    ``(out_r, lse_r)`` of all ranks, both in fp32, in one collective (:func:`exchange_states`); merge in fp32 natural
    log with :func:`mla_sink.core.lse.merge_states`; apply the sink once with
    :func:`mla_sink.core.lse.apply_sink`::

        lse = logsumexp_r(lse_r)                      # natural log, sink excluded
        out = sum_r out_r * exp(lse_r - lse) * sigmoid(lse - sink)

    A rank with no valid id for a row (``lse_r = -inf``) contributes exactly zero (its ``out_r`` is
    never read, NaN included); a row empty on every rank gives ``out = 0``, ``lse = -inf``. Every
    rank returns the same full result. No host sync. A call that fails on this rank (any exception of its checks
    or its local decode) still joins the exchange before it raises (:func:`join_refused_call`): the ranks that
    passed return ``out = NaN``, ``lse = +inf`` for that call instead of waiting, and the group stays in step.

    Args:
        inputs: the call. ``q`` ``[T, H, 576]`` (bf16/fp16/fp8; fp32 accepted for tests),
            replicated; ``kv_cache`` ``[N_r, 576]`` **this rank's shard** (:func:`shard_kv_cache`; for the
            656-byte ``fp8_ds_mla`` layout uint8 ``[N_r, 656]``, or paged ``[blocks, block_size, 656]``
            with ``blocks * block_size = N_r``);
            ``indices`` int32 ``[T, topk]`` **global** ids (``-1`` / negative / ``>= N`` = skip,
            anywhere); ``sinks`` optional fp32 ``[H]`` natural-log logits not scaled by
            ``sm_scale``; ``topk_length`` optional int32 ``[T]`` (folded into the local ids);
            ``out`` optional ``[T, H, 512]`` buffer in the output dtype, written in place.
        group: the DCP process group (``None`` = the default group). Its rank is this rank's shard index.
        layout: ``'interleaved'`` or ``'contiguous'`` (see the module docstring).
        num_kv_rows: N, rows of the **global** pool.
        local_decode: ``DecodeInputs -> (out_r, lse_r)``: the sink-free decode of one shard;
            ``out_r`` ``[T, H, 512]``, best fp32 (it travels in fp32; a partial already rounded to bf16
            keeps that rounding; 0 on rows without a valid id), ``lse_r`` fp32 ``[T, H]``
            natural log (``-inf`` on rows without a valid id). It receives ``sinks=None``,
            ``out=None``, local ids and ``topk_length`` = owned ids per row (see ``compact_ids``). ``run()`` passes the
            kernel path the rule table chose (a path that returns an LSE); tests pass the float64 reference.
        dcp_world_size: optional expected group size (e.g. ``CallSpec.dcp_world_size``), checked.
        compact_ids: move this rank's owned ids to the front of each row and pass their count as
            ``topk_length`` (:func:`compact_local_indices`), so a kernel whose loop stops at
            ``topk_length`` does about ``topk / W`` work per rank instead of ``topk``. Off: the local
            call gets the uncompacted local ids (``-1`` where not owned) and ``topk_length=None``.

    Returns:
        ``(out, lse)``: ``out`` ``[T, H, 512]`` in the output dtype (q's dtype; bf16 for fp8 q),
        sink applied; ``lse`` fp32 ``[T, H]`` natural log, **sink excluded**, ``-inf`` on rows
        empty everywhere. ``out`` is ``inputs.out`` when given.

    Raises:
        ValueError: before the call's exchange, which a refusing rank still joins (see above; its error then carries
            :data:`REFUSED_NOTE`), when ``layout`` is unknown; ``num_kv_rows`` is not an
            int >= 0; ``group`` is not usable; ``dcp_world_size`` differs from the group size;
            ``inputs.q`` is not 3-D; ``inputs.indices`` is not int32 ``[T, topk]``; ``inputs.kv_cache`` is
            neither 2-D nor a paged uint8 ``[blocks, block_size, 656]``, or has a row count other than this rank's
            shard of ``num_kv_rows`` under ``layout``; ``inputs.sinks``/``topk_length``/``out`` have
            inconsistent shapes, or ``out`` another dtype than the output dtype; ``sinks`` is not fp32
            and on q's device (any stride: the merge reads a contiguous copy of strided ones); ``out`` is on
            another device, overlaps itself, or is an inference tensor outside ``torch.inference_mode()``;
            ``topk_length`` is not int32 on ``indices``' device; ``q``, ``kv_cache``, ``indices`` or ``out`` is not
            a tensor (``out`` may be None); ``indices``, ``topk_length``, ``sinks`` or
            ``out`` has no data beside a q with data, or a storage that does not hold its elements (freed or
            shrunk); ``local_decode`` is not callable, or returns
            anything but two real float tensors of the shapes above on q's device.

    Source: docs/DESIGN.md "Decode context parallel"; the merge is the split-KV combine of
    lightllm/sglang; vLLM ``cp_lse_ag_out_rs`` for the exchange pattern.
    """
    try:  # every check and the local decode: what may fail on this rank only comes before the exchange
        empty, part = _partial_state(inputs, group, layout, num_kv_rows, local_decode, dcp_world_size, compact_ids)
    except Exception as error:
        join_refused_call(inputs.q, group, error)
        raise
    if empty is not None:  # T = 0: every rank skips the exchange together
        return empty
    out_r, lse_r, inputs, out_dtype, world = part
    if world == 1:
        outs, lses = [out_r], [lse_r.float()]
    else:
        outs, lses = exchange_states(out_r, lse_r, group=group, wire_dtype=torch.float32)
    fused = _fused_merge(outs, lses, inputs.sinks, out_dtype, inputs.out)
    if fused is not None:
        return fused
    out32, lse = merge_states(outs, lses)
    out32 = sink_applied(out32, lse, inputs.sinks)  # merge_states checked the parts: apply_sink without its checks
    if inputs.out is not None:
        inputs.out.copy_(out32)
        return inputs.out, lse
    return out32.to(out_dtype), lse


def _partial_state(inputs: DecodeInputs, group: Optional[dist.ProcessGroup], layout: str, num_kv_rows: int,
                   local_decode: LocalDecode, dcp_world_size: Optional[int], compact_ids: bool):
    """:func:`dcp_sparse_mla_decode` up to its exchange: the checks, the local ids and the local decode. Returns
    ``((out, lse), None)`` for T = 0 (no exchange on any rank), else ``(None, (out_r, lse_r, inputs, out_dtype,
    world))`` with ``inputs``' sinks contiguous. Raises its caller's ``ValueError``s."""
    _check_layout(layout)
    _check_int("num_kv_rows", num_kv_rows, 0)
    if not callable(local_decode):
        raise ValueError(f"'local_decode' must be callable DecodeInputs -> (out, lse) (got {local_decode!r})")
    world, rank = group_size_rank(group)
    if dcp_world_size is not None and dcp_world_size != world:
        raise ValueError(f"'dcp_world_size' must equal the size of 'group' ({world}) (got {dcp_world_size!r})")
    for name in ("q", "kv_cache", "indices", "out"):  # (sinks and topk_length: their own checks below)
        value = getattr(inputs, name)
        if not isinstance(value, torch.Tensor) and (value is not None or name != "out"):
            allowed = "None or a torch.Tensor" if name == "out" else "a torch.Tensor"
            raise ValueError(f"'inputs.{name}' must be {allowed} (got {type(value).__name__})")
    q, idx = inputs.q, inputs.indices
    if q.dim() != 3:
        raise ValueError(f"'inputs.q' must be [T, H, 576] (got shape {tuple(q.shape)})")
    t, h, _ = q.shape
    if idx.dim() != 2 or idx.shape[0] != t or idx.dtype != torch.int32:
        raise ValueError(f"'inputs.indices' must be int32 [T={t}, topk] (got {idx.dtype} {tuple(idx.shape)})")
    expect_rows = check_shard(inputs, num_kv_rows, world, rank, layout)
    if inputs.sinks is not None and tuple(inputs.sinks.shape) != (h,):
        raise ValueError(f"'inputs.sinks' must be fp32 [H={h}] (got shape {tuple(inputs.sinks.shape)})")
    check_sinks(inputs.sinks, h, q.device)  # checked on every device before any collective
    # the tensors this function's own code reads or writes (the local decode checks the others as a call does), before
    # the sinks' copy below reads them: dense, not a lazy view nor a zero tensor, of q's kind, their storages whole
    named = tuple((f"inputs.{name}", getattr(inputs, name)) for name in _READ_HERE)
    for name, value in named:
        if isinstance(value, torch.Tensor):  # (what is not a tensor is its own check's to refuse, with what is allowed)
            require_tensor(name, value)
    check_data(q, named)
    if inputs.sinks is not None and not inputs.sinks.is_contiguous():  # the GPU merge reads them at unit stride
        inputs = inputs._replace(sinks=inputs.sinks.contiguous())
    check_topk_length(inputs.topk_length, t, idx.device, "inputs.topk_length", "indices")
    out_dtype = _out_dtype(q)
    if inputs.out is not None and (tuple(inputs.out.shape) != (t, h, D_V) or inputs.out.dtype != out_dtype):
        raise ValueError(
            f"'inputs.out' must be {out_dtype} [{t}, {h}, {D_V}] (got {inputs.out.dtype} {tuple(inputs.out.shape)})"
        )
    if inputs.out is not None and (inputs.out.device != q.device or overlaps_itself(inputs.out)):
        raise ValueError(f"'inputs.out' must be on {q.device}, like q, and not overlap itself (got "
                         f"{inputs.out.device}, strides {inputs.out.stride()})")
    if inputs.out is not None:
        check_out_writable(inputs.out, "inputs.out")  # not after the collectives, from the merge's copy

    if t == 0:  # every rank has the same T, so every rank skips the collectives together
        res = inputs.out if inputs.out is not None else q.new_empty((0, h, D_V), dtype=out_dtype)
        return (res, torch.empty((0, h), dtype=torch.float32, device=q.device)), None

    # Global -> local ids; positions past topk_length become -1.
    loc = local_indices(idx, world_size=world, rank=rank, layout=layout, num_kv_rows=num_kv_rows)
    if inputs.topk_length is not None:
        pos = torch.arange(idx.shape[1], device=idx.device)
        loc = torch.where(pos.unsqueeze(0) < inputs.topk_length.long().unsqueeze(1), loc, torch.full_like(loc, -1))
    local_len = None
    if compact_ids:
        loc, local_len = compact_local_indices(loc)

    if expect_rows == 0:
        # Nothing to attend to here (and kernels may reject a 0-row pool): an empty partial state.
        out_r = torch.zeros((t, h, D_V), dtype=torch.float32, device=q.device)
        lse_r = torch.full((t, h), float("-inf"), dtype=torch.float32, device=q.device)
    else:
        local = inputs._replace(indices=loc, sinks=None, topk_length=local_len, out=None)
        out_r, lse_r = _checked_local_result(local_decode(local), t, h, q.device)
    return None, (out_r, lse_r, inputs, out_dtype, world)


#: The dtypes a ``local_decode`` may return its partial ``out`` and ``lse`` in (both travel as fp32).
_PARTIAL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _checked_local_result(res: Any, t: int, h: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``local_decode``'s ``(out_r, lse_r)``, checked: two real floating tensors (:data:`_PARTIAL_DTYPES`) on
    ``device``, ``out_r`` ``[T, H, 512]`` and ``lse_r`` ``[T, H]`` (a list, integer or complex parts were merged or
    failed with an ``AttributeError``: a break test, sixtieth session).

    Raises:
        ValueError: naming ``local_decode``, what it returned and what is allowed.
    """
    want = f"a pair (out [{t}, {h}, {D_V}], lse [{t}, {h}]) of float tensors on {device}"
    if not isinstance(res, (tuple, list)) or len(res) != 2 or not all(isinstance(x, torch.Tensor) for x in res):
        got = (f"a {type(res).__name__} of {[type(x).__name__ for x in res]}" if isinstance(res, (tuple, list))
               else type(res).__name__)
        raise ValueError(f"'local_decode' must return {want} (got {got})")
    out_r, lse_r = res
    if (tuple(out_r.shape) != (t, h, D_V) or tuple(lse_r.shape) != (t, h) or out_r.dtype not in _PARTIAL_DTYPES
            or lse_r.dtype not in _PARTIAL_DTYPES or out_r.device != device or lse_r.device != device):
        raise ValueError(f"'local_decode' must return {want}, dtypes {[str(d) for d in _PARTIAL_DTYPES]} (got "
                         f"{out_r.dtype} {tuple(out_r.shape)} on {out_r.device} and {lse_r.dtype} "
                         f"{tuple(lse_r.shape)} on {lse_r.device})")
    return out_r, lse_r


def _fused_merge(outs, lses, sinks, out_dtype, out):
    """On a GPU with Triton: merge + sink in one kernel over strided views of the gathered parts.

    Returns ``None`` (use :func:`merge_states` + :func:`apply_sink`) on the CPU, without Triton, for fp32
    outputs, or for an ``out`` whose innermost stride is not 1 (the kernel stores whole rows; ``copy_`` takes
    any strides, as on the CPU).
    """
    if not outs[0].is_cuda or out_dtype == torch.float32:
        return None
    if out is not None and out.numel() and out.stride(-1) != 1:
        return None
    try:
        from mla_sink.paths.triton.merge import combine_states_triton
    except ImportError:
        return None
    part_out = _stack_view(outs)
    if part_out is None:
        part_out = torch.stack(outs)
    part_lse = torch.stack([x.float() for x in lses])
    t, h = part_lse.shape[1:]
    res = out if out is not None else torch.empty((t, h, D_V), dtype=out_dtype, device=part_out.device)
    lse = torch.empty((t, h), dtype=torch.float32, device=part_out.device)
    return combine_states_triton(part_out, part_lse, sinks, out=res, lse=lse)


def _stack_view(parts):
    """``[R, ...]`` strided view over equally spaced parts of one storage, without a copy, or None."""
    if len(parts) == 1:
        return parts[0].unsqueeze(0)
    p0 = parts[0]
    elt = p0.element_size()
    step = parts[1].data_ptr() - p0.data_ptr()
    if step <= 0 or step % elt or not all(p.is_contiguous() and p.shape == p0.shape and p.dtype == p0.dtype
                                          for p in parts):
        return None
    if any(parts[i].data_ptr() - p0.data_ptr() != i * step for i in range(len(parts))):
        return None
    return p0.as_strided((len(parts), *p0.shape), (step // elt, *p0.stride()))
