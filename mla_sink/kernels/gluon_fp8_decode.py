"""Warp-specialised sparse MLA decode with fp8 (e4m3fn) KV and few heads (H <= 16), sm90, in Gluon.

Semantics of :mod:`mla_sink.kernels.triton_decode` (float64 reference in :mod:`mla_sink.reference`).
At H <= 16 the portable kernel is bound by converting fp8 tiles inside its MMA loop (once per operand
layout) and by mma.sync's 16-row tiles re-reading q from shared memory in every warp. Here:

* roles are swapped so the tensor cores see a wide M: ``S^T = K q^T`` (wgmma M = 64 ids, N = 16
  heads, K = 576) and ``O^T += V^T P^T`` (M = 512 value columns, N = 16, K = 64 ids); the tiles
  are read by the tensor cores straight from shared memory, q and P are the small N-side operands;
* a producer warpgroup gathers each block's 64 fp8 rows into registers (16-byte loads, masked lanes
  read 0; issued before it waits for a free stage), converts them to fp16 once (``cvt`` e4m3x2 ->
  f16x2: exact) and stores them into a 2-stage ring of ``[64, 512]`` + ``[64, 64]`` fp16 tiles;
* one consumer warpgroup keeps q in shared memory as fp16 (each head row scaled by a power of two so
  its largest ``|q|`` is 2^14: exact for bf16 mantissas, undone on the scores), runs the online
  softmax per head (columns of ``S^T``) in base 2, writes ``P^T`` (fp16) to shared memory for the
  second product, and applies the sink and the per-tensor ``kv_scale`` in the epilogue.

Source: the swapped ("transposed") decode GEMMs of FlashInfer/FlashMLA small-head decode kernels and
FlashMLA's fp8 dequantisation outside the MMA warps; Triton's Gluon tutorials for the primitives.
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


@gluon.jit
def _load_block(IDX, KV, idx_base, stride_kv, nrows, t_end, n0,
                BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """One block's fp8 rows into registers (invalid ids and positions past ``t_end`` read 0)."""
    nope_l: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0])
    rope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    pos_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, nope_l))
    ids_n = gl.load(IDX + idx_base + pos_n, mask=pos_n < t_end, other=-1)
    ok_n = (ids_n.to(gl.uint32, bitcast=True) < nrows) & (pos_n < t_end)
    rows_n = KV + ids_n.to(gl.int64) * stride_kv
    x_n = gl.load(rows_n[:, None] + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, nope_l))[None, :],
                  mask=ok_n[:, None], other=0.0)
    pos_r = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rope_l))
    ids_r = gl.load(IDX + idx_base + pos_r, mask=pos_r < t_end, other=-1)
    ok_r = (ids_r.to(gl.uint32, bitcast=True) < nrows) & (pos_r < t_end)
    rows_r = KV + ids_r.to(gl.int64) * stride_kv + D_NOPE
    x_r = gl.load(rows_r[:, None] + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_l))[None, :],
                  mask=ok_r[:, None], other=0.0)
    return x_n, x_r


@gluon.jit
def _producer(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
              BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, STAGES: gl.constexpr):
    """Worker partition: fp8 rows -> registers -> fp16 (once) -> the shared-memory ring."""
    nrows = num_rows.to(gl.uint32)
    for i in range(num_blocks):
        s = i % STAGES
        x_n, x_r = _load_block(IDX, KV, idx_base, stride_kv, nrows, t_end, i * BLOCK_N, BLOCK_N, D_NOPE, D_ROPE)
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        kn_smem.index(s).store(x_n.to(gl.float16))
        kr_smem.index(s).store(x_r.to(gl.float16))
        fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))


@gluon.jit
def _consumer(Q, IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p_smem, kn_smem, kr_smem, ready, empty,
              pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
              stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              STAGES: gl.constexpr, HAS_SINKS: gl.constexpr):
    """Default partition (one warpgroup): S^T, the per-head online softmax, O^T, the epilogue."""
    LOG2E_C: gl.constexpr = 1.4426950408889634
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_H, 16])
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])

    # q -> fp16 in shared memory, each head row scaled so that its largest |q| is 2^14.
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
    fence_async_shared()
    gl.thread_barrier()
    kv_s = gl.load(KV_SCALE)
    # per-head factor on the scores (columns of S^T): undo the q scaling, sm_scale, kv_scale, base 2
    col_scale = gl.convert_layout(gl.exp2(row_exp - 14.0), gl.SliceLayout(0, acc_l)) * (sm_scale * kv_s * LOG2E_C)

    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))
    acc = gl.zeros([D_NOPE, BLOCK_H], gl.float32, layout=acc_l)  # O^T
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
    for i in range(num_blocks):
        s = i % STAGES
        pos = i * BLOCK_N + offs_n
        ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
        ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
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
        gl.thread_barrier()  # P^T complete in shared memory before the wgmma reads it
        acc = warpgroup_mma(kn.permute((1, 0)), p_smem, acc * alpha[None, :], is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # every consumer warp is done with stage s and with P^T
        mbarrier.arrive(empty.index(s))

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
def sparse_mla_decode_fp8_ws_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE,
    sm_scale, num_heads, num_rows, topk,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr,
):
    """One CTA = one token (all of its <= 16 heads). See the module docstring."""
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
    p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_H],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], gl.float16))
    kn_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], gl.float16))
    kr_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], gl.float16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (Q, IDX, SINKS, KV_SCALE, OUT, LSE, q_n, q_r, p_smem, kn_smem, kr_smem, ready, empty,
                     pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
                     stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS)),
        (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
                     BLOCK_N, D_NOPE, D_ROPE, STAGES)),
    ], [4], [152])  # producer: one warpgroup at 152 registers (one block of fp8 rows in flight)


def sparse_mla_decode_fp8_gluon(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None,
                                kv_scale=None, out=None, lse=None, stages: int = 2):
    """Launch :func:`sparse_mla_decode_fp8_ws_kernel` (CUDA sm90; ``H <= 16``; e4m3fn KV; bf16/fp16 q).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16, innermost stride 1. kv_cache: ``[N, 576]`` float8_e4m3fn,
            innermost stride 1. indices: int32 ``[T, topk]``, innermost stride 1 (``-1`` / negative /
            ``>= N`` skipped). sinks: optional fp32 ``[H]``. sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]`` (contiguous). kv_scale: fp32 ``[1]`` (value = stored *
            scale); ``None`` means 1. out, lse: optional ``[T, H, 512]`` (innermost stride 1) and fp32
            ``[T, H]`` buffers.

    Returns:
        ``(out, lse)`` as :func:`mla_sink.kernels.triton_decode.sparse_mla_decode_triton` returns them.

    Raises:
        ValueError: ``num_heads > 16``.
    """
    import torch

    from .gluon_decode import launch_buffers

    T, H, _ = q.shape
    if H > 16:
        raise ValueError(f"sparse_mla_decode_fp8_gluon serves at most 16 heads, got num_heads={H}")
    topk = indices.shape[1]
    out, lse, sm_scale = launch_buffers(q, out, lse, sm_scale)
    if T == 0 or H == 0:
        return out, lse
    if kv_scale is None:
        kv_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    sparse_mla_decode_fp8_ws_kernel[(1, 1, T)](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices, kv_scale,
        out, lse,
        float(sm_scale), H, min(kv_cache.shape[0], 2 ** 31), topk,
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_H=16, BLOCK_N=64, D_NOPE=512, D_ROPE=64, STAGES=stages,
        HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None,
        num_warps=4,
    )
    return out, lse
