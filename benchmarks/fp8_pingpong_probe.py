"""Device probe behind the fp8 small-head Gluon kernel (mla_sink/kernels/gluon_fp8_decode.py): a copy of
the kernel with two consumer warpgroups taking alternate blocks, with switches that leave the producer's
or the consumers' work out (PROBE 1: consumers only wait and release; PROBE 2: the producer only
signals), and several producers (PREFETCH 0: ids then rows per block; 1: ids one block ahead; 2: rows as
int32 words one block ahead; 3: cp.async staging ring of raw fp8 half-blocks; 4: ids through a cp.async
ring; 6/7: two register sets of words; VARIANT odd: 4 lanes per row, >= 2: ``.cg`` loads).

Each H200 run edited VARIANTS; its JSON (benchmarks/fp8_pingpong_probe_r*_2026-11-30.json) names the
variants it timed. Results and conclusions: BENCHMARKS.md (2026-11-30, second session). Not the
library's kernel; ``launch_lib`` launches the library's.
Usage: PYTHONPATH=. python benchmarks/fp8_pingpong_probe.py OUT.json"""

from __future__ import annotations

import json
import sys
import traceback

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)



@gluon.jit
def _ids(IDX, idx_base, nrows, t_end, n0, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """The block's ids in the row slice of ``layout``; invalid ids and positions past t_end -> -1."""
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
    ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
    return gl.where(ok, ids, -1)


@gluon.jit
def _gather(KV, ids, stride, col0, WIDTH: gl.constexpr, layout: gl.constexpr, other: gl.constexpr,
            CACHE: gl.constexpr = ""):
    """Rows ``ids`` (-1: not read, 0) x columns [col0, col0 + WIDTH) of KV, in ``layout``."""
    rows = KV + ids.to(gl.int64) * stride + col0
    return gl.load(rows[:, None] + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))[None, :],
                   mask=(ids >= 0)[:, None], other=other, cache_modifier=CACHE)


@gluon.jit
def _words_to_f16(x):
    """int32 words of 4 e4m3 bytes -> int32 words of 2 f16 each, in memory order (cvt: exact)."""
    a, b = gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x], dtype=[gl.int32, gl.int32], is_pure=True, pack=1)
    y = gl.join(a, b)
    return gl.reshape(y, [x.shape[0], 2 * x.shape[1]])


@gluon.jit
def _producer(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
              BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, STAGES: gl.constexpr,
              PROBE: gl.constexpr, PREFETCH: gl.constexpr, WARPS: gl.constexpr, VARIANT: gl.constexpr):
    WORD_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(128, 32)
    n8_l: gl.constexpr = gl.BlockedLayout([1, 16], [8 if VARIANT % 2 == 1 else 1, 4 if VARIANT % 2 == 1 else 32], [WARPS, 1], [1, 0])
    r8_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])
    n32_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [WARPS, 1], [1, 0])
    r32_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    if PREFETCH == 2:  # ids two blocks ahead, rows (as int32 words) one block ahead
        KV32 = KV.to(gl.pointer_type(gl.int32), bitcast=True)
        stride_w = stride_kv // 4
        W_NOPE: gl.constexpr = D_NOPE // 4
        W_ROPE: gl.constexpr = D_ROPE // 4
        in_ = _ids(IDX, idx_base, nrows, t_end, 0, BLOCK_N, n32_l)
        ir = _ids(IDX, idx_base, nrows, t_end, 0, BLOCK_N, r32_l)
        x_n = _gather(KV32, in_, stride_w, 0, W_NOPE, n32_l, 0, "")
        x_r = _gather(KV32, ir, stride_w, W_NOPE, W_ROPE, r32_l, 0, "")
        in_ = _ids(IDX, idx_base, nrows, t_end, BLOCK_N, BLOCK_N, n32_l)
        ir = _ids(IDX, idx_base, nrows, t_end, BLOCK_N, BLOCK_N, r32_l)
        for i in range(num_blocks):
            s = i % STAGES
            nn = _ids(IDX, idx_base, nrows, t_end, (i + 2) * BLOCK_N, BLOCK_N, n32_l)
            nr = _ids(IDX, idx_base, nrows, t_end, (i + 2) * BLOCK_N, BLOCK_N, r32_l)
            nx_n = _gather(KV32, in_, stride_w, 0, W_NOPE, n32_l, 0, "")
            nx_r = _gather(KV32, ir, stride_w, W_NOPE, W_ROPE, r32_l, 0, "")
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            kn_smem.index(s)._reinterpret(gl.int32, [BLOCK_N, D_NOPE // 2], WORD_LAYOUT).store(_words_to_f16(x_n))
            kr_smem.index(s)._reinterpret(gl.int32, [BLOCK_N, D_ROPE // 2], WORD_LAYOUT).store(_words_to_f16(x_r))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s))
            x_n = nx_n
            x_r = nx_r
            in_ = nn
            ir = nr
    elif PREFETCH == 1:  # ids one block ahead
        in_ = _ids(IDX, idx_base, nrows, t_end, 0, BLOCK_N, n8_l)
        ir = _ids(IDX, idx_base, nrows, t_end, 0, BLOCK_N, r8_l)
        for i in range(num_blocks):
            s = i % STAGES
            nn = _ids(IDX, idx_base, nrows, t_end, (i + 1) * BLOCK_N, BLOCK_N, n8_l)
            nr = _ids(IDX, idx_base, nrows, t_end, (i + 1) * BLOCK_N, BLOCK_N, r8_l)
            x_n = _gather(KV, in_, stride_kv, 0, D_NOPE, n8_l, 0.0, ".cg" if VARIANT >= 2 else "")
            x_r = _gather(KV, ir, stride_kv, D_NOPE, D_ROPE, r8_l, 0.0, ".cg" if VARIANT >= 2 else "")
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            kn_smem.index(s).store(x_n.to(gl.float16))
            kr_smem.index(s).store(x_r.to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s))
            in_ = nn
            ir = nr
    else:
        for i in range(num_blocks):
            s = i % STAGES
            if PROBE != 2:
                in_ = _ids(IDX, idx_base, nrows, t_end, i * BLOCK_N, BLOCK_N, n8_l)
                ir = _ids(IDX, idx_base, nrows, t_end, i * BLOCK_N, BLOCK_N, r8_l)
                x_n = _gather(KV, in_, stride_kv, 0, D_NOPE, n8_l, 0.0, ".cg" if VARIANT >= 2 else "")
                x_r = _gather(KV, ir, stride_kv, D_NOPE, D_ROPE, r8_l, 0.0, ".cg" if VARIANT >= 2 else "")
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            if PROBE != 2:
                kn_smem.index(s).store(x_n.to(gl.float16))
                kr_smem.index(s).store(x_r.to(gl.float16))
                fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s))


@gluon.jit
def _issue_half(IDX, KV, st_n, st_r, idx_base, stride_kv, nrows, t_end, h, n_half,
                HALF: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                n8_l: gl.constexpr, r8_l: gl.constexpr):
    """cp.async half-block ``h`` (HALF rows) of raw fp8 rows into staging slot views st_n / st_r."""
    if h < n_half:
        in_ = _ids(IDX, idx_base, nrows, t_end, h * HALF, HALF, n8_l)
        ir = _ids(IDX, idx_base, nrows, t_end, h * HALF, HALF, r8_l)
        rows_n = KV + in_.to(gl.int64) * stride_kv
        async_copy.async_copy_global_to_shared(
            st_n, rows_n[:, None] + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, n8_l))[None, :],
            mask=(in_ >= 0)[:, None])
        rows_r = KV + ir.to(gl.int64) * stride_kv + D_NOPE
        async_copy.async_copy_global_to_shared(
            st_r, rows_r[:, None] + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, r8_l))[None, :],
            mask=(ir >= 0)[:, None])
    async_copy.commit_group()


@gluon.jit
def _producer_staged(IDX, KV, kn_smem, kr_smem, sn_smem, sr_smem, ready, empty, idx_base, stride_kv, num_rows,
                     t_end, num_blocks, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                     STAGES: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr):
    """Raw fp8 half-blocks -> SLOTS-deep cp.async staging ring -> registers -> fp16 -> the wgmma ring."""
    HALF: gl.constexpr = BLOCK_N // 2
    n8_l: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [WARPS, 1], [1, 0])
    r8_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    n_half = 2 * num_blocks
    for h0 in gl.static_range(SLOTS - 1):
        _issue_half(IDX, KV, sn_smem.index(h0), sr_smem.index(h0), idx_base, stride_kv, nrows, t_end, h0, n_half,
                    HALF, D_NOPE, D_ROPE, n8_l, r8_l)
    for i in range(num_blocks):
        s = i % STAGES
        for j in gl.static_range(2):
            h = 2 * i + j
            async_copy.wait_group(SLOTS - 2)  # this thread's copies of half-block h have landed
            gl.thread_barrier()  # ... and every producer thread's; slot (h - 1) % SLOTS is read by all
            nxt = h + SLOTS - 1
            _issue_half(IDX, KV, sn_smem.index(nxt % SLOTS), sr_smem.index(nxt % SLOTS), idx_base, stride_kv,
                        nrows, t_end, nxt, n_half, HALF, D_NOPE, D_ROPE, n8_l, r8_l)
            x_n = sn_smem.index(h % SLOTS).load(n8_l)
            x_r = sr_smem.index(h % SLOTS).load(r8_l)
            if j == 0:
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            kn_smem.index(s).slice(j * HALF, HALF).store(x_n.to(gl.float16))
            kr_smem.index(s).slice(j * HALF, HALF).store(x_r.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))


@gluon.jit
def _issue_ids(IDX, ids_smem, idx_base, t_end, b, num_blocks, BLOCK_N: gl.constexpr, IDS_SLOTS: gl.constexpr,
               WARPS: gl.constexpr):
    """cp.async block ``b``'s raw ids (positions past t_end read -1) into slot b % IDS_SLOTS; one commit group."""
    ids_l: gl.constexpr = gl.BlockedLayout([2], [32], [WARPS], [0])
    if b < num_blocks:
        pos = b * BLOCK_N + gl.arange(0, BLOCK_N, layout=ids_l)
        async_copy.async_copy_global_to_shared(ids_smem.index(b % IDS_SLOTS), IDX + idx_base + pos, mask=pos < t_end)
    async_copy.commit_group()


@gluon.jit
def _ring_ids(ids_smem, b, nrows, t_end, BLOCK_N: gl.constexpr, IDS_SLOTS: gl.constexpr, layout: gl.constexpr):
    """Block b's ids from the ring in the row slice of ``layout``; invalid -> -1 (masked copies left stale
    data, so positions past t_end are masked here)."""
    pos = b * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    ids = ids_smem.index(b % IDS_SLOTS).load(gl.SliceLayout(1, layout))
    ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
    return gl.where(ok, ids, -1)


@gluon.jit
def _producer_ring(IDX, KV, kn_smem, kr_smem, ids_smem, ready, empty, idx_base, stride_kv, num_rows, t_end,
                   num_blocks, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                   STAGES: gl.constexpr, IDS_SLOTS: gl.constexpr, WARPS: gl.constexpr):
    """Register gather; the ids arrive IDS_SLOTS - 1 blocks ahead through a cp.async ring."""
    n8_l: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [WARPS, 1], [1, 0])
    r8_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    for b0 in gl.static_range(IDS_SLOTS - 1):
        _issue_ids(IDX, ids_smem, idx_base, t_end, b0, num_blocks, BLOCK_N, IDS_SLOTS, WARPS)
    for i in range(num_blocks):
        s = i % STAGES
        _issue_ids(IDX, ids_smem, idx_base, t_end, i + IDS_SLOTS - 1, num_blocks, BLOCK_N, IDS_SLOTS, WARPS)
        async_copy.wait_group(IDS_SLOTS - 1)
        gl.thread_barrier()
        in_ = _ring_ids(ids_smem, i, nrows, t_end, BLOCK_N, IDS_SLOTS, n8_l)
        ir = _ring_ids(ids_smem, i, nrows, t_end, BLOCK_N, IDS_SLOTS, r8_l)
        x_n = _gather(KV, in_, stride_kv, 0, D_NOPE, n8_l, 0.0, "")
        x_r = _gather(KV, ir, stride_kv, D_NOPE, D_ROPE, r8_l, 0.0, "")
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        kn_smem.index(s).store(x_n.to(gl.float16))
        kr_smem.index(s).store(x_r.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))


@gluon.jit
def _raw_ids(IDX, idx_base, t_end, n0, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    return gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)


@gluon.jit
def _valid(raw, nrows, t_end, n0, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    ok = (raw.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
    return gl.where(ok, raw, -1)


@gluon.jit
def _store_block(kn_smem, kr_smem, ready, empty, x_n, x_r, i, STAGES: gl.constexpr,
                 BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    WORD_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(128, 32)
    s = i % STAGES
    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
    kn_smem.index(s)._reinterpret(gl.int32, [BLOCK_N, D_NOPE // 2], WORD_LAYOUT).store(_words_to_f16(x_n))
    kr_smem.index(s)._reinterpret(gl.int32, [BLOCK_N, D_ROPE // 2], WORD_LAYOUT).store(_words_to_f16(x_r))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ready.index(s))


@gluon.jit
def _producer_pair(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
                   BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, STAGES: gl.constexpr):
    """Two register sets (even / odd blocks) of int32 words (4 fp8 each): the next block's gather is in
    flight while this one is converted and stored; raw ids are loaded a block earlier still."""
    n_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
    KV32 = KV.to(gl.pointer_type(gl.int32), bitcast=True)
    sw = stride_kv // 4
    WN: gl.constexpr = D_NOPE // 4
    WR: gl.constexpr = D_ROPE // 4
    nrows = num_rows.to(gl.uint32)
    ra = _raw_ids(IDX, idx_base, t_end, 0, BLOCK_N, n_l)
    rb = _raw_ids(IDX, idx_base, t_end, BLOCK_N, BLOCK_N, n_l)
    va = _valid(ra, nrows, t_end, 0, BLOCK_N, n_l)
    xa_n = _gather(KV32, va, sw, 0, WN, n_l, 0, "")
    xa_r = _gather(KV32, va, sw, WN, WR, n_l, 0, "")
    ra = _raw_ids(IDX, idx_base, t_end, 2 * BLOCK_N, BLOCK_N, n_l)
    for k in range(0, num_blocks, 2):
        vb = _valid(rb, nrows, t_end, (k + 1) * BLOCK_N, BLOCK_N, n_l)
        xb_n = _gather(KV32, vb, sw, 0, WN, n_l, 0, "")
        xb_r = _gather(KV32, vb, sw, WN, WR, n_l, 0, "")
        rb = _raw_ids(IDX, idx_base, t_end, (k + 3) * BLOCK_N, BLOCK_N, n_l)
        _store_block(kn_smem, kr_smem, ready, empty, xa_n, xa_r, k, STAGES, BLOCK_N, D_NOPE, D_ROPE)
        va = _valid(ra, nrows, t_end, (k + 2) * BLOCK_N, BLOCK_N, n_l)
        xa_n = _gather(KV32, va, sw, 0, WN, n_l, 0, "")
        xa_r = _gather(KV32, va, sw, WN, WR, n_l, 0, "")
        ra = _raw_ids(IDX, idx_base, t_end, (k + 4) * BLOCK_N, BLOCK_N, n_l)
        if k + 1 < num_blocks:
            _store_block(kn_smem, kr_smem, ready, empty, xb_n, xb_r, k + 1, STAGES, BLOCK_N, D_NOPE, D_ROPE)


@gluon.jit
def _consumer(IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p_smem, kn_smem, kr_smem, ready, empty,
              scale_smem, m_smem, l_smem, acc_smem, merged,
              pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
              stride_ot, stride_oh, stride_lt, stride_lh,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              STAGES: gl.constexpr, HAS_SINKS: gl.constexpr, FIRST: gl.constexpr, PROBE: gl.constexpr,
              MERGE_IN_RING: gl.constexpr):
    LOG2E_C: gl.constexpr = 1.4426950408889634
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_H, 16])
    col_scale = scale_smem.load(gl.SliceLayout(0, acc_l))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))
    acc = gl.zeros([D_NOPE, BLOCK_H], gl.float32, layout=acc_l)  # O^T
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
    for i in range(FIRST, num_blocks, 2):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if PROBE != 1:
            pos = i * BLOCK_N + offs_n
            ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
            ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
            kn = kn_smem.index(s)
            kr = kr_smem.index(s)
            st = warpgroup_mma(kn, q_n.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            st = warpgroup_mma(kr, q_r.permute((1, 0)), st, is_async=True)
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
            gl.thread_barrier()
            acc = warpgroup_mma(kn.permute((1, 0)), p_smem, acc * alpha[None, :], is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()
        mbarrier.arrive(empty.index(s))

    if MERGE_IN_RING:
        acc_smem = kn_smem.index(1)._reinterpret(gl.float32, [D_NOPE, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    if FIRST == 1:
        m_smem.store(m_i)
        l_smem.store(l_i)
        acc_smem.store(acc)
        gl.thread_barrier()
        mbarrier.arrive(merged)
    else:
        mbarrier.wait(merged, 0)
        m_o = m_smem.load(gl.SliceLayout(0, acc_l))
        l_o = l_smem.load(gl.SliceLayout(0, acc_l))
        acc_o = acc_smem.load(acc_l)
        m_new = gl.maximum(m_i, m_o)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        a_s = gl.exp2(m_i - m_safe)
        a_o = gl.exp2(m_o - m_safe)
        l_i = l_i * a_s + l_o * a_o
        m_i = m_new
        acc = acc * a_s[None, :] + acc_o * a_o[None, :]
        kv_s = gl.load(KV_SCALE)
        empty_row = l_i == 0.0
        l_safe = gl.where(empty_row, 1.0, l_i)
        lse2 = gl.where(empty_row, float("-inf"), m_i + gl.log2(l_safe))
        offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, acc_l))
        scale = kv_s / l_safe
        if HAS_SINKS:
            sink = gl.load(SINKS + offs_h, mask=offs_h < num_heads, other=float("-inf"))
            diff = gl.where(empty_row, 0.0, sink * LOG2E_C - lse2)
            scale = gl.where(empty_row, 0.0, scale / (1.0 + gl.exp2(diff)))
        gl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E_C, mask=offs_h < num_heads)
        out = acc * scale[None, :]
        offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, acc_l))
        o_ptr = OUT + pid_t * stride_ot + offs_h.to(gl.int64)[None, :] * stride_oh + offs_d[:, None]
        gl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(offs_h < num_heads)[None, :])


@gluon.jit
def pp_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE,
    sm_scale, num_heads, num_rows, topk,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, PROBE: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PREFETCH: gl.constexpr,
    PRODUCER_WARPS: gl.constexpr, SLOTS: gl.constexpr, IDS_SLOTS: gl.constexpr, VARIANT: gl.constexpr,
):
    LOG2E_C: gl.constexpr = 1.4426950408889634
    pid_t = gl.program_id(2).to(gl.int64)
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    num_blocks = gl.cdiv(t_end, BLOCK_N)
    idx_base = pid_t * stride_it
    q_n = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_NOPE],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_NOPE], gl.float16))
    q_r = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_ROPE],
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
    ids_smem = gl.allocate_shared_memory(gl.int32, [IDS_SLOTS, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if PREFETCH == 3:
        HALF: gl.constexpr = BLOCK_N // 2
        st_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        sn_smem = gl.allocate_shared_memory(KV.dtype.element_ty, [SLOTS, HALF, D_NOPE], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        sr_smem = gl.allocate_shared_memory(KV.dtype.element_ty, [SLOTS, HALF, D_ROPE], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        acc_smem = p0  # unused: the merge goes through ring stage 1
    else:
        acc_smem = gl.allocate_shared_memory(gl.float32, [D_NOPE, BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    merged = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(merged, count=1)

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
    q_n.store((qn * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    q_r.store((qr * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    kv_s = gl.load(KV_SCALE)
    scale_smem.store(gl.exp2(row_exp - 14.0) * (sm_scale * kv_s * LOG2E_C))
    fence_async_shared()
    gl.thread_barrier()
    if PREFETCH == 3:
        gl.warp_specialize([
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p0, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 0, PROBE, PREFETCH == 3)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p1, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 1, PROBE, PREFETCH == 3)),
        (_producer_staged, (IDX, KV, kn_smem, kr_smem, sn_smem, sr_smem, ready, empty, idx_base, stride_kv,
                            num_rows, t_end, num_blocks, BLOCK_N, D_NOPE, D_ROPE, STAGES, SLOTS, PRODUCER_WARPS)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif PREFETCH == 4:
        gl.warp_specialize([
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p0, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 0, PROBE, PREFETCH == 3)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p1, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 1, PROBE, PREFETCH == 3)),
        (_producer_ring, (IDX, KV, kn_smem, kr_smem, ids_smem, ready, empty, idx_base, stride_kv, num_rows, t_end,
                          num_blocks, BLOCK_N, D_NOPE, D_ROPE, STAGES, IDS_SLOTS, PRODUCER_WARPS)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif PREFETCH == 6:
        gl.warp_specialize([
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p0, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 0, PROBE, PREFETCH == 3)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p1, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 1, PROBE, PREFETCH == 3)),
        (_producer_pair, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end,
                          num_blocks, BLOCK_N, D_NOPE, D_ROPE, STAGES)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif PREFETCH == 7:  # the producer is the default partition; both consumers are workers
        gl.warp_specialize([
        (_producer_pair, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end,
                          num_blocks, BLOCK_N, D_NOPE, D_ROPE, STAGES)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p0, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 0, PROBE, PREFETCH == 3)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p1, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 1, PROBE, PREFETCH == 3)),
        ], [4, 4], [CONSUMER_REGS + VARIANT, CONSUMER_REGS])
    else:
        gl.warp_specialize([
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p0, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 0, PROBE, PREFETCH == 3)),
        (_consumer, (IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p1, kn_smem, kr_smem, ready, empty,
                     scale_smem, m_smem, l_smem, acc_smem, merged,
                     pid_t, idx_base, num_heads, num_rows, t_end, num_blocks,
                     stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS, 1, PROBE, PREFETCH == 3)),
        (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
                     BLOCK_N, D_NOPE, D_ROPE, STAGES, PROBE, PREFETCH, PRODUCER_WARPS, VARIANT)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def launch(q, kv_cache, indices, sinks=None, *, kv_scale, out, lse, topk_length=None, probe=0, consumer_regs=128,
           producer_regs=152, prefetch=0, producer_warps=4, slots=3, ids_slots=4, variant=0):
    T, H, _ = q.shape
    pp_kernel[(1, 1, T)](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices, kv_scale, out, lse,
        576 ** -0.5, H, min(kv_cache.shape[0], 2 ** 31), indices.shape[1],
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_H=16, BLOCK_N=64, D_NOPE=512, D_ROPE=64, STAGES=2,
        HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None, PROBE=probe,
        CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs, PREFETCH=prefetch,
        PRODUCER_WARPS=producer_warps, SLOTS=slots, IDS_SLOTS=ids_slots, VARIANT=variant, num_warps=4,
    )
    return out, lse


def launch_lib(q, kv_cache, indices, sinks=None, *, kv_scale, out, lse, topk_length=None):
    """The library kernel (mla_sink/kernels/gluon_fp8_decode.py), launched directly."""
    from mla_sink.kernels.gluon_fp8_decode import sparse_mla_decode_fp8_ws_kernel

    T, H, _ = q.shape
    sparse_mla_decode_fp8_ws_kernel[(1, 1, T)](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices, kv_scale, out, lse,
        576 ** -0.5, H, min(kv_cache.shape[0], 2 ** 31), indices.shape[1],
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_H=16, BLOCK_N=64, D_NOPE=512, D_ROPE=64,
        HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None, num_warps=4)
    return out, lse


BEST = dict(consumer_regs=128, producer_regs=152, prefetch=1, variant=1)
VARIANTS = {
    "pp4_lanes_ids": BEST,
}

def main():
    import torch

    from mla_sink.bench import GraphTimer
    from mla_sink.kernels.gluon_fp8_decode import sparse_mla_decode_fp8_gluon
    from mla_sink.kernels.triton_decode import sparse_mla_decode_triton
    from mla_sink.reference import sparse_mla_decode_reference

    out_path = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    rows = []
    N = 5000
    kv = (torch.randn(N, 576, device=dev) * 0.7).to(torch.float8_e4m3fn)
    kv[7] = float("nan")
    scale = torch.tensor([0.8], device=dev)
    for H, T, topk in [(16, 3, 2048), (16, 2, 100), (5, 2, 37), (16, 2, 0), (12, 3, 300), (16, 3, 64), (16, 3, 128)]:
        q = (torch.randn(T, H, 576, device=dev) * 3).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, topk), device=dev, dtype=torch.int32)
        idx[idx == 7] = 8
        if topk > 20:
            idx[0, :16] = -1
            idx[-1, 5] = N
            idx[-1, 9] = 2 ** 31 - 1
        sinks = torch.randn(H, device=dev) * 3
        if H > 3:
            sinks[0] = float("inf"); sinks[1] = float("-inf"); sinks[2] = 100.0
        tl_ = torch.tensor([topk, max(topk - 50, 0), 1][:T], device=dev, dtype=torch.int32)
        for (s, tlen), vname in [(st, v) for st in ((sinks, None), (None, tl_)) for v in ("lib",)]:
            rec = {"case": f"{vname} H{H} T{T} topk{topk} sinks={s is not None} topk_length={tlen is not None}"}
            try:
                o = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
                l = torch.empty(T, H, device=dev)
                launch_lib(q, kv, idx, s, kv_scale=scale, out=o, lse=l, topk_length=tlen)
                torch.cuda.synchronize()
                ro, rl = sparse_mla_decode_reference(q, kv, idx, s, kv_scale=scale, topk_length=tlen)
                d = (o.double() - ro).abs()
                rec["out_max_abs"] = d.max().item() if d.numel() else 0.0
                rec["out_bad"] = int(((d > 1e-3) & (d > (2 / 128) * ro.abs())).sum().item())
                fin = torch.isfinite(rl)
                rec["lse_max_abs"] = (l.double() - rl)[fin].abs().max().item() if fin.any() else 0.0
                rec["lse_inf_match"] = bool(torch.equal(torch.isneginf(l), torch.isneginf(rl)))
                rec["nan"] = bool(torch.isnan(o).any().item() or torch.isnan(l).any().item())
            except Exception:  # noqa: BLE001
                rec["error"] = traceback.format_exc()[-2000:]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    POOL = 3_500_000
    pool = torch.randn(POOL, 576, device=dev, dtype=torch.bfloat16)
    pool8 = pool.to(torch.float8_e4m3fn)
    one = torch.tensor([1.0], device=dev)
    timer = GraphTimer(reps=6, replays=3)
    for H, T in [(16, 256), (16, 132), (16, 255), (16, 64)]:
        q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, POOL, (T, 2048), device=dev, dtype=torch.int32)
        sinks = torch.randn(H, device=dev)
        o = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
        l = torch.empty(T, H, device=dev)
        rec = {"case": f"time H{H} T{T}"}
        try:
            ro, rl = sparse_mla_decode_reference(q, pool8, idx, sinks, kv_scale=one)
            kw = dict(kv_scale=one, out=o, lse=l)
            rec["lib_fp8_us"] = timer.time_us(lambda: sparse_mla_decode_fp8_gluon(q, pool8, idx, sinks, **kw))
            rec["lib_direct_us"] = timer.time_us(lambda: launch_lib(q, pool8, idx, sinks, **kw))
            for name, cfg in VARIANTS.items():
                launch(q, pool8, idx, sinks, **cfg, **kw)
                rec[f"{name}_err"] = (o.double() - ro).abs().max().item()
                rec[f"{name}_us"] = timer.time_us(lambda: launch(q, pool8, idx, sinks, **cfg, **kw))
            rec["portable_bf16_us"] = timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=o, lse=l))
        except Exception:  # noqa: BLE001
            rec["error"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
