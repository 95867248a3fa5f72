"""Gathers shared by the seesaw kernel's producers (:mod:`mla_sink.kernels.gluon.gluon_seesaw`,
:mod:`mla_sink.kernels.gluon.seesaw_fp8`): a token's ids, checked, and its q rows into shared memory."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy


@gluon.jit
def ids_ok(IDX, idx_base, pos, end, nrows):
    """(ids, valid) of the positions ``pos`` of one token row: ``pos < end`` and ``0 <= id < N`` (one
    unsigned compare; ``nrows`` is uint32 and at most 2^31)."""
    in_range = pos < end
    ids = gl.load(IDX + idx_base + pos, mask=in_range, other=-1)
    return ids, in_range & (ids.to(gl.uint32, bitcast=True) < nrows)


@gluon.jit
def pair_ids(IDX, idx_base, n0, end, nrows, PAIR: gl.constexpr, layout: gl.constexpr):
    """The ids of a pair of blocks (positions ``n0 .. n0 + PAIR``), ``-1`` where the id is skipped (past
    ``end``, negative or ``>= N``)."""
    pos = n0 + gl.arange(0, PAIR, layout=layout)
    ids, ok = ids_ok(IDX, idx_base, pos, end, nrows)
    return gl.where(ok, ids, -1)


@gluon.jit
def gather_q(Q, q_lo, q_hi, q_rope, q_ready, pid_h, pid_t, num_heads, stride_qt, stride_qh,
              BLOCK_H: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr, ROWS: gl.constexpr,
              half_l: gl.constexpr, rope_l: gl.constexpr):
    """cp.async the token's q ``[64 heads, 576]`` into shared memory (padded heads zero-fill), ``ROWS``
    heads per call, and arrive on ``q_ready`` once the copies land (one arrive per thread)."""
    offs_h = pid_h * BLOCK_H + gl.arange(0, ROWS, layout=gl.SliceLayout(1, half_l))
    offs_c = gl.arange(0, HALF_V, layout=gl.SliceLayout(0, half_l))
    offs_hr = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, rope_l))
    offs_cr = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, rope_l))
    q_row0 = Q + pid_t * stride_qt
    for r in gl.static_range(BLOCK_H // ROWS):
        h = offs_h + r * ROWS
        rows = q_row0 + h.to(gl.int64) * stride_qh
        hm = (h < num_heads)[:, None]
        async_copy.async_copy_global_to_shared(q_lo.index(0).slice(r * ROWS, ROWS), rows[:, None] + offs_c[None, :],
                                               mask=hm)
        async_copy.async_copy_global_to_shared(q_hi.index(0).slice(r * ROWS, ROWS),
                                               rows[:, None] + HALF_V + offs_c[None, :], mask=hm)
    rows = q_row0 + offs_hr.to(gl.int64) * stride_qh
    async_copy.async_copy_global_to_shared(q_rope.index(0), rows[:, None] + 2 * HALF_V + offs_cr[None, :],
                                           mask=(offs_hr < num_heads)[:, None])
    async_copy.mbarrier_arrive(q_ready, increment_count=False)
