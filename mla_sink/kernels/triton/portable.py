"""The portable Triton kernel (``portable``): sparse MLA decode with fused sinks and a natural-log,
sink-free LSE, for every target Triton compiles for and the CPU (through the interpreter).

Semantics are those of :func:`mla_sink.core.reference.sparse_mla_decode_reference` (the float64 reference):
``s_j = sm_scale * q.k_j`` over the valid ids of a token row (``0 <= id < N``, position ``<
topk_length[t]``), optionally soft-capped ``s = cap * tanh(s / cap)``; ``lse = log(sum_j exp(s_j))``
(natural log, sink excluded, ``-inf`` for an empty row); ``out = sum_j exp(s_j - lse) v_j`` times
``sigmoid(lse - sink)`` (0 on empty rows; ``sink = +inf`` gives 0, ``sink = -inf`` changes nothing).

Kernel structure (one program per (head block, KV split, token); head blocks of one token are
adjacent in launch order so their identical gathers hit L2):

* the 576 dims are two dots: a 512-dim latent dot and a 64-dim RoPE dot (Triton blocks are powers of
  two); the gathered latent tile is reused as V (no second load);
* online softmax in base 2 (``log2 e`` folded into the scale), fp32 accumulation; the LSE written to
  ``lse`` is converted back to natural log;
* ids that are ``-1``, negative, ``>= N`` or past ``topk_length`` are masked in the gathered load
  (``other=0``): their rows are never read, so NaN in unreferenced rows cannot leak; ids are cast
  to int64 before multiplying by the row stride (pools beyond 2^31 bytes), and head indices before
  multiplying by q's and out's head strides (a head-major buffer viewed token-major);
* fp8 KV/q are converted to bf16 tiles (exact; fp16 tiles with ``FP8_F16``) and the per-tensor scales,
  read from device memory, are folded into the scores and the output; ``fp8_e4m3fnuz`` is decoded from
  its bits through ``e4m3fn`` (value / 2, with its own NaN and max encodings) so it runs on NVIDIA and
  the CPU too;
* the 656-byte V3.2 rows (``KV_DS_MLA``, :mod:`mla_sink.core.kv_layout`): ``KV`` is the uint8 pool and
  row ``id`` starts at byte ``(id // kv_block_size) * stride_kv + (id % kv_block_size) * 656`` (64-bit;
  a flat ``[N, 656]`` pool is ``kv_block_size = 1`` with its row stride, a paged one its block size and
  block stride); each row's 512 e4m3 codes are converted to fp32 and multiplied by their 128-column
  tile's float32 scale (read from the row's bytes 512..527, exactly) before the one rounding to q's
  dtype, and its 64 bf16 RoPE values (bytes 528..655) are converted to q's dtype; no per-tensor scale;
* split-KV (``num_kv_splits > 1``): stage 1 writes fp32 partial ``(out, lse2)`` per split (a split
  with no valid id writes ``out = 0, lse2 = -inf``), stage 2 merges them in fp32 and applies the sink
  exactly once.

``LOG2E``, the id check, the fnuz decode, the online-softmax step and the sink epilogue are written
once, as jit helpers, in :mod:`mla_sink.kernels.triton.math` (``kmath``; the combine kernel uses the
same ``LOG2E`` and sink epilogue).

Source: the split-KV decode + combine structure of lightllm/sglang ``decode_attention`` kernels; the
online softmax of Triton tutorial 06; the sink formula of FlashMLA ``flash_mla_interface.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_sink.kernels.triton import math as kmath


def _sparse_mla_decode_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, Q_SCALE, KV_SCALE,
    OUT, LSE, PART_OUT, PART_LSE,
    sm_scale, logit_cap,
    num_heads, num_rows, kv_block_size, topk, ids_per_split,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
    HAS_SINKS: tl.constexpr, HAS_TOPK_LEN: tl.constexpr, HAS_CAP: tl.constexpr,
    Q_FP8: tl.constexpr, KV_FP8: tl.constexpr, Q_FNUZ: tl.constexpr, KV_FNUZ: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, FP8_F16: tl.constexpr, ROW_SCALE: tl.constexpr,
    EVEN: tl.constexpr, KV_DS_MLA: tl.constexpr, DS_TILE: tl.constexpr,
):
    """Stage 1: one program = (head block, KV split, token). See the module docstring."""
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_t = tl.program_id(2).to(tl.int64)

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    # 64-bit head offsets: q and out may have a head stride of any size (a head-major buffer viewed token-major
    # puts (H - 1) * stride beyond 2^31 elements)
    offs_h64 = offs_h.to(tl.int64)
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    offs_n = tl.arange(0, BLOCK_N)

    # ---- q tile [BLOCK_H, 512] + [BLOCK_H, 64]; padded heads load 0 ----
    q_ptr = Q + pid_t * stride_qt + offs_h64[:, None] * stride_qh
    q_nope = tl.load(q_ptr + offs_d[None, :], mask=mask_h[:, None], other=0.0)
    q_rope = tl.load(q_ptr + D_NOPE + offs_r[None, :], mask=mask_h[:, None], other=0.0)

    # Scale of the scores: sm_scale * q_scale * kv_scale (times log2(e) in scores_base2), and below the inverse of
    # q's row scale. The factors are multiplied in float64 and rounded to fp32 once, so that only the whole
    # factor's range matters, not the order of the product: in fp32, sm_scale = 2^126 times q_scale = 8 overflowed
    # to inf (NaN scores) where the factor with kv_scale = 2^-106 is 2^23 (a break test, fortieth session).
    qk_scale64 = tl.cast(sm_scale, tl.float64)
    if Q_FP8:
        qk_scale64 = qk_scale64 * tl.load(Q_SCALE).to(tl.float64)
    if KV_FP8:
        qk_scale64 = qk_scale64 * tl.load(KV_SCALE).to(tl.float64)
    qk_scale = qk_scale64.to(tl.float32)

    if Q_FP8:
        q_dtype: tl.constexpr = tl.float16 if FP8_F16 else tl.bfloat16
        q_nope = kmath.fp8_tile(q_nope, Q_FNUZ, UPCAST, q_dtype)
        q_rope = kmath.fp8_tile(q_rope, Q_FNUZ, UPCAST, q_dtype)
    elif ROW_SCALE:
        # bf16 q with fp8 KV computed in fp16 (fp8 -> fp16 is one instruction, fp8 -> bf16 several):
        # scale each head row by a power of two so that its largest finite |q| is 2^14 (fits fp16, exact
        # for bf16 mantissas); the inverse scale is applied to the scores. An inf or NaN in q stays what it
        # is (inf times the scale; the max of an inf would make the scale 0 and inf * 0 NaN)
        qn = kmath.upcast(q_nope, UPCAST).to(tl.float32)
        qr = kmath.upcast(q_rope, UPCAST).to(tl.float32)
        qmax = tl.maximum(tl.max(kmath.finite_abs(qn), 1), tl.max(kmath.finite_abs(qr), 1))
        row_exp = tl.math.ceil(tl.log2(tl.maximum(qmax, 1e-30)))
        row_scale = tl.exp2(14.0 - row_exp)
        # the scores' factor undoes the row scale per head row (in float64 with the others: a tiny q row's scale
        # 2^138 times sm_scale 2^126 times kv_scale 8 is 2^-9, whose fp32 parts overflowed)
        qk_scale = (qk_scale64 * tl.exp2(row_exp - 14.0).to(tl.float64)).to(tl.float32)[:, None]
        qn = qn * row_scale[:, None]
        qr = qr * row_scale[:, None]
        if UPCAST:
            q_nope = qn
            q_rope = qr
        else:
            q_nope = qn.to(tl.float16)
            q_rope = qr.to(tl.float16)
    else:
        q_nope = kmath.upcast(q_nope, UPCAST)
        q_rope = kmath.upcast(q_rope, UPCAST)

    # ---- this split's id range ----
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = tl.minimum(tl.maximum(tl.load(TOPK_LEN + pid_t), 0), topk)
    start = pid_s * ids_per_split
    end = tl.minimum(start + ids_per_split, t_end)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    idx_row = IDX + pid_t * stride_it
    if KV_DS_MLA:
        # ---- the 656-byte V3.2 rows: four 128-column tiles, each with its own float32 scale per row ----
        # Scores: q.k = sum_i scale_i * (q_i . e4m3_i) + q_rope . k_rope, each tile product exact (e4m3 values are
        # bf16 and fp16 values), the scale applied in fp32. P.V per tile: (p * scale_i) @ e4m3_i (kmath.ds_mla_pv).
        tl.static_assert(D_NOPE == 4 * DS_TILE)
        offs_c = tl.arange(0, DS_TILE)
        q_tile = q_ptr + offs_c[None, :]
        q0 = tl.load(q_tile, mask=mask_h[:, None], other=0.0)
        q1 = tl.load(q_tile + DS_TILE, mask=mask_h[:, None], other=0.0)
        q2 = tl.load(q_tile + 2 * DS_TILE, mask=mask_h[:, None], other=0.0)
        q3 = tl.load(q_tile + 3 * DS_TILE, mask=mask_h[:, None], other=0.0)
        q0 = kmath.upcast(q0, UPCAST)
        q1 = kmath.upcast(q1, UPCAST)
        q2 = kmath.upcast(q2, UPCAST)
        q3 = kmath.upcast(q3, UPCAST)
        acc0 = tl.zeros([BLOCK_H, DS_TILE], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_H, DS_TILE], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_H, DS_TILE], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_H, DS_TILE], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            ids, valid = kmath.block_ids(idx_row, n0 + offs_n, end, num_rows, EVEN)
            # byte offset of row id (64-bit): (id // kv_block_size) * stride_kv + (id % kv_block_size) * 656
            ids64 = ids.to(tl.int64)
            row = (KV + (ids64 // kv_block_size) * stride_kv
                   + (ids64 % kv_block_size) * (D_NOPE + 4 * (D_NOPE // DS_TILE) + 2 * D_ROPE))
            scale_ptr = (row + D_NOPE).to(tl.pointer_type(tl.float32))  # bytes 512..527
            s0 = tl.load(scale_ptr, mask=valid, other=0.0)
            s1 = tl.load(scale_ptr + 1, mask=valid, other=0.0)
            s2 = tl.load(scale_ptr + 2, mask=valid, other=0.0)
            s3 = tl.load(scale_ptr + 3, mask=valid, other=0.0)
            k0 = kmath.e4m3_codes(row, offs_c, valid, q0.dtype, UPCAST)
            k1 = kmath.e4m3_codes(row + DS_TILE, offs_c, valid, q0.dtype, UPCAST)
            k2 = kmath.e4m3_codes(row + 2 * DS_TILE, offs_c, valid, q0.dtype, UPCAST)
            k3 = kmath.e4m3_codes(row + 3 * DS_TILE, offs_c, valid, q0.dtype, UPCAST)
            rope_ptr = (row + D_NOPE + 4 * (D_NOPE // DS_TILE)).to(tl.pointer_type(tl.bfloat16))  # bytes 528..655
            k_rope = kmath.upcast(tl.load(rope_ptr[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0), UPCAST)

            qk = kmath.ds_mla_rope_scores(q_rope, k_rope)
            qk += tl.dot(q0, tl.trans(k0)) * s0[None, :]
            qk += tl.dot(q1, tl.trans(k1)) * s1[None, :]
            qk += tl.dot(q2, tl.trans(k2)) * s2[None, :]
            qk += tl.dot(q3, tl.trans(k3)) * s3[None, :]
            # NaN where a tile scale of the id is inf or NaN: the reference's code x scale is then inf or NaN
            # (0 x inf), and so is its score; a dot times an inf scale alone could give a finite weight
            qk += ((s0 - s0) + (s1 - s1) + (s2 - s2) + (s3 - s3))[None, :]
            s = kmath.scores_base2(qk, qk_scale, logit_cap, HAS_CAP)
            s = tl.where(valid[None, :], s, float("-inf"))

            m_i, l_i, p, alpha = kmath.online_softmax_step(m_i, l_i, s)
            acc0 = kmath.ds_mla_pv(acc0 * alpha[:, None], p, s0, k0)
            acc1 = kmath.ds_mla_pv(acc1 * alpha[:, None], p, s1, k1)
            acc2 = kmath.ds_mla_pv(acc2 * alpha[:, None], p, s2, k2)
            acc3 = kmath.ds_mla_pv(acc3 * alpha[:, None], p, s3, k3)

        # ---- epilogue: the four tiles side by side ----
        empty, l_safe, lse2 = kmath.final_lse2(m_i, l_i)
        if SPLIT:
            row_scale = 1.0 / l_safe
            dst = PART_OUT + pid_t * stride_pt + pid_s * stride_ps + offs_h64[:, None] * stride_ph + offs_c[None, :]
            tl.store(PART_LSE + pid_t * stride_plt + pid_s * stride_pls + offs_h, lse2, mask=mask_h)
        else:
            row_scale = 1.0 / l_safe
            if HAS_SINKS:
                sink = tl.load(SINKS + offs_h, mask=mask_h, other=float("-inf"))
                row_scale = kmath.sink_scale(row_scale, sink, lse2, empty)
            dst = OUT + pid_t * stride_ot + offs_h64[:, None] * stride_oh + offs_c[None, :]
            tl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / kmath.LOG2E, mask=mask_h)
        out_ty = dst.dtype.element_ty
        tl.store(dst, (acc0 * row_scale[:, None]).to(out_ty), mask=mask_h[:, None])
        tl.store(dst + DS_TILE, (acc1 * row_scale[:, None]).to(out_ty), mask=mask_h[:, None])
        tl.store(dst + 2 * DS_TILE, (acc2 * row_scale[:, None]).to(out_ty), mask=mask_h[:, None])
        tl.store(dst + 3 * DS_TILE, (acc3 * row_scale[:, None]).to(out_ty), mask=mask_h[:, None])
    else:
        acc = tl.zeros([BLOCK_H, D_NOPE], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            ids, valid = kmath.block_ids(idx_row, n0 + offs_n, end, num_rows, EVEN)
            row = KV + ids.to(tl.int64) * stride_kv
            k_nope = tl.load(row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
            k_rope = tl.load(row[:, None] + D_NOPE + offs_r[None, :], mask=valid[:, None], other=0.0)
            if KV_FP8:
                k_nope = kmath.fp8_tile(k_nope, KV_FNUZ, UPCAST, q_nope.dtype)
                k_rope = kmath.fp8_tile(k_rope, KV_FNUZ, UPCAST, q_nope.dtype)
            else:
                k_nope = kmath.upcast(k_nope, UPCAST)
                k_rope = kmath.upcast(k_rope, UPCAST)

            qk = tl.dot(q_nope, tl.trans(k_nope))
            qk = tl.dot(q_rope, tl.trans(k_rope), qk)
            s = kmath.scores_base2(qk, qk_scale, logit_cap, HAS_CAP)
            s = tl.where(valid[None, :], s, float("-inf"))

            m_i, l_i, p, alpha = kmath.online_softmax_step(m_i, l_i, s)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)

        # ---- epilogue ----
        empty, l_safe, lse2 = kmath.final_lse2(m_i, l_i)
        out = acc / l_safe[:, None]
        if KV_FP8:
            out = out * tl.load(KV_SCALE)

        if SPLIT:
            po = PART_OUT + pid_t * stride_pt + pid_s * stride_ps + offs_h64[:, None] * stride_ph + offs_d[None, :]
            tl.store(po, out, mask=mask_h[:, None])
            tl.store(PART_LSE + pid_t * stride_plt + pid_s * stride_pls + offs_h, lse2, mask=mask_h)
        else:
            if HAS_SINKS:
                sink = tl.load(SINKS + offs_h, mask=mask_h, other=float("-inf"))
                # sigmoid(lse - sink) = 1 / (1 + 2^((sink - lse) * log2 e)); 0 on empty rows.
                out = out * kmath.sink_scale(1.0, sink, lse2, empty)[:, None]
            o_ptr = OUT + pid_t * stride_ot + offs_h64[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=mask_h[:, None])
            tl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / kmath.LOG2E, mask=mask_h)


portable_jit = triton.jit(_sparse_mla_decode_kernel)
