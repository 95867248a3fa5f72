"""Sparse MLA decode for sm90 (Hopper) in Triton's Gluon dialect, on the "seesaw" schedule: two consumer
warpgroups take alternate blocks of ids, each computes the full 576-wide scores of its own block, and each
owns one half of the output, to which both warpgroups' weights contribute.

Same semantics as :mod:`mla_sink.kernels.triton.portable` (float64 reference in
:mod:`mla_sink.core.reference`): sink fused in the epilogue, natural-log sink-free LSE, ``-1`` / negative /
``>= N`` ids and ids past ``topk_length`` skipped wherever they sit, empty rows give ``out = 0`` and
``lse = -inf``, unreferenced KV rows never read, 64-bit row offsets. With ``SPLIT`` a program covers one
range of ids and writes an fp32 partial state (``out`` normalised by its own sum, base-2 LSE) that the
combine kernel (:mod:`mla_sink.kernels.triton.combine`) merges, applying the sink once. bf16 or fp16 q
with KV of the same dtype, or an fp8 cache through the fp8 producer and decoder
(:mod:`mla_sink.kernels.gluon.seesaw_fp8`: per-tensor e4m3fn, or the 656-byte V3.2 rows, whose programs that meet scales
bf16 cannot hold exactly are flagged in ``REDO`` and recomputed by a second, gated launch that reads every scale
exactly: ``KV_DS_EXACT``, :mod:`mla_sink.kernels.gluon.seesaw_exact`); no soft cap (``tables/triton_tuning.yaml`` sends
everything else elsewhere).

One CTA = one token x 64 heads x one range of ids, three warpgroups:

* the producer (a worker partition with few registers) gathers the token's KV rows with ``cp.async`` into
  two slots, slot 0 for the even blocks of 64 ids and slot 1 for the odd ones. Each slot is two halves with
  their own ``ready`` / ``free`` mbarriers: ``lo`` (value columns 0-255) and ``hi`` (columns 256-511 and
  the 64 RoPE columns), so a half is refilled as soon as its last reader is done with it. q is gathered
  once, first. An fp8 cache's raw bytes are copied the same way, and each consumer decodes its own
  block's halves in place before its scores (:func:`~mla_sink.kernels.gluon.seesaw_fp8.decode_half`);
* consumer 0 (the default partition) computes ``S0 = q K0^T`` (64 heads x 64 ids, 576 deep) of the even
  block, consumer 1 (a worker partition) ``S1`` of the odd block, at the same time;
* the running max is shared: consumer 0 publishes ``m0 = max(m, rowmax S0)``, consumer 1 takes
  ``m1 = max(m0, rowmax S1)`` and publishes it back (two small shared-memory buffers, one named barrier each
  way); consumer 0 rescales its weights ``P0 = 2^(S0 - m0)`` by ``2^(m0 - m1)`` once ``m1`` is known;
* consumer 0 owns ``O[:, 0:256]``, consumer 1 ``O[:, 256:512]``: each applies its own ``P`` from registers
  (``wgmma`` with A in registers) and the other's ``P`` from shared memory. ``P0`` is written over the
  RoPE columns of slot 0 (which ``S0`` no longer needs), ``P1`` into a buffer of its own;
* the row sums are kept per consumer (each of its own ``P``, both relative to the shared max) and added
  once at the end; each consumer writes its half of ``out`` (through a slot half that only it reads, so
  that whole rows go out in 16-byte stores), consumer 1 the LSE.

Scores are kept in base 2 (``log2 e`` folded into the scale); a row still without a valid id keeps its
max at ``-inf``, and every exponent is taken against a finite max (0 for such rows), so no ``inf - inf``
arises. Masked ``cp.async`` lanes zero-fill, so a skipped id contributes a zero row whose score is then
set to ``-inf`` (weight exactly 0).

Source: the seesaw schedule of FlashMLA's sm90 sparse prefill kernel (``csrc/sm90/prefill/sparse/
phase1.cuh``, deepseek-ai/FlashMLA 9241ae3) and TileLang's reproduction (tile-ai/tilelang
``examples/deepseek_v32``, PR #1636), read, not copied; the Gluon primitives of Triton's Gluon tutorials
(``python/tutorials/gluon``: async copies, mbarriers, wgmma, ``warp_specialize``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_sink.kernels.gluon.gather import gather_q, ids_ok, pair_ids
from mla_sink.kernels.gluon.pdl import launch_dependents, wait_primary
from mla_sink.kernels.gluon.seesaw_common import (
    NB_M_ODD,
    NB_P_EVEN,
    NB_P_ODD,
    O_L,
    P_L,
    ROW_L,
    _consumer_start,
    _epilogue,
    _even_max,
    _named_arrive,
    _named_sync,
    _odd_max,
    _opaque_zero,
    _safe,
    _signal,
)
from mla_sink.kernels.gluon.seesaw_exact import _consumer_even_ds, _consumer_odd_ds
from mla_sink.kernels.gluon.seesaw_fp8 import (
    COPIERS,
    FIRST_HALF_ARRIVALS,
    KV_DS_EXACT,
    KV_DS_MLA,
    KV_E4M3,
    KV_HALF,
    decode_half,
    fp8_producer,
    stop_flag,
)
from mla_sink.kernels.gluon.tuning import seesaw_consumer_regs, seesaw_producer_regs

#: Heads of one CTA: the wgmma M of the score and output tiles (one warpgroup: 4 warps x 16 rows).
HEAD_BLOCK = 64
#: Ids of one block: the N of a score tile and the K of the P V product.
BLOCK_N = 64
#: Value columns each consumer owns (512 / 2).
HALF_V = 256
#: Rows the producer gathers per cp.async call: a whole 64-id block (16 and 32 measured 1% slower at
#: T=256: Triton separates calls into one buffer by a barrier).
GATHER_ROWS = 64


@gluon.jit
def _gather_cols(KV, dst, ids_smem, id0, stride_kv, col0,
                 NROWS: gl.constexpr, NCOLS: gl.constexpr, ROWS: gl.constexpr, layout: gl.constexpr):
    """cp.async ``NROWS`` gathered KV rows (their ids at ``ids_smem[id0 ..]``, ``-1`` for a skipped id),
    columns ``col0 .. col0 + NCOLS``, into ``dst [NROWS, NCOLS]``, ``ROWS`` rows per batch; a skipped id
    zero-fills and reads nothing."""
    offs_c = gl.arange(0, NCOLS, layout=gl.SliceLayout(0, layout))
    for r in gl.static_range(NROWS // ROWS):
        ids = ids_smem.slice(id0 + r * ROWS, ROWS).load(gl.SliceLayout(1, layout))
        rows = KV + ids.to(gl.int64) * stride_kv + col0
        async_copy.async_copy_global_to_shared(dst.slice(r * ROWS, ROWS), rows[:, None] + offs_c[None, :],
                                               mask=(ids >= 0)[:, None])


@gluon.jit
def _producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, q_ready, ready_lo, ready_hi, free_lo,
              free_hi, pid_h, pid_t, idx_base, start, end, num_pairs, num_heads, num_rows, stride_qt, stride_qh,
              stride_kv, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr,
              ROWS: gl.constexpr):
    """Worker partition (one warpgroup) of bf16 / fp16 KV: q once, then each pair of blocks half by half,
    in the order the consumers free the halves (even lo, odd hi, even hi, odd lo)."""
    half_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # 16-byte copies, a row per warp
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    gather_q(Q, q_lo, q_hi, q_rope, q_ready, pid_h, pid_t, num_heads, stride_qt, stride_qh,
              BLOCK_H, HALF_V, D_ROPE, ROWS, half_l, rope_l)

    # the ids of the next pair are loaded while this one is gathered, and staged in shared memory for the
    # gathers (whose layouts spread rows differently)
    ids_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ids_next = pair_ids(IDX, idx_base, start, end, nrows, 2 * BLOCK_N, ids_l)
    for j in range(num_pairs):
        phase = (j & 1) ^ 1  # the first wait on a fresh 'free' barrier passes
        gl.thread_barrier()  # every thread is done reading the previous pair's ids
        ids_smem.store(ids_next)
        gl.thread_barrier()
        ids_next = pair_ids(IDX, idx_base, start + 2 * (j + 1) * BLOCK_N, end, nrows, 2 * BLOCK_N, ids_l)
        mbarrier.wait(free_lo.index(0), phase)
        _gather_cols(KV, k_lo.index(0), ids_smem, 0, stride_kv, 0, BLOCK_N, HALF_V, ROWS, half_l)
        async_copy.mbarrier_arrive(ready_lo.index(0), increment_count=False)
        mbarrier.wait(free_hi.index(1), phase)
        _gather_cols(KV, k_hi.index(1), ids_smem, BLOCK_N, stride_kv, HALF_V, BLOCK_N, HALF_V, ROWS, half_l)
        _gather_cols(KV, k_rope.index(1), ids_smem, BLOCK_N, stride_kv, 2 * HALF_V, BLOCK_N, D_ROPE, BLOCK_N, rope_l)
        async_copy.mbarrier_arrive(ready_hi.index(1), increment_count=False)
        mbarrier.wait(free_hi.index(0), phase)
        _gather_cols(KV, k_hi.index(0), ids_smem, 0, stride_kv, HALF_V, BLOCK_N, HALF_V, ROWS, half_l)
        _gather_cols(KV, k_rope.index(0), ids_smem, 0, stride_kv, 2 * HALF_V, BLOCK_N, D_ROPE, BLOCK_N, rope_l)
        async_copy.mbarrier_arrive(ready_hi.index(0), increment_count=False)
        mbarrier.wait(free_lo.index(1), phase)
        _gather_cols(KV, k_lo.index(1), ids_smem, BLOCK_N, stride_kv, 0, BLOCK_N, HALF_V, ROWS, half_l)
        async_copy.mbarrier_arrive(ready_lo.index(1), increment_count=False)


@gluon.jit
def _any_producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, redo_smem, sc_smem, q_ready,
                  ready_lo, ready_hi, free_lo, free_hi, pid_h, pid_t, idx_base, start, end, num_pairs,
                  num_heads, num_rows, stride_qt, stride_qh, stride_kv, kv_block_size,
                  BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr,
                  ROWS: gl.constexpr, KV_FMT: gl.constexpr, ROW_BYTES: gl.constexpr):
    """The producer partition of the cache's format: :func:`_producer` (bf16 / fp16 rows by cp.async
    straight into the slots) or :func:`~mla_sink.kernels.gluon.seesaw_fp8.fp8_producer` (fp8 bytes into the
    slots, which the consumers decode)."""
    if KV_FMT == KV_HALF:
        _producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, q_ready, ready_lo, ready_hi,
                  free_lo, free_hi, pid_h, pid_t, idx_base, start, end, num_pairs, num_heads, num_rows,
                  stride_qt, stride_qh, stride_kv, BLOCK_H, BLOCK_N, HALF_V, D_ROPE, ROWS)
    else:
        fp8_producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, redo_smem, sc_smem, q_ready,
                     ready_lo, ready_hi, free_lo, free_hi, pid_h, pid_t, idx_base, start, end, num_pairs,
                     num_heads, num_rows, stride_qt, stride_qh, stride_kv, kv_block_size,
                     BLOCK_H, BLOCK_N, HALF_V, D_ROPE, KV_FMT, ROW_BYTES)


@gluon.jit
def _go_on(j, num_pairs, first_ready, redo_smem, KV_FMT: gl.constexpr):
    """Whether a consumer takes pair ``j``: one is left and, for V3.2 rows, the producer has not stopped
    before it. The decision is published before the consumer's first half of the pair (``first_ready``)
    is handed over, filled or not, so it is read once that half's phase has completed
    (:func:`~mla_sink.kernels.gluon.seesaw_fp8.stop_flag`); the consumer's own wait on it in the pair
    then passes at once."""
    go = j < num_pairs
    if KV_FMT == KV_DS_MLA:
        if go:
            mbarrier.wait(first_ready, j & 1)
        go = go & (stop_flag(redo_smem, j) == 0)
    return go


@gluon.jit
def _consumer_even(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, p_odd,
                   redo_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                   bar_l_even, bar_l_odd,
                   pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                   stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
                   BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                   HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Default partition, consumer 0: the even blocks' scores and the value columns 0-255."""
    o_l: gl.constexpr = O_L
    p_l: gl.constexpr = P_L
    row_l: gl.constexpr = ROW_L
    dtype: gl.constexpr = q_lo.dtype
    qk_scale, offs_n, nrows, m_i, l_i, o, s_zero = _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                   BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
    # No wgmma is left in flight across the loop's back edge, and every wait rebinds the values it waited on:
    # ptxas cannot follow a wgmma in flight across the back edge, or a value copied or read while its wgmma
    # is in flight (the accumulator merged with another path, a wait whose result is dropped), and then
    # serialises every wgmma of the kernel (C7514 / C7515), each 16-deep step waiting for the one before:
    # 358 vs 314 us at H=128, T=256 (BENCHMARKS.md, 2026-12-01 sixth session). Issuing the next pair's
    # scores while the odd block's P V runs, as FlashMLA's warpgroup 0 does, measured slower (333 us).
    j = num_pairs * 0
    go = _go_on(j, num_pairs, ready_lo.index(0), redo_smem, KV_FMT)
    while go:
        phase = j & 1
        even = _opaque_zero(j)
        odd = even + 1
        _, ok = ids_ok(IDX, idx_base, start + 2 * j * BLOCK_N + offs_n, end, nrows)
        mbarrier.wait(ready_lo.index(0), phase)
        if KV_FMT != KV_HALF:  # fp8: this consumer decodes its own block (both halves before the first
            # wgmma: decoding the second while the first half's wgmma runs spilled and measured 5-8% slower)
            decode_half(k_lo.index(even), k_rope.index(even), k_rope, 0, 0, False, KV_FMT)
            mbarrier.wait(ready_hi.index(0), phase)
            decode_half(k_hi.index(even), k_rope.index(even), k_rope, 0, 0, True, KV_FMT)
        sc = warpgroup_mma(q_lo.index(even), k_lo.index(even).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(ready_hi.index(0), phase)
        sc = warpgroup_mma(q_hi.index(even), k_hi.index(even).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma(q_rope.index(even), k_rope.index(even).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
        m_new, alpha, p, l_i = _even_max(sc, ok, qk_scale, m_i, l_i, m_even, j)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_l), k_lo.index(even), o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _signal(free_lo.index(0))  # the producer refills this half while the odd block's max is awaited
        # the shared max after the odd block: rescale this block's weights to it and hand them over
        _named_sync(NB_M_ODD + j * 0)
        m_odd_new = m_odd.load(row_l)
        c = gl.exp2(m_new - _safe(m_odd_new))  # 0 when this block had no valid id (p is 0 then)
        k_rope.index(even).store((p * c[:, None]).to(dtype))  # over the RoPE columns S0 no longer needs
        fence_async_shared()
        _named_arrive(NB_P_EVEN + j * 0)
        o = o * gl.convert_layout(c, gl.SliceLayout(1, o_l))[:, None]
        l_i = l_i * c
        m_i = m_odd_new
        _named_sync(NB_P_ODD + j * 0)
        acc = warpgroup_mma(p_odd, k_lo.index(odd), o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _signal(free_lo.index(1))  # the odd block's slot half and P1 are read
        j += 1
        go = _go_on(j, num_pairs, ready_lo.index(0), redo_smem, KV_FMT)
    # k_lo[0] is read by this consumer only (scores and P V of the even blocks): free once its loop is done. An
    # unsplit V3.2 program that stopped (both consumers left at the same pair) writes nothing: the exact recompute
    # writes it all. Split launches keep the epilogue: skipping it there cost power-of-two caches 2-4 us at T = 2
    # and 64 (BENCHMARKS.md, twenty-third session)
    if (KV_FMT != KV_DS_MLA) or SPLIT or (j >= num_pairs):
        _epilogue(o, o, m_i, KV_SCALE, l_i, l_even, l_odd, bar_l_even, bar_l_odd, k_lo.index(0), SINKS, OUT, LSE,
                  PART_OUT, PART_LSE,
                  pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
                  stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
                  0, False, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)


@gluon.jit
def _consumer_odd(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, redo_ptr, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope,
                  p_odd, redo_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                  bar_l_even, bar_l_odd,
                  pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                  stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
                  BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                  HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Worker partition, consumer 1: the odd blocks' scores and the value columns 256-511; writes the LSE
    and, for V3.2 rows, the CTA's flag at ``redo_ptr`` (1: stopped at an inexact scale; 0 otherwise)."""
    o_l: gl.constexpr = O_L
    p_l: gl.constexpr = P_L
    dtype: gl.constexpr = q_lo.dtype
    qk_scale, offs_n, nrows, m_i, l_i, o, s_zero = _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                   BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
    j = num_pairs * 0
    go = _go_on(j, num_pairs, ready_hi.index(1), redo_smem, KV_FMT)
    while go:
        phase = j & 1
        even = _opaque_zero(j)
        odd = even + 1
        _, ok = ids_ok(IDX, idx_base, start + (2 * j + 1) * BLOCK_N + offs_n, end, nrows)
        mbarrier.wait(ready_hi.index(1), phase)  # the producer fills the odd slot's hi half first
        if KV_FMT != KV_HALF:
            decode_half(k_hi.index(odd), k_rope.index(odd), k_rope, 0, 0, True, KV_FMT)
            mbarrier.wait(ready_lo.index(1), phase)
            decode_half(k_lo.index(odd), k_rope.index(odd), k_rope, 0, 0, False, KV_FMT)
        sc = warpgroup_mma(q_hi.index(even), k_hi.index(odd).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sc = warpgroup_mma(q_rope.index(even), k_rope.index(odd).permute((1, 0)), sc, is_async=True)
        mbarrier.wait(ready_lo.index(1), phase)
        sc = warpgroup_mma(q_lo.index(even), k_lo.index(odd).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
        m_new, alpha, p, l_i = _odd_max(sc, ok, qk_scale, m_i, l_i, m_even, m_odd, j)
        m_i = m_new
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        p_h = p.to(dtype)
        # this block's own P V first, then P1 is handed over while it runs (a store reads the wgmma's A
        # registers, which ptxas allows in flight). Consumer 0 has read the previous pair's P1: its wait for
        # that P V came before its arrive on NB_M_EVEN of this pair, which this consumer took above.
        acc = warpgroup_mma(gl.convert_layout(p_h, p_l), k_hi.index(odd), o, is_async=True)
        p_odd.store(p_h)
        fence_async_shared()
        _named_arrive(NB_P_ODD + j * 0)
        _named_sync(NB_P_EVEN + j * 0)
        acc = warpgroup_mma(k_rope.index(even), k_hi.index(even), acc, is_async=True)  # P0, rescaled to m1
        # each wait rebinds what it waited on (see _consumer_even: ptxas and wgmma in flight)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _signal(free_hi.index(1))  # this block's own P V is done: its slot half is refilled first
        o = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _signal(free_hi.index(0))
        j += 1
        go = _go_on(j, num_pairs, ready_hi.index(1), redo_smem, KV_FMT)
    if KV_FMT == KV_DS_MLA:  # 1 when the producer stopped before pair j (its word read above), else 0
        gl.store(redo_ptr, gl.where(j < num_pairs, 1, 0))
    # k_hi[1] is read by this consumer only (scores and P V of the odd blocks): free once its loop is done; nothing
    # written by a stopped unsplit V3.2 program (see _consumer_even)
    if (KV_FMT != KV_DS_MLA) or SPLIT or (j >= num_pairs):
        _epilogue(o, o, m_i, KV_SCALE, l_i, l_odd, l_even, bar_l_odd, bar_l_even, k_hi.index(1), SINKS, OUT, LSE,
                  PART_OUT, PART_LSE,
                  pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
                  stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
                  HALF_V, True, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)


@gluon.jit
def sparse_mla_decode_seesaw_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, REDO,
    sm_scale, num_heads, num_rows, topk, ids_per_split, kv_block_size: gl.constexpr,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr,
    HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, SPLIT: gl.constexpr,
    ROWS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    KV_FMT: gl.constexpr, ROW_BYTES: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr, GATED: gl.constexpr,
):
    """One CTA = (head block, id range, token). See the module docstring. ``LAUNCH_DEPENDENTS``: let the
    next kernel, launched as a programmatic dependent (the combine), start at once on the SMs this grid
    leaves idle; it waits for this grid's completion before reading what it wrote. ``REDO`` (int32 ``[T, head
    blocks x splits]``, a word per program): :data:`KV_DS_MLA` writes each program's flag there; with ``GATED``
    (:data:`KV_DS_EXACT`, the same grid after it) a program whose word is 0 returns at once, once the grid before
    it has completed (``griddepcontrol.wait``: the library launches it as a programmatic dependent after a split
    launch; a no-op after a plain launch)."""
    redo_ptr = REDO + gl.program_id(2).to(gl.int64) * (gl.num_programs(0) * gl.num_programs(1)) + \
        gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)
    if GATED:  # launched as a programmatic dependent of the flagging grid: its flags are read once it completes
        wait_primary(gl.program_id(0))
        if gl.load(redo_ptr) == 0:
            return
    if LAUNCH_DEPENDENTS:
        launch_dependents(gl.program_id(0))
    pid_h = gl.program_id(0)
    pid_s = gl.program_id(1)
    pid_t = gl.program_id(2).to(gl.int64)
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    start = pid_s * ids_per_split
    end = gl.minimum(start + ids_per_split, t_end)
    num_pairs = gl.cdiv(gl.maximum(end - start, 0), 2 * BLOCK_N)
    idx_base = pid_t * stride_it
    dtype: gl.constexpr = Q.dtype.element_ty
    half_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF_V], dtype)
    rope_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], dtype)
    q_lo = gl.allocate_shared_memory(dtype, [1, BLOCK_H, HALF_V], half_sl)  # [1, ..]: indexed like the slots
    q_hi = gl.allocate_shared_memory(dtype, [1, BLOCK_H, HALF_V], half_sl)
    q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], rope_sl)
    k_lo = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF_V], half_sl)
    k_hi = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF_V], half_sl)
    k_rope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, D_ROPE], rope_sl)  # slot 0's also holds P0
    vec_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    m_even = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_sl)
    m_odd = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_sl)
    l_even = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_sl)
    l_odd = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_sl)
    ids_smem = gl.allocate_shared_memory(gl.int32, [2 * BLOCK_N], vec_sl)  # the producer's ids of a pair
    flag_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    # KV_DS_MLA: the producer's stop decision of each pair, one row per pair parity (seesaw_fp8.stop_flag)
    if KV_FMT == KV_DS_EXACT:
        # the tile scales of each slot's ids (row 4 * slot + tile, their mantissas once decoded) and the Horner
        # ratios (seesaw_fp8.decode_half); P1 lives over the odd slot's RoPE tile, whose [64, 64] buffer would not
        # leave room for them (227 KB)
        sc_smem = gl.allocate_shared_memory(gl.float32, [16, BLOCK_N], flag_sl)
        p_odd = k_rope  # not read
        redo_smem = ids_smem  # not read
    else:
        sc_smem = ids_smem  # not read
        p_odd = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], rope_sl)
        redo_smem = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N], flag_sl)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    ready_lo = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    ready_hi = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    free_lo = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    free_hi = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    bar_l_even = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    bar_l_odd = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    # every producer thread arrives once its copies land (fp8: the raw bytes, decoded by a consumer); a
    # V3.2 pair's first halves also wait for the release of its stop decision (seesaw_fp8.FIRST_HALF_ARRIVALS)
    first: gl.constexpr = FIRST_HALF_ARRIVALS if KV_FMT == KV_DS_MLA else COPIERS
    mbarrier.init(q_ready, count=COPIERS)
    mbarrier.init(ready_lo.index(0), count=first)
    mbarrier.init(ready_hi.index(1), count=first)
    mbarrier.init(ready_lo.index(1), count=COPIERS)
    mbarrier.init(ready_hi.index(0), count=COPIERS)
    for s in gl.static_range(2):
        mbarrier.init(free_lo.index(s), count=1)  # one arrive from the consumer that reads the half last
        mbarrier.init(free_hi.index(s), count=1)
    mbarrier.init(bar_l_even, count=1)
    mbarrier.init(bar_l_odd, count=1)
    if KV_FMT == KV_DS_EXACT:
        gl.warp_specialize([
            (_consumer_even_ds, (IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi,
                                 k_rope, sc_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo,
                                 free_hi, bar_l_even, bar_l_odd,
                                 pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                                 stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph,
                                 stride_plt, stride_pls, BLOCK_H, BLOCK_N, HALF_V, HAS_SINKS, SPLIT, KV_FMT)),
            (_consumer_odd_ds, (IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi,
                                k_rope, sc_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo,
                                free_hi, bar_l_even, bar_l_odd,
                                pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                                stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph,
                                stride_plt, stride_pls, BLOCK_H, BLOCK_N, HALF_V, HAS_SINKS, SPLIT, KV_FMT)),
            (_any_producer, (Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, redo_smem, sc_smem,
                             q_ready, ready_lo, ready_hi, free_lo, free_hi, pid_h, pid_t, idx_base, start, end,
                             num_pairs, num_heads, num_rows, stride_qt, stride_qh, stride_kv, kv_block_size,
                             BLOCK_H, BLOCK_N, HALF_V, D_ROPE, ROWS, KV_FMT, ROW_BYTES)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_even, (IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi,
                              k_rope, p_odd, redo_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi,
                              free_lo, free_hi, bar_l_even, bar_l_odd,
                              pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                              stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                              stride_pls, BLOCK_H, BLOCK_N, HALF_V, HAS_SINKS, SPLIT, KV_FMT)),
            (_consumer_odd, (IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, redo_ptr, q_lo, q_hi, q_rope, k_lo,
                             k_hi, k_rope, p_odd, redo_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo,
                             ready_hi, free_lo, free_hi, bar_l_even, bar_l_odd,
                             pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                             stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                             stride_pls, BLOCK_H, BLOCK_N, HALF_V, HAS_SINKS, SPLIT, KV_FMT)),
            (_any_producer, (Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, redo_smem, sc_smem,
                             q_ready, ready_lo, ready_hi, free_lo, free_hi, pid_h, pid_t, idx_base, start, end,
                             num_pairs, num_heads, num_rows, stride_qt, stride_qh, stride_kv, kv_block_size,
                             BLOCK_H, BLOCK_N, HALF_V, D_ROPE, ROWS, KV_FMT, ROW_BYTES)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


#: ``KV_FMT`` of each KV dtype key the kernel reads (mla_sink.core.dtypes); the tuning table decides
#: which calls come here.
KV_FORMATS = {"bf16": KV_HALF.value, "fp16": KV_HALF.value, "fp8_e4m3": KV_E4M3.value,
              "fp8_ds_mla": KV_DS_MLA.value}
#: ``KV_FMT`` of the exact reading of V3.2 rows (:data:`~mla_sink.kernels.gluon.seesaw_fp8.KV_DS_EXACT`).
KV_DS_EXACT_FMT = KV_DS_EXACT.value


def seesaw_launch_args(q, kv_cache, indices, *, num_kv_splits: int, ids_per_split: int, out_strides: tuple,
                       kv_dtype: str = "bf16", exact: bool = False, gated: bool = False):
    """``(grid, scalars, constexprs, options)`` of a :func:`sparse_mla_decode_seesaw_kernel` launch on these
    tensors' metadata (the launchers' shared part: :func:`sparse_mla_decode_seesaw` and the prepared runner
    of :mod:`mla_sink.paths.triton.launch`). ``scalars`` are the integer arguments by name (fixed per call
    signature); ``out_strides`` the ``(token, head)`` strides of ``out``; ``kv_dtype`` the KV dtype key
    (:data:`KV_FORMATS`). An fp8 cache is passed to the kernel as bytes (``kv_cache.view(torch.uint8)``):
    its strides are in bytes, a paged V3.2 cache ``[blocks, block_size, 656]`` has ``block_size`` rows
    per block stride. ``exact`` (``"fp8_ds_mla"`` only): read every tile scale exactly
    (:data:`KV_DS_EXACT_FMT`; the recompute of the programs the first launch flagged), ``gated``: only the
    programs whose ``REDO`` word is nonzero."""
    from mla_sink.core import kv_layout
    from mla_sink.core.records import MAX_ROWS

    T, H, d_qk = q.shape
    topk = indices.shape[1]
    splits = num_kv_splits
    d_v = 2 * HALF_V
    kv_fmt = KV_FORMATS[kv_dtype]
    v32 = kv_fmt == KV_DS_MLA.value
    if exact:
        if not v32:
            raise ValueError(f"the seesaw kernel reads only fp8_ds_mla rows exactly (got kv_dtype {kv_dtype!r})")
        kv_fmt = KV_DS_EXACT_FMT
    num_rows = kv_layout.num_rows(kv_cache)
    # pages that follow each other without a gap are the flat pool they are (kv_layout.row_addressing)
    kv_block_size, stride_kv = kv_layout.row_addressing(kv_cache)
    scalars = dict(
        num_heads=H, num_rows=min(num_rows, MAX_ROWS), topk=topk, ids_per_split=ids_per_split,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_it=indices.stride(0),
        stride_ot=out_strides[0], stride_oh=out_strides[1], stride_lt=H, stride_lh=1,
        stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v, stride_plt=splits * H, stride_pls=H,
    )
    # the rows' page size as a constexpr, as gluon_fp8's launch args give it: a paged cache's page arithmetic is a
    # shift and a mask, not an integer division per row
    constexprs = dict(kv_block_size=kv_block_size,
                      BLOCK_H=HEAD_BLOCK, BLOCK_N=BLOCK_N, HALF_V=HALF_V, D_ROPE=d_qk - d_v,
                      HAS_SINKS=False, HAS_TOPK_LEN=False, SPLIT=splits > 1, ROWS=GATHER_ROWS,
                      CONSUMER_REGS=seesaw_consumer_regs(kv_dtype), PRODUCER_REGS=seesaw_producer_regs(kv_dtype),
                      KV_FMT=kv_fmt,
                      ROW_BYTES=kv_layout.ROW_BYTES if v32 else d_qk,
                      # the library launches what follows a split launch as a programmatic dependent: the
                      # combine, or after V3.2 rows the gated exact recompute (and the combine after that)
                      # (paths/triton/launch.py)
                      LAUNCH_DEPENDENTS=splits > 1, GATED=gated)
    grid = (-(-H // HEAD_BLOCK), splits, T)
    return grid, scalars, constexprs, dict(num_warps=4)


def sparse_mla_decode_seesaw(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None, out=None,
                             lse=None, num_kv_splits: int = 1, ids_per_split=None, kv_dtype: str = "bf16",
                             kv_scale=None, combine_tile: tuple = (16, 128), redo=None, exact: bool = False,
                             pdl: bool = True):
    """Launch :func:`sparse_mla_decode_seesaw_kernel` (CUDA sm90 only), with the split-KV combine
    (:mod:`mla_sink.kernels.triton.combine`, which applies the sink once) when ``num_kv_splits > 1``.
    Tests and benchmarks; the library launches through :mod:`mla_sink.paths.triton.launch`.

    Args:
        q: ``[T, H, 576]`` bf16 or fp16 CUDA tensor, innermost stride 1, head stride a multiple of 8
            elements.
        kv_cache: by ``kv_dtype``: ``"bf16"`` / ``"fp16"``: ``[N, 576]`` of q's dtype, row stride a
            multiple of 8 elements; ``"fp8_e4m3"``: ``[N, 576]`` float8_e4m3fn with ``kv_scale``;
            ``"fp8_ds_mla"``: uint8 ``[N, 656]`` or ``[blocks, block_size, 656]`` V3.2 rows (bf16 q),
            row / block strides multiples of 16 bytes. Innermost stride 1.
        indices: int32 ``[T, topk]``, innermost stride 1 (``-1`` / negative / ``>= N`` skipped).
        sinks: optional fp32 ``[H]`` natural-log sink logits. sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]`` (contiguous). out: optional ``[T, H, 512]`` buffer
            (innermost stride 1); lse: optional fp32 ``[T, H]`` contiguous buffer.
        num_kv_splits: programs per (token, head block), each over ``ids_per_split`` ids (default: topk
            split evenly, rounded up to a multiple of 128, the ids of one block pair).
        kv_scale: fp32 ``[1]`` dequantisation scale of an ``"fp8_e4m3"`` cache.
        combine_tile: ``(heads, value columns)`` of a combine program (the library takes it from its
            tuning row; the default is the sm90 rows' tile).
        redo: ``"fp8_ds_mla"`` only: optional int32 ``[T, ceil(H / 64) * num_kv_splits]`` contiguous buffer
            for the per-program flags (1: a row of the program's ids has a scale that does not decode exactly
            into bf16, and the program stopped early; a second launch of the same grid, gated by these flags,
            recomputes exactly those programs, reading every scale exactly). Allocated here when not given.
        exact: ``"fp8_ds_mla"`` only: one launch that reads every scale exactly in every program (no flags).
        pdl: launch the combine as a programmatic dependent of the seesaw (which lets it launch early);
            False: one plain launch after the other (for comparison).

    Returns:
        ``(out, lse)``: ``out [T, H, 512]`` (q's dtype) = sink-free output times ``sigmoid(lse - sink)``,
        0 on rows with no valid id; ``lse`` fp32 ``[T, H]``, natural log, sink excluded, ``-inf`` on rows
        with no valid id.

    Inputs are validated by the caller; no host synchronisation (CUDA-graph safe).
    """
    import torch

    from mla_sink.kernels.gluon import launch_buffers
    from mla_sink.kernels.triton.combine import combine_jit, combine_launch_args

    T, H, _ = q.shape
    topk = indices.shape[1]
    out, lse, sm_scale = launch_buffers(q, out, lse, sm_scale)
    if T == 0 or H == 0:
        return out, lse
    pair = 2 * BLOCK_N
    if ids_per_split is None:
        ids_per_split = -(-(-(-max(topk, 1) // num_kv_splits)) // pair) * pair
    splits = num_kv_splits
    kv = kv_cache if KV_FORMATS[kv_dtype] == KV_HALF.value else kv_cache.view(torch.uint8)
    ds = KV_FORMATS[kv_dtype] == KV_DS_MLA.value
    # (exact, gated) of each launch: V3.2 rows take the flagging launch and the gated exact one, or one exact
    launches = [(exact, False)] if exact or not ds else [(False, False), (True, True)]
    if splits > 1:
        part_out = torch.empty((T, splits, H, 2 * HALF_V), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((T, splits, H), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = lse
    if redo is None and ds:
        redo = torch.empty((T, -(-H // HEAD_BLOCK) * splits), dtype=torch.int32, device=q.device)
    for i, (is_exact, gated) in enumerate(launches):
        grid, scalars, constexprs, options = seesaw_launch_args(q, kv, indices, num_kv_splits=splits,
                                                                ids_per_split=ids_per_split,
                                                                out_strides=(out.stride(0), out.stride(1)),
                                                                kv_dtype=kv_dtype, exact=is_exact, gated=gated)
        constexprs.update(HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None,
                          LAUNCH_DEPENDENTS=pdl and splits > 1 and i == len(launches) - 1)  # the combine's
        sparse_mla_decode_seesaw_kernel[grid](
            q, kv, indices, sinks if sinks is not None else lse,
            topk_length if topk_length is not None else indices, out, lse, part_out, part_lse,
            kv_scale if kv_scale is not None else lse, redo if redo is not None else lse, float(sm_scale),
            **scalars, **constexprs, **options)
    if splits > 1:
        cgrid, cconst, cstatic = combine_launch_args(T, H, splits, (out.stride(0), out.stride(1)), sinks is not None,
                                                     *combine_tile, wait_primary=pdl)
        combine_jit[cgrid](part_out, part_lse, sinks if sinks is not None else lse, out, lse, **cstatic, **cconst,
                           num_warps=4, num_stages=1, launch_pdl=pdl)
    return out, lse
