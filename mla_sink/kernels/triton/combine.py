"""The split-KV combine kernel (``combine``): merges the fp32 partial states of a token's KV splits (or
of DCP ranks) and applies the sink once.

Source: the split-KV combine of lightllm/sglang ``decode_attention`` kernels; the programmatic dependent
launch (``griddepcontrol``) as FlashMLA launches its combine (``csrc/sm90/decode``, read, not copied) and
as Triton exposes it (``triton.language.extra.cuda.gdc_wait``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_sink.kernels.triton import math as kmath

try:  # griddepcontrol.wait (sm90+); only traced when WAIT_PRIMARY is set
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - older Triton
    gdc_wait = None

#: fp32 partial-output elements one combine program loads per round trip (64 registers a thread at 4
#: warps): as many splits as fit are loaded at once, so a program waits on memory once per chunk of
#: splits, not once per split (at T=2 with 16 splits the per-split loop was a chain of 32 dependent loads).
PARTIAL_ELEMS_PER_LOAD = 8192


def _sparse_mla_combine_kernel(
    PART_OUT, PART_LSE, SINKS, OUT, LSE,
    num_heads, num_splits,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, SPLITS_PER_LOAD: tl.constexpr,
    HAS_SINKS: tl.constexpr, WAIT_PRIMARY: tl.constexpr,
):
    """Stage 2: merge the fp32 partial states of the splits of one (token, head block, block of
    BLOCK_D value columns); apply the sink once. The LSE is written by the first column block. A split
    whose LSE is ``-inf`` (no valid id) is never read. ``WAIT_PRIMARY``: launched as a programmatic
    dependent of the kernel that writes the partials; wait for it (and its memory) first."""
    if WAIT_PRIMARY:
        gdc_wait()
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)

    pl = PART_LSE + pid_t * stride_plt + offs_s[:, None] * stride_pls + offs_h[None, :]
    lses = tl.load(pl, mask=(offs_s[:, None] < num_splits) & mask_h[None, :], other=float("-inf"))
    m = tl.max(lses, 0)  # [BLOCK_H]
    empty = m == float("-inf")
    m_safe = tl.where(empty, 0.0, m)
    l_sum = tl.sum(tl.exp2(lses - m_safe[None, :]), 0)

    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    offs_c = tl.arange(0, SPLITS_PER_LOAD)
    for s0 in range(0, num_splits, SPLITS_PER_LOAD):
        hc = ((s0 + offs_c) < num_splits)[:, None] & mask_h[None, :]  # [splits of the chunk, heads]
        ls = tl.load(PART_LSE + pid_t * stride_plt + (s0 + offs_c)[:, None] * stride_pls + offs_h[None, :], mask=hc,
                     other=float("-inf"))
        w = tl.exp2(ls - m_safe[None, :])  # 0 for a split with no valid id
        po = (PART_OUT + pid_t * stride_pt + (s0 + offs_c)[:, None, None] * stride_ps
              + offs_h[None, :, None] * stride_ph + offs_d[None, None, :])
        o = tl.load(po, mask=(hc & (w > 0.0))[:, :, None], other=0.0)
        acc += tl.sum(w[:, :, None] * o, 0)

    l_safe = tl.where(empty, 1.0, l_sum)
    out = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_safe + tl.log2(l_safe))
    if HAS_SINKS:
        sink = tl.load(SINKS + offs_h, mask=mask_h, other=float("-inf"))
        out = out * kmath.sink_scale(1.0, sink, lse2, empty)[:, None]
    o_ptr = OUT + pid_t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=mask_h[:, None])
    if pid_d == 0:
        tl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / kmath.LOG2E, mask=mask_h)


combine_jit = triton.jit(_sparse_mla_combine_kernel)


def splits_per_load(splits: int, block_h: int, block_d: int) -> int:
    """Splits a combine program loads per round trip: a power of two, at most the split count padded to
    one, at most :data:`PARTIAL_ELEMS_PER_LOAD` partial elements (``block_h x block_d`` each)."""
    padded = 1 << max(0, (splits - 1).bit_length())
    fit = max(1, PARTIAL_ELEMS_PER_LOAD // (block_h * block_d))
    return min(padded, 1 << (fit.bit_length() - 1))


def combine_constexprs(splits: int, has_sinks: bool, block_h: int, block_d: int, wait_primary: bool = False) -> dict:
    """The constexpr arguments of a combine launch over ``splits`` partials with ``block_h x block_d`` tiles;
    ``wait_primary``: launched with ``launch_pdl=True`` after the kernel writing the partials (sm90+)."""
    return dict(BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_S=1 << max(0, (splits - 1).bit_length()),
                SPLITS_PER_LOAD=splits_per_load(splits, block_h, block_d), HAS_SINKS=has_sinks,
                WAIT_PRIMARY=wait_primary)


def combine_launch_args(T: int, H: int, splits: int, out_strides: tuple, has_sinks: bool, block_h: int,
                        block_d: int, wait_primary: bool = False) -> tuple:
    """``(grid, constexprs, static)`` of a combine launch merging fp32 partials ``[T, splits, H, 512]``
    (contiguous) and base-2 LSEs ``[T, splits, H]`` into ``out`` (``out_strides``: its token and head
    strides) and a contiguous fp32 ``lse [T, H]``; ``block_h x block_d`` (heads x value columns, ``block_d``
    dividing 512) is the tile of one program (a tuning table's ``combine_block_h`` / ``combine_block_d``);
    ``wait_primary``: see :func:`combine_constexprs`. The split count is padded to a power of two inside
    the kernel."""
    d_v = 512
    constexprs = combine_constexprs(splits, has_sinks, block_h, block_d, wait_primary)
    static = dict(num_heads=H, num_splits=splits, stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v,
                  stride_plt=splits * H, stride_pls=H, stride_ot=out_strides[0], stride_oh=out_strides[1],
                  stride_lt=H, stride_lh=1)
    return (-(-H // block_h), T, d_v // block_d), constexprs, static
