"""Warp-specialised sparse MLA decode with fp8 (e4m3fn) KV and few heads (H <= 16), for sm90, in Gluon.

Semantics of :mod:`mla_sink.kernels.triton_decode` (float64 reference in :mod:`mla_sink.reference`).
With fp8 KV the portable kernel converts every fp8 element inside the MMA loop, once per operand
layout (the score and the value products read the same tile in two layouts), so at H = 16 the
conversion, not the gather, bounds it. Here the conversion leaves the MMA warps:

* a producer warpgroup gathers each block's fp8 rows with ``cp.async`` into a staging ring (several
  blocks in flight, masked lanes zero-fill), reads each block back, converts it to fp16 once (``cvt`` e4m3x2 -> f16x2: exact) and stores
  them into a 2-stage ring of fp16 ``[64, 512]`` + ``[64, 64]`` tiles (``ready`` / ``empty``
  mbarriers per stage);
* a consumer warpgroup keeps q in shared memory as fp16 (each head row scaled by a power of two so its
  largest ``|q|`` is 2^14: exact for bf16 mantissas, undone on the scores), and runs mma.sync
  (16 x 8 x 16 tiles: the 16 heads are the M dimension, nothing padded) for ``S = q K^T`` and
  ``O += P V`` from the fp16 tiles, the online softmax in base 2, and the epilogue with the sink and
  the per-tensor ``kv_scale``.

Source: the producer/consumer split of FlashMLA's fp8 sparse decode (dequantisation outside the MMA
warps); Triton's Gluon tutorials for the primitives; the power-of-two q scaling of the portable kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier


@gluon.jit
def _issue_block(IDX, KV, st_n, st_r, idx_base, stride_kv, nrows, t_end, n0,
                 BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                 NOPE_L: gl.constexpr, ROPE_L: gl.constexpr):
    """cp.async one block's fp8 rows into a staging slot (masked lanes zero-fill), as one commit group."""
    pos_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, NOPE_L))
    ids_n = gl.load(IDX + idx_base + pos_n, mask=pos_n < t_end, other=-1)
    ok_n = (ids_n.to(gl.uint32, bitcast=True) < nrows) & (pos_n < t_end)
    rows_n = KV + ids_n.to(gl.int64) * stride_kv
    async_copy.async_copy_global_to_shared(
        st_n, rows_n[:, None] + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, NOPE_L))[None, :], mask=ok_n[:, None])
    pos_r = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ROPE_L))
    ids_r = gl.load(IDX + idx_base + pos_r, mask=pos_r < t_end, other=-1)
    ok_r = (ids_r.to(gl.uint32, bitcast=True) < nrows) & (pos_r < t_end)
    rows_r = KV + ids_r.to(gl.int64) * stride_kv + D_NOPE
    async_copy.async_copy_global_to_shared(
        st_r, rows_r[:, None] + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ROPE_L))[None, :], mask=ok_r[:, None])
    async_copy.commit_group()


@gluon.jit
def _producer(IDX, KV, stage_n, stage_r, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end,
              num_blocks, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, STAGES: gl.constexpr,
              STAGES8: gl.constexpr):
    """Worker partition: fp8 rows -> staging ring (cp.async, STAGES8 - 1 blocks in flight) -> registers ->
    fp16 -> the compute ring. Each thread reads back exactly the bytes it copied (same layout), so the
    staging ring needs no barrier."""
    NOPE_L: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    ROPE_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    nrows = num_rows.to(gl.uint32)
    for j in gl.static_range(STAGES8 - 1):
        _issue_block(IDX, KV, stage_n.index(j), stage_r.index(j), idx_base, stride_kv, nrows, t_end, j * BLOCK_N,
                     BLOCK_N, D_NOPE, D_ROPE, NOPE_L, ROPE_L)
    for i in range(num_blocks):
        s = i % STAGES
        async_copy.wait_group(STAGES8 - 2)  # block i has landed (this thread's part of it)
        x_n = stage_n.index(i % STAGES8).load(NOPE_L)
        x_r = stage_r.index(i % STAGES8).load(ROPE_L)
        nxt = i + STAGES8 - 1  # into the slot read in the previous iteration
        _issue_block(IDX, KV, stage_n.index(nxt % STAGES8), stage_r.index(nxt % STAGES8), idx_base, stride_kv,
                     nrows, t_end, nxt * BLOCK_N, BLOCK_N, D_NOPE, D_ROPE, NOPE_L, ROPE_L)
        y_n = x_n.to(gl.float16)
        y_r = x_r.to(gl.float16)
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        kn_smem.index(s).store(y_n)
        kr_smem.index(s).store(y_r)
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))
    async_copy.wait_group(0)


@gluon.jit
def _consumer(Q, IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, kn_smem, kr_smem, ready, empty,
              pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
              stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              STAGES: gl.constexpr, HAS_SINKS: gl.constexpr):
    """Default partition (one warpgroup): scores, online softmax, P V and the epilogue."""
    LOG2E_C: gl.constexpr = 1.4426950408889634
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_l, k_width=2)
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 4], [1, 0])

    # q -> fp16 in shared memory, each head row scaled so that its largest |q| is 2^14.
    offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_l))
    q_rows = Q + pid_t * stride_qt + offs_h.to(gl.int64)[:, None] * stride_qh
    hmask = (offs_h < num_heads)[:, None]
    qn = gl.load(q_rows + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask, other=0.0)
    qr = gl.load(q_rows + D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask,
                 other=0.0)
    qn = qn.to(gl.float32)
    qr = qr.to(gl.float32)
    qmax = gl.maximum(gl.max(gl.abs(qn), axis=1), gl.max(gl.abs(qr), axis=1))
    row_exp = gl.ceil(gl.log2(gl.maximum(qmax, 1e-30)))
    q_n.store((qn * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    q_r.store((qr * gl.exp2(14.0 - row_exp)[:, None]).to(gl.float16))
    gl.thread_barrier()
    kv_s = gl.load(KV_SCALE)
    inv_row = gl.convert_layout(gl.exp2(row_exp - 14.0), gl.SliceLayout(1, mma_l))
    qk_scale = sm_scale * kv_s * LOG2E_C

    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_l))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_l))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, mma_l))
    acc = gl.zeros([BLOCK_H, D_NOPE], gl.float32, layout=mma_l)
    for i in range(num_blocks):
        s = i % STAGES
        pos = i * BLOCK_N + offs_n
        ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
        ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        kn = kn_smem.index(s)
        kr = kr_smem.index(s)
        sc = mma_v2(q_r.load(a_l), kr.permute((1, 0)).load(b_l), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=mma_l))
        for k in gl.static_range(D_NOPE // D_ROPE):  # 64-wide K chunks keep the operands in few registers
            sc = mma_v2(q_n.slice(k * D_ROPE, D_ROPE, dim=1).load(a_l),
                        kn.slice(k * D_ROPE, D_ROPE, dim=1).permute((1, 0)).load(b_l), sc)
        sc = gl.where(ok[None, :], sc * (inv_row * qk_scale)[:, None], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = mma_v2(gl.convert_layout(p.to(gl.float16), a_l), kn.load(b_l), acc * alpha[:, None])
        gl.thread_barrier()  # every consumer warp is done reading stage s
        mbarrier.arrive(empty.index(s))

    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse2 = gl.where(empty_row, float("-inf"), m_i + gl.log2(l_safe))
    offs_hs = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, mma_l))
    scale = kv_s / l_safe
    if HAS_SINKS:
        sink = gl.load(SINKS + offs_hs, mask=offs_hs < num_heads, other=float("-inf"))
        diff = gl.where(empty_row, 0.0, sink * LOG2E_C - lse2)
        scale = gl.where(empty_row, 0.0, scale / (1.0 + gl.exp2(diff)))
    gl.store(LSE + pid_t * stride_lt + offs_hs * stride_lh, lse2 / LOG2E_C, mask=offs_hs < num_heads)
    out = acc * scale[:, None]
    offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, mma_l))
    o_ptr = OUT + pid_t * stride_ot + offs_hs.to(gl.int64)[:, None] * stride_oh + offs_d[None, :]
    gl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(offs_hs < num_heads)[:, None])


@gluon.jit
def sparse_mla_decode_fp8_ws_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE,
    sm_scale, num_heads, num_rows, topk,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, STAGES8: gl.constexpr, HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr,
):
    """One CTA = one token (all of its <= 16 heads). See the module docstring."""
    pid_t = gl.program_id(2).to(gl.int64)
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    num_blocks = gl.cdiv(t_end, BLOCK_N)
    idx_base = pid_t * stride_it
    sw: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    q_n = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_NOPE], sw)
    q_r = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_ROPE], sw)
    kn_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_NOPE], sw)
    kr_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_ROPE], sw)
    raw: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    stage_n = gl.allocate_shared_memory(KV.dtype.element_ty, [STAGES8, BLOCK_N, D_NOPE], raw)
    stage_r = gl.allocate_shared_memory(KV.dtype.element_ty, [STAGES8, BLOCK_N, D_ROPE], raw)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (Q, IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, kn_smem, kr_smem, ready, empty,
                     pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
                     stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS)),
        (_producer, (IDX, KV, stage_n, stage_r, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows,
                     t_end, num_blocks, BLOCK_N, D_NOPE, D_ROPE, STAGES, STAGES8)),
    ], [4], [152])


def sparse_mla_decode_fp8_gluon(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None,
                                kv_scale=None, out=None, lse=None, block_n: int = 32, stages: int = 2,
                                stages8: int = 4):
    """Launch :func:`sparse_mla_decode_fp8_ws_kernel` (CUDA sm90; ``H <= 16``; e4m3fn KV; bf16/fp16 q).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16, innermost stride 1. kv_cache: ``[N, 576]`` float8_e4m3fn,
            innermost stride 1. indices: int32 ``[T, topk]``, innermost stride 1.
        sinks: optional fp32 ``[H]``. sm_scale: default ``576 ** -0.5``. topk_length: optional int32
            ``[T]`` (contiguous). kv_scale: fp32 ``[1]`` (value = stored * scale); ``None`` means 1.
        out, lse: optional ``[T, H, 512]`` (innermost stride 1) and fp32 ``[T, H]`` buffers.

    Returns:
        ``(out, lse)`` as :func:`mla_sink.kernels.triton_decode.sparse_mla_decode_triton` returns them.
    """
    import torch

    T, H, d_qk = q.shape
    if H > 16:
        raise ValueError(f"sparse_mla_decode_fp8_gluon serves at most 16 heads, got num_heads={H}")
    topk = indices.shape[1]
    if out is None:
        out = torch.empty((T, H, 512), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    if T == 0 or H == 0:
        return out, lse
    if sm_scale is None:
        sm_scale = d_qk ** -0.5
    if kv_scale is None:
        kv_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    sparse_mla_decode_fp8_ws_kernel[(1, 1, T)](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices, kv_scale,
        out, lse,
        float(sm_scale), H, min(kv_cache.shape[0], 2 ** 31), topk,
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_H=16, BLOCK_N=block_n, D_NOPE=512, D_ROPE=64, STAGES=stages, STAGES8=stages8,
        HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None,
        num_warps=4,
    )
    return out, lse
