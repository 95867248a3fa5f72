"""Device buffers of an AITER call: ragged ``kv_indptr`` / ``kv_indices`` from the valid ids, built
with pure tensor ops into preallocated fixed-size buffers.

Nothing here synchronises with the host: no ``.item()``, no ``nonzero()``, no boolean-mask
indexing (all of which produce data-dependent shapes or block on the device). Every output has a
shape fixed by ``(T, topk)``, so the fill can be captured in a CUDA graph and replayed with new
indices. The compaction is a stable partition computed with ``cumsum`` and written with one
``scatter_`` per call: valid ids keep their order, invalid entries land in the unused tail.

Source: vllm-project/vllm ``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py`` (buffers of
``T * topk`` and ``T + 1`` preallocated once; its ``(topk_indices != -1).sum()`` + prefix copy assumes
``-1`` only at the end of a row, which this module does not).
"""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from mla_sink.paths.aiter.plan import AiterCall, AiterDecodeCall


def valid_id_mask(indices: torch.Tensor, num_kv_rows: int, topk_length: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bool ``[T, topk]``: ``0 <= id < num_kv_rows`` and position ``< topk_length[t]`` (when given).

    Args:
        indices: int32 ``[T, topk]`` global row ids; ``-1``, any negative id and ids ``>= N`` are invalid
            wherever they sit in the row.
        num_kv_rows: N, rows of ``kv_cache``.
        topk_length: optional int32 ``[T]``; positions ``>= topk_length[t]`` are invalid.

    Raises:
        ValueError: ``indices`` is not 2-D, or ``topk_length`` is not ``[T]``.
    """
    if indices.dim() != 2:
        raise ValueError(f"'indices' must be 2-D [T, topk] (got shape {tuple(indices.shape)})")
    mask = (indices >= 0) & (indices < num_kv_rows)
    if topk_length is not None:
        if topk_length.shape != (indices.shape[0],):
            raise ValueError(f"'topk_length' must have shape [T]=({indices.shape[0]},) "
                             f"(got {tuple(topk_length.shape)})")
        pos = torch.arange(indices.shape[1], device=indices.device, dtype=torch.int32)
        mask &= pos.unsqueeze(0) < topk_length.to(torch.int32).unsqueeze(1)
    return mask


@attrs.define(eq=False)
class AiterBuffers:
    """Preallocated int32 device buffers of one call shape (stable pointers across calls).

    Attributes:
        qo_indptr: ``[T + 1]`` = ``arange(T + 1)`` (constant).
        kv_last_page_lens: ``[T]`` ones (constant).
        kv_indptr: ``[T + 1]``, refilled per call: ``kv_indptr[t+1] - kv_indptr[t]`` = valid ids of token t.
        kv_indices: ``[T * topk]``, refilled per call; layout ``packed`` or ``row_strided`` (see
            :func:`fill_kv_buffers`); unused slots hold 0 (a valid row id, never read).
        num_kv_splits_indptr: ``[T + 1]`` = ``arange(T + 1) * num_kv_splits`` (constant) when the call
            fixes ``num_kv_splits`` on a non-persistent path, else ``None``.
    """

    qo_indptr: torch.Tensor
    kv_last_page_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    num_kv_splits_indptr: Optional[torch.Tensor] = None


def allocate_buffers(call: AiterCall, device: torch.device) -> AiterBuffers:
    """Allocate the buffers of ``call`` on ``device`` (once per call shape; see :class:`AiterWorkspace`).

    Args:
        call: the planned call (T, topk, layout, num_kv_splits).
        device: where the kernel runs.

    Returns:
        :class:`AiterBuffers` with the constant buffers filled and the per-call ones zeroed.
    """
    T, K = call.num_tokens, call.topk
    splits_indptr = None
    if isinstance(call, AiterDecodeCall) and call.num_kv_splits is not None:
        splits_indptr = torch.arange(T + 1, dtype=torch.int32, device=device) * call.num_kv_splits
    return AiterBuffers(
        qo_indptr=torch.arange(T + 1, dtype=torch.int32, device=device),
        kv_last_page_lens=torch.ones(T, dtype=torch.int32, device=device),
        kv_indptr=torch.zeros(T + 1, dtype=torch.int32, device=device),
        kv_indices=torch.zeros(T * K, dtype=torch.int32, device=device),
        num_kv_splits_indptr=splits_indptr,
    )


def fill_kv_buffers(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    indices: torch.Tensor,
    num_kv_rows: int,
    topk_length: Optional[torch.Tensor] = None,
    *,
    layout: str = "packed",
) -> None:
    """Write ragged ``kv_indptr`` and compacted ``kv_indices`` from the valid ids, in place, no host sync.

    With ``c_t`` = number of valid ids of token t (see :func:`valid_id_mask`), in row order:

    * ``kv_indptr = [0, c_0, c_0 + c_1, ...]`` (int32 ``[T + 1]``) in both layouts;
    * ``packed``: token t's valid ids at ``kv_indices[kv_indptr[t] : kv_indptr[t+1]]`` (what the
      non-persistent kernel reads);
    * ``row_strided``: token t's valid ids at ``kv_indices[t * topk : t * topk + c_t]`` (what the
      persistent kernel with sparse metadata reads);
    * every other slot holds 0.

    Args:
        kv_indptr: int32 ``[T + 1]`` output buffer.
        kv_indices: int32 ``[T * topk]`` output buffer.
        indices: int ``[T, topk]`` global row ids (``-1`` / negatives / ids ``>= N`` skipped anywhere).
        num_kv_rows: N.
        topk_length: optional int32 ``[T]`` (ids at positions ``>= topk_length[t]`` skipped).
        layout: ``packed`` or ``row_strided``.

    Raises:
        ValueError: a buffer of the wrong shape or dtype, or an unknown layout.

    Source: ROCm/aiter ``aiter/mla.py`` (non-persistent: ``kv_indptr`` offsets into ``kv_indices``);
    ``csrc/kernels/mla/metadata/v1_2_device.cuh`` (sparse persistent: token t starts at ``t * topk``).
    """
    T, K = indices.shape if indices.dim() == 2 else (None, None)
    mask = valid_id_mask(indices, num_kv_rows, topk_length)
    if kv_indptr.shape != (T + 1,) or kv_indptr.dtype != torch.int32:
        raise ValueError(f"'kv_indptr' must be int32 [T + 1]=({T + 1},) "
                         f"(got {kv_indptr.dtype} {tuple(kv_indptr.shape)})")
    if kv_indices.shape != (T * K,) or kv_indices.dtype != torch.int32:
        raise ValueError(f"'kv_indices' must be int32 [T * topk]=({T * K},) "
                         f"(got {kv_indices.dtype} {tuple(kv_indices.shape)})")
    if layout not in ("packed", "row_strided"):
        raise ValueError(f"'layout' must be 'packed' or 'row_strided' (got {layout!r})")

    m = mask.to(torch.int32)
    rank_valid = torch.cumsum(m, dim=1, dtype=torch.int32) - 1  # rank among the row's valid ids
    counts = m.sum(dim=1, dtype=torch.int32)
    kv_indptr[:1].zero_()
    torch.cumsum(counts, dim=0, dtype=torch.int32, out=kv_indptr[1:])
    if layout == "packed":
        # Stable partition of the whole [T * topk] buffer: all valid ids first (row order), then the rest.
        rank_invalid = torch.cumsum((1 - m).reshape(-1), dim=0, dtype=torch.int32).reshape(T, K) - 1
        start = kv_indptr[:-1].unsqueeze(1)
        total = kv_indptr[-1:].unsqueeze(1)
        dest = torch.where(mask, start + rank_valid, total + rank_invalid)
    else:
        # Stable partition inside each row's [t * topk, (t + 1) * topk) slot.
        rank_invalid = torch.cumsum(1 - m, dim=1, dtype=torch.int32) - 1
        row0 = (torch.arange(T, device=indices.device, dtype=torch.int32) * K).unsqueeze(1)
        dest = row0 + torch.where(mask, rank_valid, counts.unsqueeze(1) + rank_invalid)
    values = torch.where(mask, indices.to(torch.int32), torch.zeros((), dtype=torch.int32, device=indices.device))
    kv_indices.scatter_(0, dest.reshape(-1).to(torch.int64), values.reshape(-1))


def row_counts(kv_indptr: torch.Tensor) -> torch.Tensor:
    """Valid ids per token, int32 ``[T]``, from ``kv_indptr [T + 1]`` (no host sync)."""
    return kv_indptr[1:] - kv_indptr[:-1]
