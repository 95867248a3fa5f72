"""BASELINE, not part of the library: the split-KV combine kernel as it was until the fifth session of
2026-12-01 (one split per loop step, each load waiting on the one before: the split's LSE, then its
partial), kept so that benchmarks/t2_launch_ab.py can time the combine that loads several splits per round
trip (:mod:`mla_sink.kernels.triton.combine`) against it on the same data.

It merges the fp32 partial states of a token's KV splits (or of DCP ranks) and applies the sink once.

Source: the split-KV combine of lightllm/sglang ``decode_attention`` kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_sink.kernels.triton import math as kmath


def _sparse_mla_combine_kernel(
    PART_OUT, PART_LSE, SINKS, OUT, LSE,
    num_heads, num_splits,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Stage 2: merge the fp32 partial states of the splits of one (token, head block, block of
    BLOCK_D value columns); apply the sink once. The LSE is written by the first column block."""
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)

    m_safe, empty, l_sum = kmath.splits_max_and_sum(PART_LSE, pid_t, offs_s, offs_h, mask_h, num_splits,
                                                    stride_plt, stride_pls)

    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for s in range(0, num_splits):
        ls = tl.load(PART_LSE + pid_t * stride_plt + s * stride_pls + offs_h, mask=mask_h, other=float("-inf"))
        w = tl.exp2(ls - m_safe)  # 0 for a split with no valid id
        po = PART_OUT + pid_t * stride_pt + s * stride_ps + offs_h[:, None] * stride_ph + offs_d[None, :]
        o = tl.load(po, mask=mask_h[:, None] & (w[:, None] > 0.0), other=0.0)
        acc += w[:, None] * o

    kmath.combine_store(acc, m_safe, empty, l_sum, SINKS, OUT, LSE, pid_t, pid_d, offs_h, offs_d, mask_h,
                        stride_ot, stride_oh, stride_lt, stride_lh, HAS_SINKS)


combine_jit = triton.jit(_sparse_mla_combine_kernel)


def combine_launch_args(T: int, H: int, splits: int, out_strides: tuple, has_sinks: bool, block_h: int,
                        block_d: int) -> tuple:
    """``(grid, constexprs, static)`` of a combine launch merging fp32 partials ``[T, splits, H, 512]``
    (contiguous) and base-2 LSEs ``[T, splits, H]`` into ``out`` (``out_strides``: its token and head
    strides) and a contiguous fp32 ``lse [T, H]``; ``block_h x block_d`` (heads x value columns, ``block_d``
    dividing 512) is the tile of one program (a tuning table's ``combine_block_h`` / ``combine_block_d``).
    The split count is padded to a power of two inside the kernel."""
    d_v = 512
    constexprs = dict(BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_S=1 << max(0, (splits - 1).bit_length()),
                      HAS_SINKS=has_sinks)
    static = dict(num_heads=H, num_splits=splits, stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v,
                  stride_plt=splits * H, stride_pls=H, stride_ot=out_strides[0], stride_oh=out_strides[1],
                  stride_lt=H, stride_lh=1)
    return (-(-H // block_h), T, d_v // block_d), constexprs, static
