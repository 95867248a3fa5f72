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

#: Fewest splits whose loads a combine program issues together (``kmath.add_split_group``), the most,
#: and the fp32 tile values one group may hold (64 registers a thread at 4 warps): a program waits on the L2 once
#: per group, so narrow tiles (small T, where the plan narrows the columns to cover the SMs) take bigger groups.
#: H200, twenty-fifth session (benchmarks/combine_group_ab_twentyfifth_2026-12-03.json; BENCHMARKS.md), groups of
#: 16 at 16 x 32 tiles against groups of four, outputs bitwise equal: T=2 0.05-0.75 us faster at every head count and
#: cache (H=32: bf16 12.37 against 12.75, e4m3 13.74 against 14.43, V3.2 13.85 against 14.60); T=16 within noise.
#: ptxas (Triton 3.6, sm90) issues every load of a 16-split group first; 32 splits at 16 x 32 (two groups) hoist
#: both groups' loads and spill 104 bytes at 255 registers, and measured faster still (V3.2 H=32 T=2 above).
MIN_GROUP = 4
MAX_GROUP = 16
GROUP_VALUES = 8192


def _sparse_mla_combine_kernel(
    PART_OUT, PART_LSE, SINKS, OUT, LSE,
    num_heads, num_splits,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_SINKS: tl.constexpr, WAIT_PRIMARY: tl.constexpr, GROUP: tl.constexpr, ZERO_WEIGHT_NAN: tl.constexpr,
):
    """Stage 2: merge the fp32 partial states of the splits of one (token, head block, block of
    BLOCK_D value columns); apply the sink once. The LSE is written by the first column block. A split
    whose LSE is ``-inf`` (no valid id, or every score ``-inf``) has weight 0: with ``ZERO_WEIGHT_NAN`` (the
    library's split launches) it adds 0 times its partial, so a NaN there (``0 * inf`` in its ``P V``) stays NaN
    as unsplit; without it (the DCP merge) it adds nothing, whatever its partial holds (``kmath.add_split``). A
    split whose LSE is ``+inf`` makes the row's LSE ``+inf`` and its output NaN (``kmath.splits_max_and_sum``).
    ``WAIT_PRIMARY``:
    launched as a programmatic dependent of the kernel that writes the partials; wait for it (and its
    memory) first."""
    if WAIT_PRIMARY:
        gdc_wait()
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)

    n_live = tl.where(mask_h, num_splits, 0)[:, None]  # splits to read per head row (0: padded head)
    base_o = PART_OUT + pid_t * stride_pt + offs_h[:, None] * stride_ph + offs_d[None, :]
    base_l = PART_LSE + pid_t * stride_plt + offs_h[:, None]
    # the first group's loads are issued before the LSEs' reduction, so that both wait on the L2 together: their
    # addresses need no LSE, only their math needs the max (one round trip fewer a program; the loads of the
    # primary's partials are the combine's whole critical path at small T)
    first = kmath.split_group_states(base_o, base_l, 0, stride_ps, stride_pls, n_live, GROUP)
    m_safe, empty, l_sum = kmath.splits_max_and_sum(PART_LSE, pid_t, offs_s, offs_h, mask_h, num_splits,
                                                    stride_plt, stride_pls)

    # the splits GROUP at a time (4, 8 or 16), each group's loads issued before any of its math: their loads do
    # not depend on each other, so a program waits on memory about once per group (a loop over the splits
    # waited twice per split, 32 round trips at 16 splits). Per-head values stay [BLOCK_H, 1] columns of
    # the tile's layout (no layout conversion in the loop).
    m_col = m_safe[:, None]
    acc = kmath.add_split_states(tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32), first, m_col, GROUP,
                                 ZERO_WEIGHT_NAN)
    for s in tl.static_range(GROUP, BLOCK_S, GROUP):
        acc = kmath.add_split_group(acc, base_o, base_l, s, stride_ps, stride_pls, n_live, m_col, GROUP,
                                    ZERO_WEIGHT_NAN)

    kmath.combine_store(acc, m_safe, empty, l_sum, SINKS, OUT, LSE, pid_t, pid_d, offs_h, offs_d, mask_h,
                        stride_ot, stride_oh, stride_lt, stride_lh, HAS_SINKS)


combine_jit = triton.jit(_sparse_mla_combine_kernel)


def combine_constexprs(splits: int, has_sinks: bool, block_h: int, block_d: int, wait_primary: bool = False,
                       zero_weight_nan: bool = True) -> dict:
    """The constexpr arguments of a combine launch over ``splits`` partials with ``block_h x block_d`` tiles
    (``GROUP``: splits whose loads are issued together, :data:`MIN_GROUP` to :data:`MAX_GROUP`); ``wait_primary``:
    launched with ``launch_pdl=True`` after the kernel writing the partials (sm90+); ``zero_weight_nan``: the
    partials are the library's own split launches' (exactly 0 where a split has no valid id), so a NaN in a split
    of weight 0 is kept (``0 * inf`` as unsplit); ``False`` for the DCP merge, which leaves such a part out."""
    block_s = 1 << max(0, (splits - 1).bit_length())
    # splits loaded together: as many as GROUP_VALUES holds, 4, 8 or 16 (kmath.add_split_group)
    group = max(MIN_GROUP, min(MAX_GROUP, block_s, GROUP_VALUES // (block_h * block_d)))
    return dict(BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_S=block_s,
                HAS_SINKS=has_sinks, WAIT_PRIMARY=wait_primary, GROUP=group, ZERO_WEIGHT_NAN=zero_weight_nan)


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
