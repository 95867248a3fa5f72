"""Sparse MLA decode for sm90 (Hopper) in Triton's Gluon dialect, on the "seesaw" schedule: two consumer
warpgroups take alternate blocks of ids, each computes the full 576-wide scores of its own block, and each
owns one half of the output, to which both warpgroups' weights contribute.

Same semantics as :mod:`mla_sink.kernels.triton.portable` (float64 reference in
:mod:`mla_sink.core.reference`): sink fused in the epilogue, natural-log sink-free LSE, ``-1`` / negative /
``>= N`` ids and ids past ``topk_length`` skipped wherever they sit, empty rows give ``out = 0`` and
``lse = -inf``, unreferenced KV rows never read, 64-bit row offsets. With ``SPLIT`` a program covers one
range of ids and writes an fp32 partial state (``out`` normalised by its own sum, base-2 LSE) that the
combine kernel (:mod:`mla_sink.kernels.triton.combine`) merges, applying the sink once. bf16 or fp16 q
with KV of the same dtype, or an fp8 cache through the fp8 producer and decoder (:mod:`mla_sink.kernels.gluon.seesaw_fp8`:
per-tensor e4m3fn, or the 656-byte V3.2 rows, whose programs that meet scales bf16 cannot hold exactly are
flagged in ``REDO`` and recomputed by a second, gated launch that reads every scale exactly: ``KV_DS_EXACT``,
:func:`_consumer_even_ds` / :func:`_consumer_odd_ds`); no soft cap (``tables/triton_tuning.yaml`` sends
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
from mla_sink.kernels.gluon.math import LOG2E, sink_scale
from mla_sink.kernels.gluon.pdl import launch_dependents
from mla_sink.kernels.gluon.seesaw_fp8 import (
    COPIERS,
    DS_TILE,
    FIRST_HALF_ARRIVALS,
    KV_DS_EXACT,
    KV_DS_MLA,
    KV_E4M3,
    KV_HALF,
    decode_half,
    fp8_producer,
    stash_row,
    stop_flag,
)
from mla_sink.kernels.gluon.tuning import seesaw_producer_regs

#: Heads of one CTA: the wgmma M of the score and output tiles (one warpgroup: 4 warps x 16 rows).
HEAD_BLOCK = 64
#: Ids of one block: the N of a score tile and the K of the P V product.
BLOCK_N = 64
#: Value columns each consumer owns (512 / 2).
HALF_V = 256
#: Rows the producer gathers per cp.async call: a whole 64-id block (16 and 32 measured 1% slower at
#: T=256: Triton separates calls into one buffer by a barrier).
GATHER_ROWS = 64
#: Registers per thread of the second consumer worker (as many as consumer 0 gets). 12 warps share 64K registers,
#: and the default consumer gets what the two workers leave (216, with the producer's 72): moving registers to it
#: (232, for a software-pipelined loop) measured slower (BENCHMARKS.md, sixth session). With an fp8 cache the
#: consumers' decoding spills a few scalars (ptxas: 32-76 bytes, a few loads per block pair). The producer's
#: registers (addresses and masks; it only copies, for fp8 caches too) depend on the KV dtype: the rows of
#: ``tables/gluon_seesaw.yaml`` (:func:`mla_sink.kernels.gluon.tuning.seesaw_producer_regs`).
CONSUMER_REGS = 216
#: The consumers' register layouts: a score tile ``[64 heads, 64 ids]`` and an output half ``[64, 256]``
#: as wgmma accumulators (one warpgroup), a block's weights as the A operand of P V, and per-head rows.
S_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
O_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]))
P_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
ROW_L = gl.constexpr(gl.SliceLayout(1, S_L))
#: KV_DS_EXACT: a consumer's output half as two ``[64, 128]`` accumulators (one per tile scale), the weights of one
#: tile as their A operand, and a block's per-id values (scale mantissas, Horner ratios) in the score columns.
O2_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
P2_L = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O2_L, k_width=2))
COL_L = gl.constexpr(gl.SliceLayout(0, S_L))


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
def _producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, q_ready, ready_lo, ready_hi, free_lo, free_hi,
              pid_h, pid_t, idx_base, start, end, num_pairs, num_heads, num_rows, stride_qt, stride_qh, stride_kv,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr,
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
def _opaque_zero(j):
    """0, computed from the loop counter ``j`` in a way the compiler cannot see through. The consumers
    index their slots with it: with constant slot indices every wgmma descriptor of the loop (one per
    16-deep step, about a hundred) is loop-invariant, gets hoisted out of the loop and spills; computed
    per iteration they stay in uniform registers, as in a ring indexed by the iteration."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [j], dtype=gl.int32, is_pure=True, pack=1)


#: Hardware named barriers (``bar.arrive`` / ``bar.sync`` IDs) through which the two consumers (8 warps,
#: 256 threads) hand each other the maxima and the weights, as FlashMLA's sm90 kernels do: an arrive does
#: not wait and needs no warpgroup barrier before it, a sync waits for the other side's 128 arrivals. Triton
#: uses IDs 0-3 in this kernel (its partitions' ``bar.sync 0/2/3, 128`` and the CTA's ``barrier.sync 1``).
#: Every arrive has its sync in the same pair, and no barrier is arrived at twice before its sync: each
#: arrive of pair j + 1 comes after a sync on the other consumer's later arrive of pair j.
NB_M_EVEN = gl.constexpr(8)
NB_M_ODD = gl.constexpr(9)
NB_P_EVEN = gl.constexpr(10)
NB_P_ODD = gl.constexpr(11)


@gluon.jit
def _named_arrive(bar_id):
    """``bar.arrive bar_id, 256``: this warpgroup's 128 threads count towards the two consumers' barrier
    ``bar_id`` (an int32 scalar) and go on; their earlier shared-memory writes are visible to the threads
    that complete the matching :func:`_named_sync`."""
    gl.inline_asm_elementwise("bar.arrive $1, 256; // $0", "=r,r", [bar_id], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _named_sync(bar_id):
    """``bar.sync bar_id, 256``: wait until the other consumer's 128 threads have arrived at ``bar_id``."""
    gl.inline_asm_elementwise("bar.sync $1, 256; // $0", "=r,r", [bar_id], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _signal(bar):
    """Every thread of this warpgroup is past this point (its shared-memory writes visible): one arrive."""
    gl.thread_barrier()
    mbarrier.arrive(bar)


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
def _masked_scores(sc, ok, qk_scale):
    """Base-2 scores of a block, ``-inf`` where the id is invalid."""
    return gl.where(ok[None, :], sc * qk_scale, float("-inf"))


@gluon.jit
def _safe(m):
    """A running max to take exponents against: 0 while the row has no valid id (``-inf``)."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _qk_scale(sm_scale, KV_SCALE, KV_FMT: gl.constexpr):
    """The base-2 score scale ``sm_scale log2 e``, times ``kv_scale`` for a per-tensor e4m3 cache (whose
    tiles hold the unscaled codes; the epilogue scales the output by it too)."""
    qk_scale = sm_scale * LOG2E
    if KV_FMT == KV_E4M3:
        qk_scale = qk_scale * gl.load(KV_SCALE)
    return qk_scale


@gluon.jit
def _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                    HALF_V: gl.constexpr, KV_FMT: gl.constexpr):
    """A consumer's state before its first pair, once q is in shared memory: ``(qk_scale, offs_n, nrows,
    m_i, l_i, o, s_zero)`` (base-2 score scale, id offsets of a block, the pool's rows as uint32, running
    max ``-inf`` and sum 0 per head, the zeroed output half and a zero score tile)."""
    qk_scale = _qk_scale(sm_scale, KV_SCALE, KV_FMT)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=ROW_L)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=ROW_L)
    o = gl.zeros([BLOCK_H, HALF_V], gl.float32, layout=O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    mbarrier.wait(q_ready, 0)
    return qk_scale, offs_n, nrows, m_i, l_i, o, s_zero


@gluon.jit
def _softmax_step(s, m_ref, m_i, l_i):
    """One block's online-softmax step in base 2: the new running max ``max(m_ref, rowmax s)`` (``m_ref``:
    this consumer's max, or the one the other consumer published), the factor ``alpha`` that rescales this
    consumer's state from ``m_i``, the weights ``p`` and the rescaled row sums. Exponents are taken against
    a finite max (:func:`_safe`), so a row without a valid id gives ``p = 0``, never NaN."""
    m_new = gl.maximum(m_ref, gl.max(s, axis=1))
    m_use = _safe(m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    return m_new, alpha, p, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _epilogue(acc, acc_b, m_i, KV_SCALE, l_own, l_mine, l_theirs, l_done_mine, l_done_theirs, stage, SINKS, OUT, LSE,
              PART_OUT, PART_LSE,
              pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
              stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
              COL0: gl.constexpr, WRITE_LSE: gl.constexpr, BLOCK_H: gl.constexpr, HALF_V: gl.constexpr,
              HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Add the other consumer's row sums, then write this consumer's half of ``out`` (or of the partial
    output) and, with ``WRITE_LSE``, the LSE. ``out`` goes through ``stage``, a ``[64, 256]`` slot half that
    only this consumer reads and that no copy fills any more: the accumulator layout would store 4 bytes a
    thread, 16 bytes a row per warp instruction, which took 4-6 us a CTA (BENCHMARKS.md, eleventh session);
    read back row-major, each warp stores whole 512-byte rows in 16-byte vectors. ``KV_DS_EXACT``: the half comes as
    two ``[64, 128]`` tiles, ``acc`` and ``acc_b`` (one per tile scale); otherwise ``acc`` is the half and
    ``acc_b`` is not read."""
    row_l: gl.constexpr = ROW_L
    two: gl.constexpr = KV_FMT == KV_DS_EXACT
    if two:
        o_l: gl.constexpr = O2_L
        ncols: gl.constexpr = DS_TILE
    else:
        o_l: gl.constexpr = O_L
        ncols: gl.constexpr = HALF_V
    l_mine.store(l_own)
    _signal(l_done_mine)
    mbarrier.wait(l_done_theirs, 0)
    l_i = l_own + l_theirs.load(row_l)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse2 = gl.where(empty_row, float("-inf"), m_i + gl.log2(l_safe))
    offs_hs = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_l)
    hmask = offs_hs < num_heads
    scale = 1.0 / l_safe
    if KV_FMT == KV_E4M3:  # the tiles hold the unscaled codes
        scale = scale * gl.load(KV_SCALE)
    if HAS_SINKS and not SPLIT:
        sink = gl.load(SINKS + offs_hs, mask=hmask, other=float("-inf"))
        scale = sink_scale(scale, sink, lse2, empty_row)
    scale_o = gl.convert_layout(scale, gl.SliceLayout(1, o_l))[:, None]
    out = acc * scale_o
    if two:
        out_b = acc_b * scale_o
    offs_ho = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_l))
    offs_do = COL0 + gl.arange(0, ncols, layout=gl.SliceLayout(0, o_l))
    omask = (offs_ho < num_heads)[:, None]
    if SPLIT:
        po = PART_OUT + pid_t * stride_pt + pid_s * stride_ps + offs_ho.to(gl.int64)[:, None] * stride_ph
        gl.store(po + offs_do[None, :], out, mask=omask)
        if two:
            gl.store(po + DS_TILE + offs_do[None, :], out_b, mask=omask)
        if WRITE_LSE:
            gl.store(PART_LSE + pid_t * stride_plt + pid_s * stride_pls + offs_hs, lse2, mask=hmask)
    else:
        if two:
            stage.slice(0, DS_TILE, dim=1).store(out.to(stage.dtype))
            stage.slice(DS_TILE, DS_TILE, dim=1).store(out_b.to(stage.dtype))
        else:
            stage.store(out.to(stage.dtype))
        gl.thread_barrier()  # this warpgroup's rows are in shared memory
        rows_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # a warp per 256-wide row
        out = stage.load(rows_l)
        offs_hr = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, rows_l))
        offs_dr = COL0 + gl.arange(0, HALF_V, layout=gl.SliceLayout(0, rows_l))
        o_ptr = OUT + pid_t * stride_ot + offs_hr.to(gl.int64)[:, None] * stride_oh + offs_dr[None, :]
        gl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(offs_hr < num_heads)[:, None])
        if WRITE_LSE:
            gl.store(LSE + pid_t * stride_lt + offs_hs * stride_lh, lse2 / LOG2E, mask=hmask)


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
        m_new, alpha, p, l_i = _softmax_step(_masked_scores(sc, ok, qk_scale), m_i, m_i, l_i)
        m_even.store(m_new)
        _named_arrive(NB_M_EVEN + j * 0)
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
    # k_lo[0] is read by this consumer only (scores and P V of the even blocks): free once its loop is done
    _epilogue(o, o, m_i, KV_SCALE, l_i, l_even, l_odd, bar_l_even, bar_l_odd, k_lo.index(0), SINKS, OUT, LSE,
              PART_OUT, PART_LSE,
              pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
              stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
              0, False, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)


@gluon.jit
def _consumer_odd(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, redo_ptr, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, p_odd,
                  redo_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                  bar_l_even, bar_l_odd,
                  pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                  stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
                  BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                  HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Worker partition, consumer 1: the odd blocks' scores and the value columns 256-511; writes the LSE
    and, for V3.2 rows, the CTA's flag at ``redo_ptr`` (1: stopped at an inexact scale; 0 otherwise)."""
    o_l: gl.constexpr = O_L
    p_l: gl.constexpr = P_L
    row_l: gl.constexpr = ROW_L
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
        s = _masked_scores(sc, ok, qk_scale)
        _named_sync(NB_M_EVEN + j * 0)
        # the max consumer 0 published is >= this consumer's previous max
        m_new, alpha, p, l_i = _softmax_step(s, m_even.load(row_l), m_i, l_i)
        m_odd.store(m_new)
        _named_arrive(NB_M_ODD + j * 0)
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
    # k_hi[1] is read by this consumer only (scores and P V of the odd blocks): free once its loop is done
    _epilogue(o, o, m_i, KV_SCALE, l_i, l_odd, l_even, bar_l_odd, bar_l_even, k_hi.index(1), SINKS, OUT, LSE,
              PART_OUT, PART_LSE,
              pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
              stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
              HALF_V, True, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)


@gluon.jit
def _stashed(sc_smem, ROW: gl.constexpr):
    """Row ``ROW`` of the V3.2 stash in the score columns: a block's ids' scale mantissas (rows ``4 * slot +
    tile``; :func:`~mla_sink.kernels.gluon.seesaw_fp8.scale_mantissa`: in ``[1, 2)`` for scales in range, 1 for
    powers of two and zero) or Horner ratios (rows ``8 + 4 * slot + tile``), as the decoder left them."""
    return stash_row(sc_smem, ROW).load(COL_L)


@gluon.jit
def _tile_step(q, k, T: gl.constexpr, acc, ratio):
    """Horner step of :func:`_ds_scores`: ``acc * ratio + q_T k_T^T`` for the 128 latent columns ``128 T ..`` of a
    ``[.., 256]`` half (``q`` ``[64 heads, 256]``, ``k`` ``[64 ids, 256]``), waited for."""
    acc = warpgroup_mma(q.slice(T * DS_TILE, DS_TILE, dim=1), k.slice(T * DS_TILE, DS_TILE, dim=1).permute((1, 0)),
                        acc * ratio[None, :], is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _ds_scores(q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, sc_smem, ROW0: gl.constexpr, s_zero):
    """The scores ``S`` (``[64 heads, 64 ids]`` fp32, before the score scale) of a block of V3.2 rows whose tiles
    hold each code times its scale's power of two (exact): ``sum_t m_t * (q_t k_t^T) + q_rope k_rope^T``, ``m_t``
    the rest of tile ``t``'s float32 scale (:func:`_stashed`, stash row ``ROW0 + t``). In one accumulator, by
    Horner's rule over the tiles: ``acc = X_0``, then ``acc = acc * (m_{t-1} / m_t) + X_t``, and ``S = acc * m_3
    + R``, so that ``acc`` is ``sum_{u <= t} (m_u / m_t) X_u`` after tile ``t``; the ratios (stash rows ``8 +
    ROW0 + t``, from the decoder) lie in ``(1/2, 2)`` for scales in ``BF16_EXACT_SCALE_EXP``. Each step rounds in
    fp32 (a few 2^-24 relative), so every scale acts as the float32 it is. A separate accumulator per tile (or a
    running sum and one partial), as gluon_fp8 keeps at 32 heads, needs 32 more registers than the consumers have
    beside their 128-register output half: ptxas then serialised every wgmma of the kernel (C7512) and spilled 200
    bytes (AOT sm90)."""
    acc = warpgroup_mma(q_lo.slice(0, DS_TILE, dim=1), k_lo.slice(0, DS_TILE, dim=1).permute((1, 0)), s_zero,
                        use_acc=False, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    acc = _tile_step(q_lo, k_lo, 1, acc, _stashed(sc_smem, 8 + ROW0 + 1))
    acc = _tile_step(q_hi, k_hi, 0, acc, _stashed(sc_smem, 8 + ROW0 + 2))
    acc = _tile_step(q_hi, k_hi, 1, acc, _stashed(sc_smem, 8 + ROW0 + 3))
    acc = warpgroup_mma(q_rope, k_rope.permute((1, 0)), acc * _stashed(sc_smem, ROW0 + 3)[None, :], is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _p_tiles(p, sc_smem, ROW: gl.constexpr, dtype: gl.constexpr):
    """A block's weights for a consumer's two output tiles: ``P * m`` with the ids' scale mantissas of stash rows
    ``ROW`` and ``ROW + 1`` (:func:`_stashed`; ``P`` fp32 in the score layout), each rounded once to ``dtype``, as
    wgmma A operands (the tiles hold the codes times the scales' powers of two)."""
    pa = gl.convert_layout((p * _stashed(sc_smem, ROW)[None, :]).to(dtype), P2_L)
    pb = gl.convert_layout((p * _stashed(sc_smem, ROW + 1)[None, :]).to(dtype), P2_L)
    return pa, pb


@gluon.jit
def _pv_tiles(pa, pb, v, o_a, o_b):
    """Issue (async, not waited for) ``o_a += pa V[:, 0:128]`` and ``o_b += pb V[:, 128:256]`` for a ``[64 ids,
    256]`` half ``v`` of decoded tiles."""
    o_a = warpgroup_mma(pa, v.slice(0, DS_TILE, dim=1), o_a, is_async=True)
    o_b = warpgroup_mma(pb, v.slice(DS_TILE, DS_TILE, dim=1), o_b, is_async=True)
    return o_a, o_b


@gluon.jit
def _put_p(buf, p):
    """Hand a block's weights (``p <= 1``, fp32) to the other consumer: as fp16 bits in the bf16 tile ``buf`` (its
    RoPE, read). fp16 keeps 3 more bits than bf16 over ``[2^-14, 1]``; the reader scales them per tile in fp32."""
    buf.store(p.to(gl.float16).to(gl.bfloat16, bitcast=True))


@gluon.jit
def _get_p(buf):
    """The other consumer's weights from :func:`_put_p`, as fp32 in the score layout."""
    return buf.load(S_L).to(gl.float16, bitcast=True).to(gl.float32)


@gluon.jit
def _scale_tiles(o_a, o_b, f):
    """Both output tiles times a per-head factor ``f`` (score rows)."""
    f_o = gl.convert_layout(f, gl.SliceLayout(1, O2_L))[:, None]
    return o_a * f_o, o_b * f_o


@gluon.jit
def _consumer_even_ds(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope,
                      sc_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                      bar_l_even, bar_l_odd,
                      pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                      stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                      stride_pls, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                      HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Consumer 0 for V3.2 rows read exactly (``KV_DS_EXACT``; default partition): :func:`_consumer_even`'s
    schedule with every tile scale applied in fp32 (:func:`_ds_scores`, :func:`_p_tiles`); its value columns 0-255
    are tiles 0 and 1 (stash rows ``4 * slot + 0, 1``), the odd block's weights come as fp16 from the odd slot's
    RoPE tile."""
    row_l: gl.constexpr = ROW_L
    dtype: gl.constexpr = q_lo.dtype
    # the state's [64, 256] output half is not used: this consumer keeps two [64, 128] tiles
    qk_scale, offs_n, nrows, m_i, l_i, o_unused, s_zero = _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                          BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
    o_a = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    o_b = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    j = num_pairs * 0
    go = j < num_pairs
    while go:
        phase = j & 1
        even = _opaque_zero(j)
        odd = even + 1
        _, ok = ids_ok(IDX, idx_base, start + 2 * j * BLOCK_N + offs_n, end, nrows)
        mbarrier.wait(ready_lo.index(0), phase)
        decode_half(k_lo.index(even), k_rope.index(even), sc_smem, 0, 0, False, KV_FMT)
        mbarrier.wait(ready_hi.index(0), phase)
        decode_half(k_hi.index(even), k_rope.index(even), sc_smem, 2, 1, True, KV_FMT)
        sc = _ds_scores(q_lo.index(even), q_hi.index(even), q_rope.index(even), k_lo.index(even), k_hi.index(even),
                        k_rope.index(even), sc_smem, 0, s_zero)
        m_new, alpha, p, l_i = _softmax_step(_masked_scores(sc, ok, qk_scale), m_i, m_i, l_i)
        m_even.store(m_new)
        _named_arrive(NB_M_EVEN + j * 0)
        o_a, o_b = _scale_tiles(o_a, o_b, alpha)
        pa, pb = _p_tiles(p, sc_smem, 0, dtype)
        o_a, o_b = _pv_tiles(pa, pb, k_lo.index(even), o_a, o_b)
        o_a, o_b = warpgroup_mma_wait(num_outstanding=0, deps=(o_a, o_b))
        _signal(free_lo.index(0))  # the producer refills this half while the odd block's max is awaited
        _named_sync(NB_M_ODD + j * 0)
        m_odd_new = m_odd.load(row_l)
        c = gl.exp2(m_new - _safe(m_odd_new))  # 0 when this block had no valid id (p is 0 then)
        _put_p(k_rope.index(even), p * c[:, None])  # over the RoPE columns S0 no longer needs
        _named_arrive(NB_P_EVEN + j * 0)
        o_a, o_b = _scale_tiles(o_a, o_b, c)
        l_i = l_i * c
        m_i = m_odd_new
        _named_sync(NB_P_ODD + j * 0)
        pa, pb = _p_tiles(_get_p(k_rope.index(odd)), sc_smem, 4, dtype)
        o_a, o_b = _pv_tiles(pa, pb, k_lo.index(odd), o_a, o_b)
        o_a, o_b = warpgroup_mma_wait(num_outstanding=0, deps=(o_a, o_b))
        _signal(free_lo.index(1))  # the odd block's lo half, its tile scales and P1 are read
        j += 1
        go = j < num_pairs
    _epilogue(o_a, o_b, m_i, KV_SCALE, l_i, l_even, l_odd, bar_l_even, bar_l_odd, k_lo.index(0), SINKS, OUT, LSE,
              PART_OUT, PART_LSE, pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
              stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
              0, False, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)


@gluon.jit
def _consumer_odd_ds(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope,
                     sc_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                     bar_l_even, bar_l_odd,
                     pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                     stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                     stride_pls, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                     HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Consumer 1 for V3.2 rows read exactly (``KV_DS_EXACT``; worker partition): :func:`_consumer_odd`'s
    schedule with every tile scale applied in fp32; its value columns 256-511 are tiles 2 and 3 (stash rows ``4 *
    slot + 2, 3``). Its block's RoPE comes with the odd slot's lo half, and its weights go over that RoPE tile as
    fp16 for consumer 0; writes the LSE."""
    row_l: gl.constexpr = ROW_L
    dtype: gl.constexpr = q_lo.dtype
    qk_scale, offs_n, nrows, m_i, l_i, o_unused, s_zero = _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                          BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
    o_a = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    o_b = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    j = num_pairs * 0
    go = j < num_pairs
    while go:
        phase = j & 1
        even = _opaque_zero(j)
        odd = even + 1
        _, ok = ids_ok(IDX, idx_base, start + (2 * j + 1) * BLOCK_N + offs_n, end, nrows)
        mbarrier.wait(ready_hi.index(1), phase)  # the producer fills the odd slot's hi half first
        decode_half(k_hi.index(odd), k_rope.index(odd), sc_smem, 6, 0, False, KV_FMT)
        mbarrier.wait(ready_lo.index(1), phase)  # with the RoPE
        decode_half(k_lo.index(odd), k_rope.index(odd), sc_smem, 4, 2, False, KV_FMT)
        sc = _ds_scores(q_lo.index(even), q_hi.index(even), q_rope.index(even), k_lo.index(odd), k_hi.index(odd),
                        k_rope.index(odd), sc_smem, 4, s_zero)
        s = _masked_scores(sc, ok, qk_scale)
        _named_sync(NB_M_EVEN + j * 0)
        # the max consumer 0 published is >= this consumer's previous max
        m_new, alpha, p, l_i = _softmax_step(s, m_even.load(row_l), m_i, l_i)
        m_odd.store(m_new)
        _named_arrive(NB_M_ODD + j * 0)
        m_i = m_new
        o_a, o_b = _scale_tiles(o_a, o_b, alpha)
        # this block's own P V first, then P1 is handed over while it runs. Consumer 0 has read the previous
        # pair's P1: its wait for that P V came before its arrive on NB_M_EVEN of this pair, taken above.
        pa, pb = _p_tiles(p, sc_smem, 6, dtype)
        _put_p(k_rope.index(odd), p)  # over this block's RoPE, which S1 has read
        o_a, o_b = _pv_tiles(pa, pb, k_hi.index(odd), o_a, o_b)
        _named_arrive(NB_P_ODD + j * 0)
        o_a, o_b = warpgroup_mma_wait(num_outstanding=0, deps=(o_a, o_b))
        _signal(free_hi.index(1))  # this block's own P V is done: its slot half is refilled first
        _named_sync(NB_P_EVEN + j * 0)
        pa, pb = _p_tiles(_get_p(k_rope.index(even)), sc_smem, 2, dtype)
        o_a, o_b = _pv_tiles(pa, pb, k_hi.index(even), o_a, o_b)
        o_a, o_b = warpgroup_mma_wait(num_outstanding=0, deps=(o_a, o_b))
        _signal(free_hi.index(0))  # the even block's hi half, its tile scales and P0 are read
        j += 1
        go = j < num_pairs
    _epilogue(o_a, o_b, m_i, KV_SCALE, l_i, l_odd, l_even, bar_l_odd, bar_l_even, k_hi.index(1), SINKS, OUT, LSE,
              PART_OUT, PART_LSE, pid_h, pid_s, pid_t, num_heads, stride_ot, stride_oh, stride_lt, stride_lh,
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
    (:data:`KV_DS_EXACT`, the same grid after it) a program whose word is 0 returns at once."""
    redo_ptr = REDO + gl.program_id(2).to(gl.int64) * (gl.num_programs(0) * gl.num_programs(1)) + \
        gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)
    if GATED:
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
    paged = v32 and kv_cache.dim() == 3
    num_rows = kv_cache.shape[0] * (kv_cache.shape[1] if paged else 1)
    # pages that follow each other without a gap are the flat pool they are (kv_layout.row_addressing)
    kv_block_size, stride_kv = kv_layout.row_addressing(kv_cache)
    scalars = dict(
        num_heads=H, num_rows=min(num_rows, 2 ** 31), topk=topk, ids_per_split=ids_per_split,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_it=indices.stride(0),
        stride_ot=out_strides[0], stride_oh=out_strides[1], stride_lt=H, stride_lh=1,
        stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v, stride_plt=splits * H, stride_pls=H,
    )
    # the rows' page size as a constexpr, as gluon_fp8's launch args give it: a paged cache's page arithmetic is a
    # shift and a mask, not an integer division per row
    constexprs = dict(kv_block_size=kv_block_size,
                      BLOCK_H=HEAD_BLOCK, BLOCK_N=BLOCK_N, HALF_V=HALF_V, D_ROPE=d_qk - d_v,
                      HAS_SINKS=False, HAS_TOPK_LEN=False, SPLIT=splits > 1, ROWS=GATHER_ROWS,
                      CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=seesaw_producer_regs(kv_dtype),
                      KV_FMT=kv_fmt,
                      ROW_BYTES=kv_layout.ROW_BYTES if v32 else d_qk,
                      # the library's combine follows a split launch as a programmatic dependent; after V3.2
                      # rows the exact recompute, launched plainly, comes between (paths/triton/launch.py)
                      LAUNCH_DEPENDENTS=splits > 1 and kv_fmt != KV_DS_MLA.value, GATED=gated)
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
    for last, (is_exact, gated) in zip(range(len(launches), 0, -1), launches):
        grid, scalars, constexprs, options = seesaw_launch_args(q, kv, indices, num_kv_splits=splits,
                                                                ids_per_split=ids_per_split,
                                                                out_strides=(out.stride(0), out.stride(1)),
                                                                kv_dtype=kv_dtype, exact=is_exact, gated=gated)
        constexprs.update(HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None,
                          LAUNCH_DEPENDENTS=pdl and splits > 1 and last == 1)
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
