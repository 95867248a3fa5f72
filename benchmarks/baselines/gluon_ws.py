"""BASELINE, not part of the library: the warp-specialised kernel ``gluon_ws`` that served bf16/fp16 at H > 32
on sm90 until 2026-12-01, kept here (outside the package) so the benchmark scripts can measure the
seesaw kernel (:mod:`mla_sink.kernels.gluon.gluon_seesaw`) that replaced it against it on the same data.

Warp-specialised sparse MLA decode for sm90 (Hopper), written in Triton's Gluon dialect.

Same semantics as :mod:`mla_sink.paths.triton.launch` (float64 reference in :mod:`mla_sink.core.reference`):
sink fused in the epilogue, natural-log sink-free LSE, ``-1`` / negative / ``>= N`` ids skipped wherever
they sit, empty rows give ``out = 0`` and ``lse = -inf``, unreferenced KV rows never read, 64-bit row
offsets. It serves the launches the portable kernel runs slowest on Hopper: 64-head blocks, bf16 or
fp16 q and KV, no soft cap, no split-KV (``tables/triton_tuning.yaml`` decides; the portable kernel
serves everything else).

Structure (one CTA = one token x 64 heads):

* a producer warpgroup (worker partition, few registers) gathers the token's KV rows with ``cp.async``
  into a 2-stage ring of ``[64 ids, 512]`` + ``[64 ids, 64]`` tiles; each stage has a ``ready``
  mbarrier (every producer thread arrives when its copies land) and an ``empty`` mbarrier (the
  consumers arrive when the stage's last MMA has finished);
* two consumer warpgroups (the default partition) keep q in shared memory and run
  ``S = q K^T`` (wgmma, each warpgroup 64 heads x 32 ids), the online softmax in base 2, and
  ``O += P V`` (wgmma with P from registers, each warpgroup 256 of the 512 value columns). The P V
  wgmma is left in flight while the next block's scores are issued, so the tensor cores work while
  the next block is waited for; the consumers spend no instruction on gather addresses.

Masked ``cp.async`` lanes zero-fill, so a skipped id contributes a zero row whose score is then set to
``-inf`` (weight exactly 0).

Source: the producer/consumer split of FlashMLA's sm90 decode kernels and of FlashAttention-3
(warp specialisation, wgmma pipelining); the Gluon primitives of Triton's Gluon tutorials
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
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from mla_sink.kernels.gluon.math import LOG2E, sink_scale

#: Heads of one CTA: the wgmma M of the score and output tiles (4 warps x 16 rows).
HEAD_BLOCK = 64


@gluon.jit
def _producer(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
              BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, STAGES: gl.constexpr,
              ROWS: gl.constexpr):
    """Worker partition: gather each block's KV rows into the ring (masked lanes zero-fill)."""
    nope_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_c = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, nope_l))
    offs_rn = gl.arange(0, ROWS, layout=gl.SliceLayout(1, nope_l))
    offs_cr = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_l))
    offs_rr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rope_l))
    nrows = num_rows.to(gl.uint32)
    for i in range(num_blocks):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        n0 = i * BLOCK_N
        for r in gl.static_range(BLOCK_N // ROWS):
            pos = n0 + r * ROWS + offs_rn
            ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
            ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
            rows = KV + ids.to(gl.int64) * stride_kv
            async_copy.async_copy_global_to_shared(kn_smem.index(s).slice(r * ROWS, ROWS),
                                                   rows[:, None] + offs_c[None, :], mask=ok[:, None])
        pos = n0 + offs_rr
        ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
        ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
        rows = KV + ids.to(gl.int64) * stride_kv + D_NOPE
        async_copy.async_copy_global_to_shared(kr_smem.index(s), rows[:, None] + offs_cr[None, :], mask=ok[:, None])
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def _consumer(Q, IDX, SINKS, OUT, LSE, q_n, q_r, kn_smem, kr_smem, ready, empty,
              pid_h, pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
              stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              STAGES: gl.constexpr, HAS_SINKS: gl.constexpr):
    """Default partition (two warpgroups): scores, online softmax, P V, epilogue with the sink."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    dtype: gl.constexpr = Q.dtype.element_ty

    # q tile -> shared memory (padded heads load 0)
    offs_hq = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_l))
    offs_dq = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld_l))
    offs_rq = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld_l))
    q_rows = Q + pid_t * stride_qt + offs_hq.to(gl.int64)[:, None] * stride_qh
    hmask = (offs_hq < num_heads)[:, None]
    q_n.store(gl.load(q_rows + offs_dq[None, :], mask=hmask, other=0.0))
    q_r.store(gl.load(q_rows + D_NOPE + offs_rq[None, :], mask=hmask, other=0.0))
    fence_async_shared()
    gl.thread_barrier()

    qk_scale = sm_scale * LOG2E
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_l))
    nrows = num_rows.to(gl.uint32)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
    acc = warpgroup_mma_init(gl.zeros([BLOCK_H, D_NOPE], gl.float32, layout=o_l))  # async P V in flight
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
    for i in range(num_blocks):
        s = i % STAGES
        pos = i * BLOCK_N + offs_n
        ids = gl.load(IDX + idx_base + pos, mask=pos < t_end, other=-1)
        ok = (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < t_end)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        fence_async_shared()
        kn = kn_smem.index(s)
        kr = kr_smem.index(s)
        sc = warpgroup_mma(q_n, kn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sc = warpgroup_mma(q_r, kr.permute((1, 0)), sc, is_async=True)
        sc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(sc, acc))
        if i > 0:  # the previous block's P V has finished in every consumer warp: hand its stage back
            gl.thread_barrier()
            mbarrier.arrive(empty.index((i - 1) % STAGES))
        sc = gl.where(ok[None, :], sc * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc_t = acc_t * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_l), kn, acc_t, is_async=True)
    acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse2 = gl.where(empty_row, float("-inf"), m_i + gl.log2(l_safe))
    offs_hs = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_l))
    scale = 1.0 / l_safe
    if HAS_SINKS:
        sink = gl.load(SINKS + offs_hs, mask=offs_hs < num_heads, other=float("-inf"))
        scale = sink_scale(scale, sink, lse2, empty_row)
    gl.store(LSE + pid_t * stride_lt + offs_hs * stride_lh, lse2 / LOG2E, mask=offs_hs < num_heads)
    out = acc_t * gl.convert_layout(scale, gl.SliceLayout(1, o_l))[:, None]
    offs_ho = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_l))
    offs_do = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, o_l))
    o_ptr = OUT + pid_t * stride_ot + offs_ho.to(gl.int64)[:, None] * stride_oh + offs_do[None, :]
    gl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(offs_ho < num_heads)[:, None])


@gluon.jit
def sparse_mla_decode_ws_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, OUT, LSE,
    sm_scale, num_heads, num_rows, topk,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr,
):
    """One CTA = (head block, 1, token). See the module docstring."""
    pid_h = gl.program_id(0)
    pid_t = gl.program_id(2).to(gl.int64)
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    num_blocks = gl.cdiv(t_end, BLOCK_N)
    idx_base = pid_t * stride_it
    dtype: gl.constexpr = Q.dtype.element_ty
    q_n = gl.allocate_shared_memory(dtype, [BLOCK_H, D_NOPE], gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_NOPE], dtype))
    q_r = gl.allocate_shared_memory(dtype, [BLOCK_H, D_ROPE], gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], dtype))
    kn_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], dtype))
    kr_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], dtype))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=32 * 4)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (Q, IDX, SINKS, OUT, LSE, q_n, q_r, kn_smem, kr_smem, ready, empty,
                     pid_h, pid_t, idx_base, sm_scale, num_heads, num_rows, t_end, num_blocks,
                     stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
                     BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, STAGES, HAS_SINKS)),
        (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, num_rows, t_end, num_blocks,
                     BLOCK_N, D_NOPE, D_ROPE, STAGES, 16)),
    ], [4], [56])  # producer: one warpgroup at 56 registers; the consumers get the rest (240)


def sparse_mla_decode_gluon(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None, out=None, lse=None,
                            block_n: int = 64, stages: int = 2):
    """Launch :func:`sparse_mla_decode_ws_kernel` (CUDA sm90 only; bf16 or fp16 q and KV of one dtype).

    Args:
        q: ``[T, H, 576]`` CUDA tensor, innermost stride 1. kv_cache: ``[N, 576]``, innermost stride 1.
        indices: int32 ``[T, topk]``, innermost stride 1 (``-1`` / negative / ``>= N`` skipped).
        sinks: optional fp32 ``[H]`` natural-log sink logits. sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]`` (contiguous). out: optional ``[T, H, 512]`` buffer
            (innermost stride 1); lse: optional fp32 ``[T, H]`` buffer.

    Returns:
        ``(out, lse)`` as :func:`mla_sink.paths.triton.launch.sparse_mla_decode_triton` returns them.

    Inputs are validated by the caller; no host synchronisation (CUDA-graph safe).
    """
    T, H, _ = q.shape
    topk = indices.shape[1]
    from mla_sink.kernels.gluon import launch_buffers

    out, lse, sm_scale = launch_buffers(q, out, lse, sm_scale)
    if T == 0 or H == 0:
        return out, lse
    block_h = HEAD_BLOCK
    sparse_mla_decode_ws_kernel[(-(-H // block_h), 1, T)](
        q, kv_cache, indices, sinks if sinks is not None else lse,
        topk_length if topk_length is not None else indices,
        out, lse,
        float(sm_scale), H, min(kv_cache.shape[0], 2 ** 31), topk,
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        BLOCK_H=block_h, BLOCK_N=block_n, D_NOPE=512, D_ROPE=64, STAGES=stages,
        HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None,
        num_warps=8,
    )
    return out, lse
