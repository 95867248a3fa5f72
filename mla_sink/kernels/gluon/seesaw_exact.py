"""The seesaw kernel's consumers for V3.2 rows read exactly (``KV_DS_EXACT``): the recompute of the programs that
the power-of-two reading flags (:mod:`mla_sink.kernels.gluon.gluon_seesaw`, whose schedule they keep). The tiles hold
each code times its scale's power of two (:func:`~mla_sink.kernels.gluon.seesaw_fp8.scale_pow2`); the decoder leaves
the scales' mantissas and the Horner ratios in a stash (:func:`~mla_sink.kernels.gluon.seesaw_fp8.decode_half`), which
these consumers apply in fp32: to the scores by Horner's rule over the four tiles (:func:`_ds_scores`) and to ``P``
per tile for ``P V`` (:func:`_p_tiles`, two ``[64, 128]`` output tiles per consumer). The other consumer's weights go
as fp16 over the slot's RoPE tile. Measured on the H200 against the designs before it: BENCHMARKS.md, twenty-first
session."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from mla_sink.kernels.gluon.gather import ids_ok
from mla_sink.kernels.gluon.seesaw_common import (
    COL_L,
    NB_M_ODD,
    NB_P_EVEN,
    NB_P_ODD,
    O2_L,
    P2_L,
    ROW_L,
    S_L,
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
from mla_sink.kernels.gluon.seesaw_fp8 import DS_TILE, decode_half, stash_row


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
def _exact_start(q_ready, sm_scale, KV_SCALE, num_rows, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                 HALF_V: gl.constexpr, KV_FMT: gl.constexpr):
    """:func:`~mla_sink.kernels.gluon.seesaw_common._consumer_start`'s state with the output half as two zero
    ``[64, 128]`` tiles: ``(qk_scale, offs_n, nrows, m_i, l_i, o_a, o_b, s_zero)``."""
    qk_scale, offs_n, nrows, m_i, l_i, o_half, s_zero = _consumer_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                        BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
    o_a = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    o_b = gl.zeros([BLOCK_H, DS_TILE], gl.float32, layout=O2_L)
    return qk_scale, offs_n, nrows, m_i, l_i, o_a, o_b, s_zero


@gluon.jit
def _consumer_even_ds(IDX, SINKS, OUT, LSE, PART_OUT, PART_LSE, KV_SCALE, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope,
                      sc_smem, m_even, m_odd, l_even, l_odd, q_ready, ready_lo, ready_hi, free_lo, free_hi,
                      bar_l_even, bar_l_odd,
                      pid_h, pid_s, pid_t, idx_base, start, end, num_pairs, sm_scale, num_heads, num_rows,
                      stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                      stride_pls, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr,
                      HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, KV_FMT: gl.constexpr):
    """Consumer 0 for V3.2 rows read exactly (``KV_DS_EXACT``; default partition):
    :func:`~mla_sink.kernels.gluon.gluon_seesaw._consumer_even`'s schedule with every tile scale applied in fp32
    (:func:`_ds_scores`, :func:`_p_tiles`); its value columns 0-255 are tiles 0 and 1 (stash rows ``4 * slot + 0, 1``),
    the odd block's weights come as fp16 from the odd slot's RoPE tile."""
    row_l: gl.constexpr = ROW_L
    dtype: gl.constexpr = q_lo.dtype
    qk_scale, offs_n, nrows, m_i, l_i, o_a, o_b, s_zero = _exact_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                       BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
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
        m_new, alpha, p, l_i = _even_max(sc, ok, qk_scale, m_i, l_i, m_even, j)
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
    """Consumer 1 for V3.2 rows read exactly (``KV_DS_EXACT``; worker partition):
    :func:`~mla_sink.kernels.gluon.gluon_seesaw._consumer_odd`'s schedule with every tile scale applied in fp32; its
    value columns 256-511 are tiles 2 and 3 (stash rows ``4 * slot + 2, 3``). Its block's RoPE comes with the odd slot's
    lo half, and its weights go over that RoPE tile as fp16 for consumer 0; writes the LSE."""
    dtype: gl.constexpr = q_lo.dtype
    qk_scale, offs_n, nrows, m_i, l_i, o_a, o_b, s_zero = _exact_start(q_ready, sm_scale, KV_SCALE, num_rows,
                                                                       BLOCK_H, BLOCK_N, HALF_V, KV_FMT)
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
        m_new, alpha, p, l_i = _odd_max(sc, ok, qk_scale, m_i, l_i, m_even, m_odd, j)
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
