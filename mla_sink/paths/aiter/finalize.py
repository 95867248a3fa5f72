"""Finalize an AITER result: slice padded heads, zero empty rows, apply the sink through the LSE.

AITER's output on a token with no valid id is NaN, with LSE ``-inf`` (non-persistent) or ``+inf``
(persistent reduce). Emptiness is therefore decided from ``kv_indptr`` (the counts we built), never
from the returned values, and values of empty rows are replaced with ``torch.where`` (a NaN there
cannot leak, unlike a multiplication by 0).

Source: ROCm/aiter ``aiter/mla.py`` (``_fwd_kernel_stage2_asm``: with zero valid splits
``acc / e_sum`` = 0/0 and ``e_max + log(e_sum)`` = -inf); docs/DESIGN.md ("Empty rows come back as NaN
output with LSE -inf (non-persistent) or LSE +inf (persistent reduce)"); :mod:`mla_sink.core.lse`.
"""

from __future__ import annotations

from typing import Optional

import torch

from mla_sink.core.lse import sink_applied
from mla_sink.paths.aiter.buffers import row_counts


def finalize_aiter(
    o: torch.Tensor,
    lse: Optional[torch.Tensor],
    kv_indptr: torch.Tensor,
    *,
    num_heads: int,
    sinks: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype,
    out: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Turn AITER's raw ``(o, lse)`` into the final result.

    Steps, all on the device in fp32: slice heads ``[:, :num_heads]``; rows with no valid id get
    ``out = 0`` and ``lse = -inf``; with sinks, ``out *= sigmoid(lse - sink)``
    (:func:`mla_sink.core.lse.apply_sink`); cast to ``out_dtype``.

    Args:
        o: ``[T, Hp, 512]`` AITER's output (bf16; NaN on empty rows), Hp >= ``num_heads``.
        lse: fp32 ``[T, Hp]`` natural-log LSE, sink excluded, as AITER returned it (``±inf`` on empty
            rows), or ``None`` from a persistent call without LSE.
        kv_indptr: int32 ``[T + 1]``: the ragged indptr given to AITER; ``kv_indptr[t+1] == kv_indptr[t]``
            marks an empty row.
        num_heads: H, the caller's heads.
        sinks: optional fp32 ``[H]`` natural-log sink logits (``±inf`` allowed).
        out_dtype: dtype of the result (q's dtype; bf16 for fp8 q).
        out: optional ``[T, H, 512]`` buffer the result is copied into (and returned).

    Returns:
        ``(out, lse)``: ``out [T, H, 512]`` in ``out_dtype`` (0 on empty rows, sink applied);
        ``lse`` fp32 ``[T, H]`` natural log, sink excluded, ``-inf`` on empty rows, or ``None``.

    Raises:
        ValueError: sinks without an LSE; shapes that disagree.
    """
    T = o.shape[0]
    if o.dim() != 3 or o.shape[1] < num_heads:
        raise ValueError(f"'o' must be [T, Hp >= {num_heads}, 512] (got {tuple(o.shape)})")
    if kv_indptr.shape != (T + 1,):
        raise ValueError(f"'kv_indptr' must be [T + 1]=({T + 1},) (got {tuple(kv_indptr.shape)})")
    if sinks is not None and lse is None:
        raise ValueError("'sinks' need an LSE, but the AITER call returned none (persistent call without return_lse)")
    empty = row_counts(kv_indptr) == 0  # [T]
    o32 = o[:, :num_heads].float()
    o32 = torch.where(empty.view(T, 1, 1), torch.zeros((), dtype=o32.dtype, device=o32.device), o32)
    lse32 = None
    if lse is not None:
        if lse.dim() != 2 or lse.shape[0] != T or lse.shape[1] < num_heads:
            raise ValueError(f"'lse' must be [T={T}, Hp >= {num_heads}] (got {tuple(lse.shape)})")
        lse32 = lse[:, :num_heads].float()
        lse32 = torch.where(empty.view(T, 1), torch.full((), float("-inf"), device=lse32.device), lse32)
    if sinks is not None:
        o32 = sink_applied(o32, lse32, sinks)  # shapes fixed above: apply_sink without its checks
    result = o32.to(out_dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return result, lse32
