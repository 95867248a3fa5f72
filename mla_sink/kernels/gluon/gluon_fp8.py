"""Warp-specialised sparse MLA decode with fp8 (e4m3fn) KV and few heads (H <= 32), sm90, in Gluon.

Semantics of :mod:`mla_sink.paths.triton.launch` (float64 reference in :mod:`mla_sink.core.reference`).
At few heads the portable kernel is bound by converting fp8 tiles inside its MMA loop (once per operand
layout) and by mma.sync's 16-row tiles re-reading q from shared memory in every warp, and the seesaw
kernel pads the heads to its 64-row wgmma tiles. Here one CTA = one token (all of its heads, padded to
``BLOCK_H`` = 16) and one id range (``SPLIT``: the range of ``pid_s``; fp32 partials and base-2 LSEs for
the combine kernel, which applies the sink, launched as a programmatic dependent):

* roles are swapped so the tensor cores see a wide M: ``S^T = K q^T`` (wgmma M = 64 ids, N = BLOCK_H
  heads, K = 576) and ``O^T += V^T P^T`` (M = 512 value columns, N = BLOCK_H, K = 64 ids); the tiles
  are read by the tensor cores straight from shared memory, q and P are the small N-side operands;
* a producer warpgroup gathers each block's 64 fp8 rows into registers (16-byte loads, the ids loaded
  one block ahead, masked lanes read 0), converts them to fp16 once (``cvt`` e4m3 -> f16: exact) and
  stores them into a 2-stage ring of ``[64, 512]`` + ``[64, 64]`` fp16 tiles. Its lanes sit 4 to a
  row and 8 rows to a warp, so every 8-lane phase of a 16-byte store covers the 8 distinct 16-byte
  chunks of the 128-byte swizzle (no bank conflicts; one lane per 512-byte row conflicts 2-way);
* two consumer warpgroups take alternate blocks (one ring stage each) and keep their own online
  softmax state (base 2) and ``O^T`` accumulator; the second hands ``(m, l, O^T)`` to the first through
  shared memory at the end (each ``O^T`` over its own ring stage, which no block needs any more), which
  merges them 64 value columns at a time, applies the sink and the per-tensor ``kv_scale`` and stores
  ``out`` and the natural-log LSE (split: the partial output and its base-2 LSE). q sits in shared
  memory as fp16, each head row scaled by a power of two so its largest ``|q|`` is 2^14 (exact for bf16
  mantissas; undone on the scores).

Measured on an H200 (BENCHMARKS.md; benchmarks/fp8_pingpong_probe_r*_2026-11-30.json): one consumer was
bound by its serial chain (2.7 us per 64-id block); two take 1.35 us per block, and the producer (2.1-2.5
us per block: one 36 KB block of rows in flight per SM) is now the limit: 157-159 us at H=16, T=256,
against 176-180 with one consumer and 162-166 for bf16 KV. With each consumer's ring stage fixed at compile
time (ninth session) 154 us at T=256, and at T=64 in two splits 47.8 us (bf16 KV 50.8).

Source: the swapped ("transposed") decode GEMMs of FlashInfer/FlashMLA small-head decode kernels,
FlashMLA's fp8 dequantisation outside the MMA warps and FlashAttention-3's two consumer warpgroups;
Triton's Gluon tutorials for the primitives.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_sink.kernels.gluon.math import LOG2E, sink_scale
from mla_sink.kernels.gluon.gluon_seesaw import _opaque_zero
from mla_sink.kernels.gluon.pdl import launch_dependents

STAGES = gl.constexpr(2)  # one ring stage per consumer warpgroup
#: Head blocks of one CTA (every head of a token, padded): the wgmma N dimension of both swapped GEMMs. A
#: call takes the smallest that holds its heads. 32-head blocks first took 226 us at H=32, T=256 (against 166
#: for bf16 KV), with the first consumer as the default partition, a constant stage index and a whole-block
#: producer: ptxas spilled 0.5-1 KB at every register split. With the stage and q indexed through an opaque
#: zero, both consumers as workers and a half-block producer (8 bytes spilled) they take 177 / 92 / 56 us at
#: T = 256 / 128 / 64 (two splits) against 195 / 100 / 66 on the padded seesaw (H200, tenth session;
#: benchmarks/fp8_few_heads_h32_2026-12-01.json).
HEAD_BLOCKS = (16, 32)
#: Ids per block: the wgmma M dimension of ``S^T`` (one warpgroup's 64 rows).
BLOCK_N = 64
#: Registers per thread of the consumers and of the producer, per head block (``setmaxnreg``; of 512 per
#: thread-slot of the three warpgroups, the default partition gets what the two workers leave): the
#: consumers hold ``O^T`` (``512 x BLOCK_H`` fp32: 64 registers at 16 heads, 128 at 32), the producer
#: ``PRODUCER_ROWS`` fp8 rows (72 registers for 64) and their fp16 conversion. At 16 heads the second
#: consumer and the producer are the workers and ptxas spills nothing; at 32 both consumers are (224 each)
#: and the producer, the default partition, gets 56 and spills 8 bytes.
WORKER_REGS = {16: (136, 152), 32: (224, 64)}
#: Rows the producer gathers per step, per head block: a whole block, or half of one at 32 heads, where the
#: consumers' ``O^T`` leaves the producer 56 registers (16 rows a step spilled more).
PRODUCER_ROWS = {16: 64, 32: 32}
#: Head blocks whose producer is the default partition (both consumers workers with ``WORKER_REGS[h][0]``
#: registers each; the producer gets the rest: ``WORKER_REGS[h][1]`` is then not passed to the compiler and
#: only records ``512 - 2 * WORKER_REGS[h][0]``, of which the SASS's ``setmaxnreg`` keeps 56).
PRODUCER_DEFAULT = (32,)


@gluon.jit
def _gather(KV, ids, stride_kv, col0, WIDTH: gl.constexpr, layout: gl.constexpr):
    """fp8 rows ``ids`` x columns ``[col0, col0 + WIDTH)`` of KV (64-bit offsets); id -1 reads 0."""
    rows = KV + ids.to(gl.int64) * stride_kv + col0
    return gl.load(rows[:, None] + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))[None, :],
                   mask=(ids >= 0)[:, None], other=0.0)


@gluon.jit
def _raw_ids(IDX, idx_base, t_end, n0, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Ids of positions ``[n0, n0 + BLOCK_N)`` as loaded (positions past ``t_end`` read -1); not yet checked."""
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    return gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)


@gluon.jit
def _checked(raw, nrows):
    """Raw ids with the negative ones and those ``>= nrows`` set to -1 (one unsigned compare; positions
    past ``t_end`` were read as -1)."""
    return gl.where(raw.to(gl.uint32, bitcast=True) < nrows, raw, -1)


@gluon.jit
def _producer(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, start, end, num_blocks,
              BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, ROWS: gl.constexpr):
    """Worker partition: fp8 rows -> registers -> fp16 (once) -> the shared-memory ring, ``ROWS`` rows of a
    block at a time (``BLOCK_N``, or half of it where the consumers need the registers: 32-head blocks). The
    next step's ids are loaded before this step's rows and checked after its store, off the gather's
    critical path.
    Four other schedules measured no faster (H200, ninth session; benchmarks/fp8_few_heads_*_2026-12-01.json):
    rows copied by cp.async into a staging block with the next block's copy issued before this one is
    converted (151.6 us at H=16, T=256 against 152.6 for bf16 KV in the same run; 49.9 us at T=64 in two
    splits against 47.8 before), the rows of block i + 2 prefetched into L2 (``prefetch.global.L2``) after
    block i is stored (154.2 against 153.4 for bf16; 50.3 at T=64), two producer warpgroups, one per ring
    stage, at 104 registers each (162.4 against 153.9 for bf16, 84.3 at T=128 against 78.9 before; ptxas
    spills in both producers and in the first consumer), and converting before waiting for the ring stage,
    which the compiler moves back after the wait. ncu at H=16, T=256 (166.8 us under the
    profiler): DRAM 38% busy, tensor pipe 11%, 79% of cycles with no eligible warp; the consumers' top stall
    is their wait for a filled stage and the producer's is the first use of the gathered bytes (long
    scoreboard), yet neither more bytes in flight, nor L2 hits, nor a second producer moved it."""
    nope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    rope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    ids_n = _checked(_raw_ids(IDX, idx_base, end, start, ROWS, nope_l), nrows)
    ids_r = _checked(_raw_ids(IDX, idx_base, end, start, ROWS, rope_l), nrows)
    for i in range(num_blocks):
        s = i % STAGES
        for h in gl.static_range(BLOCK_N // ROWS):
            # the next step's ids: this block's next rows, or (after its last) the next block's first
            next_n = _raw_ids(IDX, idx_base, end, start + i * BLOCK_N + (h + 1) * ROWS, ROWS, nope_l)
            next_r = _raw_ids(IDX, idx_base, end, start + i * BLOCK_N + (h + 1) * ROWS, ROWS, rope_l)
            x_n = _gather(KV, ids_n, stride_kv, 0, D_NOPE, nope_l)
            x_r = _gather(KV, ids_r, stride_kv, D_NOPE, D_ROPE, rope_l)
            if h == 0:
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            kn_smem.index(s).slice(h * ROWS, ROWS).store(x_n.to(gl.float16))
            kr_smem.index(s).slice(h * ROWS, ROWS).store(x_r.to(gl.float16))
            ids_n = _checked(next_n, nrows)
            ids_r = _checked(next_r, nrows)
        fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))


@gluon.jit
def _consumer(IDX, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p_smem, kn_smem, kr_smem, ready, empty,
              scale_smem, m_smem, l_smem, merged,
              pid_t, pid_s, idx_base, num_heads, num_rows, start, end, num_blocks,
              stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr,
              HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, FIRST: gl.constexpr):
    """One consumer warpgroup: blocks FIRST, FIRST + 2, ... of the id range (ring stage FIRST). FIRST = 0
    (the default partition) merges the other's state and runs the epilogue."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_H, 16])
    # each consumer's O^T, handed over in its own ring stage (``stage s`` holds only the blocks of consumer s,
    # so after a consumer's last block the producer has nothing left to write there); 128-byte swizzled rows,
    # so that the accumulator layout's 8-byte stores and loads do not conflict in banks
    acc_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D_NOPE, BLOCK_H], gl.float32)
    acc_self = kn_smem.index(FIRST)._reinterpret(gl.float32, [D_NOPE, BLOCK_H], acc_sl)
    acc_other = kn_smem.index(1)._reinterpret(gl.float32, [D_NOPE, BLOCK_H], acc_sl)
    col_scale = scale_smem.load(gl.SliceLayout(0, acc_l))  # per head: q scaling, sm_scale, kv_scale, log2(e)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))
    acc = gl.zeros([D_NOPE, BLOCK_H], gl.float32, layout=acc_l)  # O^T
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
    for i in range(FIRST, num_blocks, STAGES):
        # this consumer's stage (FIRST); at 32 heads through an index the compiler cannot see through: a
        # constant one lets it hoist every wgmma descriptor of the loop out of it, which spills there (at 16
        # heads the hoisted descriptors fit, and measured faster: 154 against 157-159 us at T=256)
        if BLOCK_H > 16:
            s = _opaque_zero(i) + FIRST
        else:
            s = FIRST + i * 0
        pos = start + i * BLOCK_N + offs_n
        ids = gl.load(IDX + idx_base + pos, mask=pos < end, other=-1)
        ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < end)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        kn = kn_smem.index(s)
        kr = kr_smem.index(s)
        st = warpgroup_mma(kn, q_n.index(s - FIRST).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        st = warpgroup_mma(kr, q_r.index(s - FIRST).permute((1, 0)), st, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
        st = gl.where(ok[:, None], st * col_scale[None, :], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(st, axis=0))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(st - m_safe[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        m_i = m_new
        p_smem.store(p.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()  # P^T complete in shared memory before the wgmma reads it
        acc = warpgroup_mma(kn.permute((1, 0)), p_smem, acc * alpha[None, :], is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # every warp of this consumer is done with stage s and with P^T
        mbarrier.arrive(empty.index(s))

    if FIRST == 1:
        m_smem.store(m_i)
        l_smem.store(l_i)
        acc_other.store(acc)
        gl.thread_barrier()
        mbarrier.arrive(merged)
    else:
        acc_self.store(acc)  # frees O^T's registers for the merge below
        mbarrier.wait(merged, 0)
        m_o = m_smem.load(gl.SliceLayout(0, acc_l))
        l_o = l_smem.load(gl.SliceLayout(0, acc_l))
        m_new = gl.maximum(m_i, m_o)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        a_self = gl.exp2(m_i - m_safe)
        a_other = gl.exp2(m_o - m_safe)
        l_i = l_i * a_self + l_o * a_other
        empty_row = l_i == 0.0
        l_safe = gl.where(empty_row, 1.0, l_i)
        lse2 = gl.where(empty_row, float("-inf"), m_new + gl.log2(l_safe))
        offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, acc_l))
        hmask = offs_h < num_heads
        scale = gl.load(KV_SCALE) / l_safe
        if HAS_SINKS and not SPLIT:  # a split launch's combine applies the sink once
            sink = gl.load(SINKS + offs_h, mask=hmask, other=float("-inf"))
            scale = sink_scale(scale, sink, lse2, empty_row)
        f_self = a_self * scale
        f_other = a_other * scale
        if SPLIT:
            gl.store(PART_LSE + pid_t * stride_plt + pid_s * stride_pls + offs_h, lse2, mask=hmask)
            o_row = PART_OUT + pid_t * stride_pt + pid_s * stride_ps + offs_h.to(gl.int64)[None, :] * stride_ph
        else:
            gl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E, mask=hmask)
            o_row = OUT + pid_t * stride_ot + offs_h.to(gl.int64)[None, :] * stride_oh
        offs_d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
        gl.thread_barrier()  # every warp's rows of O^T stored before any warp reads them
        for c in gl.static_range(D_NOPE // BLOCK_N):  # 64 value columns at a time: no second O^T in registers
            rows = acc_self.slice(c * BLOCK_N, BLOCK_N).load(acc_l) * f_self[None, :]
            rows = rows + acc_other.slice(c * BLOCK_N, BLOCK_N).load(acc_l) * f_other[None, :]
            o_ptr = o_row + (c * BLOCK_N + offs_d)[:, None]
            if SPLIT:
                gl.store(o_ptr, rows, mask=hmask[None, :])
            else:
                gl.store(o_ptr, rows.to(OUT.dtype.element_ty), mask=hmask[None, :])


@gluon.jit
def sparse_mla_decode_fp8_ws_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, sm_scale,
    num_heads, num_rows, topk, ids_per_split,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, SPLIT: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PRODUCER_ROWS: gl.constexpr,
    PRODUCER_DEFAULT: gl.constexpr,
):
    """One CTA = (id range ``pid_s``, token): all of the token's heads. See the module docstring.
    ``LAUNCH_DEPENDENTS``: let the combine, launched as a programmatic dependent, start at once."""
    if LAUNCH_DEPENDENTS:
        launch_dependents(gl.program_id(1))
    pid_s = gl.program_id(1)
    pid_t = gl.program_id(2).to(gl.int64)
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    start = pid_s * ids_per_split
    end = gl.minimum(start + ids_per_split, t_end)
    num_blocks = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    idx_base = pid_t * stride_it
    # [1, ..]: indexed like the ring stages, through the consumers' opaque index, so that the scores' wgmma
    # descriptors of q are computed in the loop rather than hoisted out of it (and spilled)
    q_n = gl.allocate_shared_memory(gl.float16, [1, BLOCK_H, D_NOPE],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_NOPE], gl.float16))
    q_r = gl.allocate_shared_memory(gl.float16, [1, BLOCK_H, D_ROPE],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], gl.float16))
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], gl.float16)
    p0 = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_H], p_layout)
    p1 = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_H], p_layout)
    kn_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], gl.float16))
    kr_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], gl.float16))
    vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    scale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_l)
    m_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_l)
    l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_l)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    merged = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(merged, count=1)

    # q -> fp16 in shared memory, each head row scaled so that its largest |q| is 2^14; the per-head
    # factor that undoes it (with sm_scale, kv_scale and log2(e)) goes to both consumers.
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    offs_hq = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_l))
    q_rows = Q + pid_t * stride_qt + offs_hq.to(gl.int64)[:, None] * stride_qh
    hmask = (offs_hq < num_heads)[:, None]
    qn = gl.load(q_rows + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask, other=0.0)
    qr = gl.load(q_rows + D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask,
                 other=0.0)
    qn = qn.to(gl.float32)
    qr = qr.to(gl.float32)
    qmax = gl.maximum(gl.max(gl.abs(qn), axis=1), gl.max(gl.abs(qr), axis=1))
    row_exp = gl.ceil(gl.log2(gl.maximum(qmax, 1e-30)))
    q_n.index(0).store((qn * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    q_r.index(0).store((qr * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    scale_smem.store(gl.exp2(row_exp - 14.0) * (sm_scale * gl.load(KV_SCALE) * LOG2E))
    fence_async_shared()
    gl.thread_barrier()

    # 16 heads: the first consumer is the default partition (the rest of the registers), the second consumer
    # and the producer workers; 32 heads: the producer is the default partition and both consumers workers
    # with the same registers (as the default partition, the first consumer spilled the loop's wgmma
    # descriptors at any register split that left the producer room)
    if PRODUCER_DEFAULT:
        gl.warp_specialize([
            (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, start, end,
                         num_blocks, BLOCK_N, D_NOPE, D_ROPE, PRODUCER_ROWS)),
            (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p0, kn_smem, kr_smem, ready,
                         empty, scale_smem, m_smem, l_smem, merged,
                         pid_t, pid_s, idx_base, num_heads, num_rows, start, end, num_blocks,
                         stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                         stride_pls, BLOCK_H, BLOCK_N, D_NOPE, HAS_SINKS, SPLIT, 0)),
            (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p1, kn_smem, kr_smem, ready,
                         empty, scale_smem, m_smem, l_smem, merged,
                         pid_t, pid_s, idx_base, num_heads, num_rows, start, end, num_blocks,
                         stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                         stride_pls, BLOCK_H, BLOCK_N, D_NOPE, HAS_SINKS, SPLIT, 1)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p0, kn_smem, kr_smem, ready,
                         empty, scale_smem, m_smem, l_smem, merged,
                         pid_t, pid_s, idx_base, num_heads, num_rows, start, end, num_blocks,
                         stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                         stride_pls, BLOCK_H, BLOCK_N, D_NOPE, HAS_SINKS, SPLIT, 0)),
            (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p1, kn_smem, kr_smem, ready,
                         empty, scale_smem, m_smem, l_smem, merged,
                         pid_t, pid_s, idx_base, num_heads, num_rows, start, end, num_blocks,
                         stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                         stride_pls, BLOCK_H, BLOCK_N, D_NOPE, HAS_SINKS, SPLIT, 1)),
            (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, start, end,
                         num_blocks, BLOCK_N, D_NOPE, D_ROPE, PRODUCER_ROWS)),
        ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def fp8_launch_args(q, kv_cache, indices, *, num_kv_splits: int, ids_per_split: int, out_strides: tuple):
    """``(grid, scalars, constexprs, options)`` of a :func:`sparse_mla_decode_fp8_ws_kernel` launch on these
    tensors' metadata (shared by :func:`sparse_mla_decode_fp8_gluon` and the prepared runner of
    :mod:`mla_sink.paths.triton.launch`). ``scalars`` are the integer arguments by name; ``out_strides``
    the ``(token, head)`` strides of ``out``. Split launches (``num_kv_splits > 1``) write fp32 partials
    ``[T, splits, H, 512]`` and base-2 LSEs ``[T, splits, H]`` and let the combine launch early.

    Raises:
        ValueError: ``num_heads`` above the largest head block.
    """
    T, H, d_qk = q.shape
    d_v = 512
    block_h = next((b for b in HEAD_BLOCKS if H <= b), None)
    if block_h is None:
        raise ValueError(f"the gluon_fp8 kernel serves at most {HEAD_BLOCKS[-1]} heads, got num_heads={H}")
    splits = num_kv_splits
    scalars = dict(
        num_heads=H, num_rows=min(kv_cache.shape[0], 2 ** 31), topk=indices.shape[1], ids_per_split=ids_per_split,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kv=kv_cache.stride(0), stride_it=indices.stride(0),
        stride_ot=out_strides[0], stride_oh=out_strides[1], stride_lt=H, stride_lh=1,
        stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v, stride_plt=splits * H, stride_pls=H,
    )
    consumer_regs, producer_regs = WORKER_REGS[block_h]
    constexprs = dict(BLOCK_H=block_h, BLOCK_N=BLOCK_N, D_NOPE=d_v, D_ROPE=d_qk - d_v,
                      HAS_SINKS=False, HAS_TOPK_LEN=False, SPLIT=splits > 1, LAUNCH_DEPENDENTS=splits > 1,
                      CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs, PRODUCER_ROWS=PRODUCER_ROWS[block_h],
                      PRODUCER_DEFAULT=block_h in PRODUCER_DEFAULT)
    return (1, splits, T), scalars, constexprs, dict(num_warps=4)


def sparse_mla_decode_fp8_gluon(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None,
                                kv_scale=None, out=None, lse=None, num_kv_splits: int = 1, ids_per_split=None,
                                combine_tile: tuple = (16, 128)):
    """Launch :func:`sparse_mla_decode_fp8_ws_kernel` (CUDA sm90; ``H <= 32``; e4m3fn KV; bf16/fp16 q), with
    the combine kernel (a programmatic dependent) when split; for tests and benchmarks (the library's
    runner, :mod:`mla_sink.paths.triton.launch`, launches the same kernels with the plan's splits).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16, innermost stride 1. kv_cache: ``[N, 576]`` float8_e4m3fn,
            innermost stride 1. indices: int32 ``[T, topk]``, innermost stride 1 (``-1`` / negative /
            ``>= N`` skipped). sinks: optional fp32 ``[H]``. sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]`` (contiguous). kv_scale: fp32 ``[1]`` (value = stored *
            scale); ``None`` means 1. out, lse: optional ``[T, H, 512]`` (innermost stride 1) and fp32
            ``[T, H]`` buffers. num_kv_splits: programs per token, each over ``ids_per_split`` ids (default:
            ``topk`` split evenly in multiples of 64). combine_tile: ``(heads, value columns)`` of one
            combine program.

    Returns:
        ``(out, lse)`` as :func:`mla_sink.paths.triton.launch.sparse_mla_decode_triton` returns them.

    Raises:
        ValueError: ``num_heads > 32``.
    """
    import torch

    from mla_sink.kernels.gluon import launch_buffers
    from mla_sink.kernels.triton.combine import combine_jit, combine_launch_args

    T, H, _ = q.shape
    topk = indices.shape[1]
    out, lse, sm_scale = launch_buffers(q, out, lse, sm_scale)
    if ids_per_split is None:
        ids_per_split = -(-(-(-max(topk, 1) // num_kv_splits)) // BLOCK_N) * BLOCK_N
    grid, scalars, constexprs, options = fp8_launch_args(q, kv_cache, indices, num_kv_splits=num_kv_splits,
                                                         ids_per_split=ids_per_split,
                                                         out_strides=(out.stride(0), out.stride(1)))
    if T == 0 or H == 0:
        return out, lse
    if kv_scale is None:
        kv_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    split = num_kv_splits > 1
    part_out = torch.empty((T, num_kv_splits, H, 512), dtype=torch.float32, device=q.device) if split else lse
    part_lse = torch.empty((T, num_kv_splits, H), dtype=torch.float32, device=q.device) if split else lse
    constexprs.update(HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None)
    sparse_mla_decode_fp8_ws_kernel[grid](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices, kv_scale, out, lse, part_out, part_lse,
        float(sm_scale), **scalars, **constexprs, **options)
    if split:
        c_grid, c_const, c_static = combine_launch_args(T, H, num_kv_splits, (out.stride(0), out.stride(1)),
                                                        sinks is not None, combine_tile[0], combine_tile[1],
                                                        wait_primary=True)
        combine_jit[c_grid](part_out, part_lse, sinks if sinks is not None else lse, out, lse, **c_static,
                            **c_const, num_warps=4, num_stages=1, launch_pdl=True)
    return out, lse
