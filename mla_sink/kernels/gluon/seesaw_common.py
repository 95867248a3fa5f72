"""Shared parts of the seesaw kernel's consumers (:mod:`mla_sink.kernels.gluon.gluon_seesaw` and its exact reading
of V3.2 rows, :mod:`mla_sink.kernels.gluon.seesaw_exact`): the register layouts, the named barriers through which
the two consumers trade maxima and weights, the online-softmax step and the epilogue that writes a consumer's half
of the output. Same semantics and sources as :mod:`mla_sink.kernels.gluon.gluon_seesaw`."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from mla_sink.kernels.gluon.math import LOG2E, sink_scale
from mla_sink.kernels.gluon.seesaw_fp8 import DS_TILE, KV_DS_EXACT, KV_E4M3

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
def _even_max(sc, ok, qk_scale, m_i, l_i, m_even, j):
    """Consumer 0's softmax step of its block (scores ``sc``, ids ``ok``) against its own running max, the new max
    published to consumer 1 (``m_even``, named barrier :data:`NB_M_EVEN`): ``(m_new, alpha, p, l_i)``."""
    m_new, alpha, p, l_i = _softmax_step(_masked_scores(sc, ok, qk_scale), m_i, m_i, l_i)
    m_even.store(m_new)
    _named_arrive(NB_M_EVEN + j * 0)
    return m_new, alpha, p, l_i


@gluon.jit
def _odd_max(sc, ok, qk_scale, m_i, l_i, m_even, m_odd, j):
    """Consumer 1's softmax step of its block against the max consumer 0 published (which is at least this
    consumer's previous max), the shared max published back (``m_odd``, :data:`NB_M_ODD`): ``(m_new, alpha, p,
    l_i)``."""
    s = _masked_scores(sc, ok, qk_scale)
    _named_sync(NB_M_EVEN + j * 0)
    m_new, alpha, p, l_i = _softmax_step(s, m_even.load(ROW_L), m_i, l_i)
    m_odd.store(m_new)
    _named_arrive(NB_M_ODD + j * 0)
    return m_new, alpha, p, l_i


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
