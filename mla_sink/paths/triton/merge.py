"""The DCP merge on a GPU (and through Triton's interpreter on the CPU): R ranks' sink-free partial states merged
and the sink applied once, in one launch of the split-KV combine kernel (:mod:`mla_sink.kernels.triton.combine`)
over strided views of the gathered parts. Called by :mod:`mla_sink.core.dcp` after its all-gather; the tile comes
from ``tables/dcp_merge.yaml`` (:func:`mla_sink.paths.triton.plan.dcp_merge_tile`) unless the caller names one.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from mla_sink.core.records import D_V
from mla_sink.core.validate import check_merge_buffers
from mla_sink.kernels.triton.math import LOG2E as _LOG2E
from mla_sink.paths.triton.plan import (MAX_GRID_TOKENS, MIN_BLOCK_H, all_heads_block, dcp_merge_tile, is_pow2,
                                        token_ranges)

Result = tuple[torch.Tensor, torch.Tensor]
LOG2E = _LOG2E.value  # the kernels' one definition (mla_sink.kernels.triton.math)


def _merge_tile(tile, num_heads: int) -> tuple[int, int]:
    """``(heads, value columns)`` of an explicit DCP merge ``tile`` (see :func:`combine_states_triton`), heads
    ``None`` resolved to every head (``max(16, next_pow2(H))``, as ``tables/dcp_merge.yaml``'s null).

    Raises:
        ValueError: not a pair; heads not ``None`` or a power of two from 16 to that bound; columns not a power
            of two dividing 512.
    """
    every = all_heads_block(num_heads)
    pair = tuple(tile) if isinstance(tile, (tuple, list)) else ()
    if len(pair) == 2:
        cbh = every if pair[0] is None else pair[0]
        cbd = pair[1]
        if is_pow2(cbh) and is_pow2(cbd) and MIN_BLOCK_H <= cbh <= every and cbd <= D_V:
            return cbh, cbd
    raise ValueError(f"'tile' must be (heads, value columns): heads None (every head) or a power of two from "
                     f"{MIN_BLOCK_H} to {every} (H={num_heads}), columns a power of two dividing {D_V} (got {tile!r})")


def combine_states_triton(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    *,
    out: torch.Tensor,
    lse: torch.Tensor,
    tile: Optional[tuple] = None,
) -> Result:
    """Merge R sink-free partial states and apply the sink once, in one kernel (the DCP merge).

    Args:
        part_out: ``[R, T, H, 512]`` partial outputs (fp32/bf16/fp16, innermost stride 1, any other
            strides: e.g. views into an all-gather buffer); a part whose LSE is ``-inf`` contributes
            nothing, whatever it holds; one whose LSE is ``+inf`` makes its row's ``lse`` ``+inf`` and ``out``
            NaN, as :func:`mla_sink.core.lse.merge_states`.
        part_lse: fp32 ``[R, T, H]`` natural-log, sink-free partial LSEs (``-inf`` = no valid id).
        sinks: optional fp32 ``[H]`` natural-log sink logits.
        out: ``[T, H, 512]`` output buffer (any float dtype, innermost stride 1).
        lse: fp32 ``[T, H]`` output buffer: ``logsumexp_r(lse_r)``, natural log, sink excluded.
        tile: optional ``(heads, value columns)`` of one program: heads ``None`` (every head) or a power of two
            from 16 to ``max(16, next_pow2(H))``, columns a power of two dividing 512; default: the row of
            ``tables/dcp_merge.yaml`` for the arch of ``part_out``'s device
            (:func:`mla_sink.paths.triton.plan.dcp_merge_tile`).

    Returns:
        ``(out, lse)``, with ``out = sum_r out_r exp(lse_r - lse) * sigmoid(lse - sink)``; rows empty in
        every part (and every row when ``R = 0``) give ``out = 0``, ``lse = -inf``. The kernel takes the LSEs in
        base 2 as fp32: a finite LSE above about 2.36e38 becomes ``+inf`` there. Same algebra as
        :func:`mla_sink.core.lse.merge_states` followed by :func:`mla_sink.core.lse.apply_sink`, in one pass over the
        parts.

    Raises:
        ValueError: a tensor of the wrong type, shape, dtype, layout or device
            (:func:`mla_sink.core.validate.check_merge_buffers`); a ``tile`` other than the ones above.
    """
    from mla_sink.kernels.triton.combine import combine_constexprs, combine_jit
    from mla_sink.kernels.triton.interpreter import interpreted, interpreter_stdlib

    check_merge_buffers(part_out, part_lse, sinks, out, lse)
    R, T, H, _ = part_out.shape
    if tile is not None:
        cbh, cbd = _merge_tile(tile, H)
    if T == 0 or H == 0:
        return out, lse
    lse2 = (part_lse.float() * LOG2E).permute(1, 0, 2).contiguous()  # [T, R, H], base 2 as the kernel keeps it
    interp = part_out.device.type == "cpu"
    combine = interpreted("combine") if interp else combine_jit
    if tile is None:
        from mla_sink.core.platform import detect_platform

        cbh, cbd = dcp_merge_tile(detect_platform(part_out.device, tensor="part_out").arch, H)
    dummy = lse2.new_empty(1)
    with interpreter_stdlib() if interp else contextlib.nullcontext():
        for a, b in token_ranges(T, MAX_GRID_TOKENS):  # the tokens sit on the grid's y dimension
            _merge_launch(combine, (-(-H // cbh), b - a, D_V // cbd), part_out[:, a:b], lse2[a:b],
                          sinks if sinks is not None else dummy, out[a:b], lse[a:b], H, R,
                          combine_constexprs(R, sinks is not None, cbh, cbd, zero_weight_nan=False))
    return out, lse


def _merge_launch(combine: Any, grid: tuple, part_out: torch.Tensor, lse2: torch.Tensor, sinks: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, H: int, R: int, constexprs: dict) -> None:
    """One launch of the DCP merge (:func:`combine_states_triton`) over the tokens of ``out``."""
    combine[grid](
        part_out, lse2, sinks, out, lse,
        H, R,
        part_out.stride(1), part_out.stride(0), part_out.stride(2),
        lse2.stride(0), lse2.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        **constexprs, num_warps=4, num_stages=1,
    )
