"""The fp8 producer of the seesaw kernel (:mod:`mla_sink.kernels.gluon.gluon_seesaw`): one warpgroup that
copies an fp8 cache's raw bytes into the same two slots of half tiles, and the decoder
(:func:`decode_half`) with which each consumer turns the halves of its own block into q's dtype in place.

Two fp8 caches (``KV_FMT``), both read as bytes:

* :data:`KV_E4M3`: ``[N, 576]`` e4m3fn rows with one per-tensor ``kv_scale``. e4m3 -> bf16 / fp16 is exact,
  so the tiles hold the codes and the consumers fold ``kv_scale`` into the score scale and the output (no
  multiply per value);
* :data:`KV_DS_MLA`: the 656-byte V3.2 rows (``mla_sink.core.kv_layout``): 512 e4m3 latent values, four
  float32 scales (one per 128 values), 64 bf16 RoPE values. Each value is decoded as ``e4m3 x scale`` in
  fp32, the scale read as the float32 it is, then rounded once to bf16: exact when the scale is 0 or a
  power of two in ``kv_layout.BF16_EXACT_SCALE_EXP`` (FlashMLA's quantiser), not for other scales (vLLM's
  ``amax / 448``). So every pair's scales are checked before the pair is handed over, and a CTA that
  meets another scale stops and flags its token for the launcher's exact recompute (:func:`fp8_producer`).
  Rows ``[N, 656]`` or pages ``[blocks, block_size, 656]`` with any block stride: id ``i`` is at byte
  ``(i // block_size) * stride_kv + (i % block_size) * 656``.
* :data:`KV_DS_EXACT`: the same rows, read exactly for every scale: the launcher's recompute of the flagged
  programs (one launch of the same grid, each program gated by its own flag). The tiles hold each code times its
  scale's power of two (:func:`scale_pow2`, exact in bf16); the producer copies each half's two tile scales per id
  into a stash of their own (``sc_smem``), the decoder turns them into their mantissas (:func:`scale_mantissa`)
  and the Horner ratios of the scores, and the consumers apply those in fp32
  (:mod:`mla_sink.kernels.gluon.gluon_seesaw`). Its RoPE comes with the even slot's hi half and the odd slot's lo
  half (the half consumer 0 reads last, with the odd block's ``P``, which then lives in that RoPE tile).

Why this way. The bytes travel by ``cp.async`` (no registers) into the very half of the slot that will hold
their decoded tile, which is twice as large: shared memory (q 72 KB, two 72 KB slots, one P buffer) has no
room for a staging buffer, and the producer has only the 72 registers the two consumer warpgroups leave (a
fourth warpgroup caps the kernel at 128 registers before ``setmaxnreg``, too few for the consumers'
m64n256 wgmma). The producer only copies, as the bf16 / fp16 producer does: each half as soon as the
consumers free it, ``ready`` completing when its bytes land, so the next halves' copies are in flight while
earlier ones are decoded. The consumer that reads a half first decodes it (:func:`decode_half`): reads all
its raw bytes into registers, synchronises its warpgroup (no thread writes before every thread has read),
writes the tile in the wgmma layout and fences it for wgmma. Consumer 0 decodes the even block's halves,
consumer 1 the odd block's, at the same time. Decoding in the producer instead (its copies of the next half
waited for each decode) took 480 against 398 us at H=128, T=256 for e4m3 and 550 against 433 for V3.2
(BENCHMARKS.md, seventh session). Masked (skipped) ids zero-fill: their codes and scales decode to 0 and the
consumers give them weight 0.

Source: FlashMLA's sm90 sparse fp8 decode (``csrc/sm90/decode/sparse_fp8/``, deepseek-ai/FlashMLA 9241ae3:
dequantisation in a warpgroup of its own, 128-bit loads), read, not copied; the Gluon primitives of
Triton's Gluon tutorials.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, mbarrier

from mla_sink.core import kv_layout
from mla_sink.kernels.gluon.gather import gather_q, pair_ids

#: ``KV_FMT`` of a bf16 / fp16 cache (the seesaw kernel's own producer), a per-tensor e4m3fn cache and
#: the 656-byte V3.2 rows (decoded into bf16 times their scales, flagging scales that bf16 cannot hold; or read
#: exactly for every scale).
KV_HALF = gl.constexpr(0)
KV_E4M3 = gl.constexpr(1)
KV_DS_MLA = gl.constexpr(2)
KV_DS_EXACT = gl.constexpr(3)
#: Byte layout of a V3.2 row (mla_sink.core.kv_layout): latent codes, then 4 float32 scales, then RoPE.
DS_SCALES_AT = gl.constexpr(kv_layout.SCALE_OFFSET)
DS_ROPE_AT = gl.constexpr(kv_layout.ROPE_OFFSET)
#: Values per scale of a V3.2 row, so 2 tiles per half (256 columns).
DS_TILE = gl.constexpr(kv_layout.TILE)
#: Bytes of a per-tensor e4m3 row's latent codes (one byte per latent value): its RoPE codes follow.
E4M3_ROPE_AT = gl.constexpr(kv_layout.D_NOPE)
#: Biased float32 exponent fields of the power-of-two V3.2 scales whose tiles decode exactly into bf16
#: (``mla_sink.core.kv_layout.BF16_EXACT_SCALE_EXP``; float32 bias 127).
DS_EXACT_EXP_LO = gl.constexpr(kv_layout.BF16_EXACT_SCALE_EXP[0] + 127)
DS_EXACT_EXP_HI = gl.constexpr(kv_layout.BF16_EXACT_SCALE_EXP[1] + 127)
#: Arrivals that complete a consumer's first half of a V3.2 pair (``ready_lo[0]``, ``ready_hi[1]``): one per
#: producer thread when its copies land, and one (release) after the pair's stop decision is written, which
#: the consumer reads once the half is ready (:func:`stop_flag`). The other halves take the copies' only.
COPIERS = gl.constexpr(32 * 4)  # the producer warpgroup's threads
FIRST_HALF_ARRIVALS = gl.constexpr(COPIERS.value + 1)
#: Layout of a half tile's codes as the decoder (decode_half) reads them: [64, 128] codes, 16 bytes a lane.
TILE_L = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]))
#: The stop flags of the two pair parities (words 0 and 64 of the flag buffer), read by every thread.
ONE_L = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
#: The flag buffer ``[2, 64]`` int32 (row = pair parity), one word per thread of a warpgroup.
FLAG_L = gl.constexpr(gl.BlockedLayout([1, 1], [1, 32], [2, 2], [1, 0]))
#: The four tile scales of each id of a pair (``[128, 4]`` float32): one id and 16 bytes per thread.
PAIR_SCALES_L = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))


@gluon.jit
def _row_offsets(ids, kv_block_size, stride_kv, ROW_BYTES: gl.constexpr):
    """Byte offsets (int64) of the rows ``ids``: page ``id // kv_block_size`` at ``stride_kv`` bytes,
    ``ROW_BYTES`` per row inside it (``kv_block_size`` 1 for a flat cache, whose row stride is
    ``stride_kv``). Skipped ids (``-1``) give an offset that is never read."""
    i = gl.maximum(ids, 0).to(gl.int64)
    return (i // kv_block_size) * stride_kv + (i % kv_block_size) * ROW_BYTES


@gluon.jit
def _raw_views(buf):
    """Views of a ``[64, 256]`` slot half as the loader fills it: latent codes ``[64, 256]`` uint8 (first
    16 KB), the two tile scales of each row ``[2, 64]`` float32 (tile-major, next 512 bytes) and, for an
    e4m3 cache, the RoPE codes ``[64, 64]`` uint8 (same place: an e4m3 cache has no scales)."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    codes = buf._reinterpret(gl.uint8, [128, 256], flat).slice(0, 64)
    scales = buf._reinterpret(gl.float32, [128, 64], flat).slice(64, 2)
    rope = buf._reinterpret(gl.uint8, [512, 64], flat).slice(256, 64)
    return codes, scales, rope


@gluon.jit
def _load_half(KV, buf, k_rope, sc_smem, ids_smem, id0, stride_kv, kv_block_size, ready,
               COL0: gl.constexpr, ROW: gl.constexpr, WITH_ROPE: gl.constexpr, KV_FMT: gl.constexpr,
               ROW_BYTES: gl.constexpr):
    """Loader: cp.async the raw bytes of one half block (ids ``ids_smem[id0 .. id0 + 64]``, ``-1`` zero-fills):
    latent codes ``COL0 .. COL0 + 256``, the rows' two scales of those columns (V3.2) and, for the half with
    ``WITH_ROPE``, the RoPE (V3.2: bf16 straight into ``k_rope``; e4m3: codes beside the latent ones); then
    one arrive per thread on ``ready`` when they land. :data:`KV_DS_EXACT`: the scales go to stash rows ``ROW``,
    ``ROW + 1`` of ``sc_smem`` (:func:`stash_row`) instead of beside the codes."""
    codes_l: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0])  # 16-byte copies
    codes, scales, rope_codes = _raw_views(buf)
    if KV_FMT == KV_DS_EXACT:
        scales = sc_smem.slice(ROW, 2)
    ids = ids_smem.slice(id0, 64).load(gl.SliceLayout(1, codes_l))
    rows = KV + _row_offsets(ids, kv_block_size, stride_kv, ROW_BYTES)
    cols = COL0 + gl.arange(0, 256, layout=gl.SliceLayout(0, codes_l))
    async_copy.async_copy_global_to_shared(codes, rows[:, None] + cols[None, :], mask=(ids >= 0)[:, None])
    if KV_FMT == KV_DS_MLA or KV_FMT == KV_DS_EXACT:
        sc_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [2, 2], [1, 0])  # 4-byte copies
        ids_s = ids_smem.slice(id0, 64).load(gl.SliceLayout(0, sc_l))
        rows_s = KV + _row_offsets(ids_s, kv_block_size, stride_kv, ROW_BYTES) + DS_SCALES_AT + (COL0 // DS_TILE) * 4
        tile = gl.arange(0, 2, layout=gl.SliceLayout(1, sc_l))
        ptrs = (rows_s[None, :] + tile[:, None] * 4).to(gl.pointer_type(gl.float32), bitcast=True)
        async_copy.async_copy_global_to_shared(scales, ptrs, mask=(ids_s >= 0)[None, :])
        if WITH_ROPE:
            rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
            ids_r = ids_smem.slice(id0, 64).load(gl.SliceLayout(1, rope_l))
            rows_r = (KV + _row_offsets(ids_r, kv_block_size, stride_kv, ROW_BYTES) + DS_ROPE_AT).to(
                gl.pointer_type(k_rope.dtype), bitcast=True)
            cols_r = gl.arange(0, 64, layout=gl.SliceLayout(0, rope_l))
            async_copy.async_copy_global_to_shared(k_rope, rows_r[:, None] + cols_r[None, :],
                                                   mask=(ids_r >= 0)[:, None])
    elif WITH_ROPE:
        rope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        ids_r = ids_smem.slice(id0, 64).load(gl.SliceLayout(1, rope_l))
        rows_r = KV + _row_offsets(ids_r, kv_block_size, stride_kv, ROW_BYTES) + E4M3_ROPE_AT
        cols_r = gl.arange(0, 64, layout=gl.SliceLayout(0, rope_l))
        async_copy.async_copy_global_to_shared(rope_codes, rows_r[:, None] + cols_r[None, :],
                                               mask=(ids_r >= 0)[:, None])
    async_copy.mbarrier_arrive(ready, increment_count=False)


@gluon.jit
def _decode(codes, scale, KV_FMT: gl.constexpr, dtype: gl.constexpr):
    """Codes (uint8 e4m3fn bits) -> ``dtype``: exactly (per-tensor cache), or times their tile ``scale`` per
    row in ``dtype`` (V3.2): exact for the power-of-two scales :func:`_inexact` accepts, which ``dtype`` (bf16)
    holds exactly; the tokens with other scales are flagged and recomputed."""
    v = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(dtype)  # exact: e4m3 fits bf16 / fp16
    if KV_FMT == KV_DS_MLA:  # in bf16x2: exact for the power-of-two scales _inexact accepts (others are
        v = v * scale.to(dtype)[:, None]  # flagged and recomputed, so their rounding does not matter)
    return v


@gluon.jit
def _inexact(scale):
    """1 where a V3.2 tile scale (float32) would not decode its tile exactly into bf16 (not 0 and not a
    power of two in ``BF16_EXACT_SCALE_EXP``; inf and NaN included), else 0. Skipped ids load 0: exact."""
    bits = scale.to(gl.int32, bitcast=True) & 0x7FFFFFFF
    exp = bits >> 23
    pow2 = ((bits & 0x7FFFFF) == 0) & (exp >= DS_EXACT_EXP_LO) & (exp <= DS_EXACT_EXP_HI)
    return gl.where((bits == 0) | pow2, 0, 1)


@gluon.jit
def _pair_scales(KV, ids, kv_block_size, stride_kv, ROW_BYTES: gl.constexpr):
    """The four float32 tile scales of each id of a pair (``ids`` [128], one per thread, ``-1`` skipped:
    zeros), one 16-byte load per thread; issued a pair ahead, like the ids."""
    ids_s = gl.convert_layout(ids, gl.SliceLayout(1, PAIR_SCALES_L))  # the same thread per id: no data moves
    rows = (KV + _row_offsets(ids_s, kv_block_size, stride_kv, ROW_BYTES) + DS_SCALES_AT).to(
        gl.pointer_type(gl.float32), bitcast=True)
    tile = gl.arange(0, 4, layout=gl.SliceLayout(0, PAIR_SCALES_L))
    return gl.load(rows[:, None] + tile[None, :], mask=(ids_s >= 0)[:, None], other=0.0)


@gluon.jit
def stop_flag(redo_smem, j):
    """The producer's decision for pair ``j`` (:func:`fp8_producer`): nonzero when a scale of the pair's
    rows cannot be decoded exactly, and the CTA stops before the pair. Uniform: every thread reads the
    one word of the pair's parity (two words, so that the decision for pair ``j + 1`` can be published
    while a consumer has yet to read the one for ``j``)."""
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    words = redo_smem._reinterpret(gl.int32, [2 * 64], flat1)
    even = gl.max(words.slice(0, 1).load(ONE_L), axis=0)
    odd = gl.max(words.slice(64, 1).load(ONE_L), axis=0)
    return gl.where((j & 1) == 0, even, odd)


@gluon.jit
def _publish(redo_smem, j, stop):
    """Write the decision ``stop`` for pair ``j`` into the word of its parity (each thread rewrites its own
    word of the ``[2, 64]`` buffer; the other parity's words keep their values)."""
    row = gl.arange(0, 2, layout=gl.SliceLayout(1, FLAG_L))[:, None] + gl.zeros([2, 64], gl.int32, layout=FLAG_L)
    redo_smem.store(gl.where(row == (j & 1), stop, redo_smem.load(FLAG_L)))


@gluon.jit
def _exp_field(scale):
    """The biased float32 exponent field of V3.2 scales (float32), clamped to ``[DS_EXACT_EXP_LO,
    DS_EXACT_EXP_HI]``."""
    e = (scale.to(gl.int32, bitcast=True) >> 23) & 0xFF
    return gl.minimum(gl.maximum(e, DS_EXACT_EXP_LO), DS_EXACT_EXP_HI)


@gluon.jit
def scale_pow2(scale):
    """A V3.2 scale's power-of-two part: ``2^e`` with ``e`` its exponent clamped to the range in which every e4m3
    code times ``2^e`` is exact in bf16, or 0 for a zero scale (the tile's values are 0). The decoder multiplies the
    codes by it, exactly; the consumers apply the rest, :func:`scale_mantissa`, in fp32."""
    return gl.where(scale == 0.0, 0.0, (_exp_field(scale) << 23).to(gl.float32, bitcast=True))


@gluon.jit
def scale_mantissa(scale):
    """``scale / scale_pow2(scale)``, exactly (a product with a power of two): in ``[1, 2)`` for a normal scale
    whose exponent is in range (1 for any power of two), and 1 for a zero scale. So ``scale_pow2 *
    scale_mantissa`` is the float32 scale as it is."""
    inv = ((254 - _exp_field(scale)) << 23).to(gl.float32, bitcast=True)  # 2^-e, exact
    return gl.where(scale == 0.0, 1.0, scale * inv)


@gluon.jit
def stash_row(sc_smem, ROW: gl.constexpr):
    """Row ``ROW`` (``[64]`` float32) of the V3.2 stash ``sc_smem`` (``[16, 64]``): rows ``4 * slot + tile`` the
    scales the producer copies, which the decoder turns into their mantissas in place; rows ``8 + 4 * slot + tile``
    (tile 1-3) the Horner ratios of the scores (:func:`decode_half`)."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    return sc_smem._reinterpret(gl.float32, [16 * 64], flat).slice(ROW * 64, 64)


@gluon.jit
def decode_half(buf, k_rope, sc_smem, ROW: gl.constexpr, ACROSS: gl.constexpr, WITH_ROPE: gl.constexpr,
                KV_FMT: gl.constexpr):
    """Consumer side, once a half's raw bytes have landed (its ``ready`` barrier): read them all (and its
    scales) into registers, synchronise the consumer's warpgroup, then write the decoded ``[64, 256]`` tile
    (and, with ``WITH_ROPE``, the decoded RoPE of an e4m3 cache into ``k_rope``) over them, and make the
    writes visible to wgmma: this warpgroup's own, and the other consumer's once it is signalled later.

    :data:`KV_DS_EXACT`: the half's tiles are stash rows ``ROW`` and ``ROW + 1`` (:func:`stash_row`). The codes
    are multiplied by their scales' powers of two (:func:`scale_pow2`, exact); the scales are replaced by their
    mantissas (:func:`scale_mantissa`), and the ratio of the half's two mantissas goes to row ``8 + ROW + 1``, so
    the consumers read what they apply, computed once per row here rather than at every use (twice the
    instructions in the consumers' loops measured 1.8x slower, H200, twenty-first session). ``ACROSS``: the other
    half of the block is decoded already (1: this is the hi half; 2: the lo half), and the ratio across the halves,
    tile 1's mantissa over tile 2's, goes to its row too."""
    tile_l: gl.constexpr = TILE_L
    rope_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
    dtype: gl.constexpr = buf.dtype
    codes, scales, rope_codes = _raw_views(buf)
    c0 = codes.slice(0, DS_TILE, dim=1).load(tile_l)
    c1 = codes.slice(DS_TILE, DS_TILE, dim=1).load(tile_l)
    s0 = gl.full([64], 1.0, gl.float32, layout=gl.SliceLayout(1, tile_l))
    s1 = s0
    if KV_FMT == KV_DS_MLA:  # the same bytes as `scales`, one dimension: tile t of row r at 64 t + r
        flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        scale_rows = buf._reinterpret(gl.float32, [128 * 64], flat1)
        s0 = scale_rows.slice(64 * 64, 64).load(gl.SliceLayout(1, tile_l))
        s1 = scale_rows.slice(65 * 64, 64).load(gl.SliceLayout(1, tile_l))
    exact: gl.constexpr = KV_FMT == KV_DS_EXACT
    if exact:
        s0 = stash_row(sc_smem, ROW).load(gl.SliceLayout(1, tile_l))
        s1 = stash_row(sc_smem, ROW + 1).load(gl.SliceLayout(1, tile_l))
    if WITH_ROPE and KV_FMT == KV_E4M3:
        cr = rope_codes.load(rope_l)
    gl.thread_barrier()  # every raw byte (and scale) of the half is in registers before any is overwritten
    v0 = _decode(c0, s0, KV_FMT, dtype)
    v1 = _decode(c1, s1, KV_FMT, dtype)
    if exact:
        v0 = v0 * scale_pow2(s0).to(dtype)[:, None]
        v1 = v1 * scale_pow2(s1).to(dtype)[:, None]
        m0 = scale_mantissa(s0)
        m1 = scale_mantissa(s1)
        stash_row(sc_smem, ROW).store(m0)
        stash_row(sc_smem, ROW + 1).store(m1)
        stash_row(sc_smem, 8 + ROW + 1).store(m0 / m1)
        if ACROSS == 1:  # the lo half's mantissas are in: tile 1 over this half's tile 2
            stash_row(sc_smem, 8 + ROW).store(stash_row(sc_smem, ROW - 1).load(gl.SliceLayout(1, tile_l)) / m0)
        if ACROSS == 2:  # the hi half's mantissas are in: this half's tile 1 over tile 2
            stash_row(sc_smem, 8 + ROW + 2).store(m1 / stash_row(sc_smem, ROW + 2).load(gl.SliceLayout(1, tile_l)))
    buf.slice(0, DS_TILE, dim=1).store(v0)
    buf.slice(DS_TILE, DS_TILE, dim=1).store(v1)
    if WITH_ROPE and KV_FMT == KV_E4M3:
        k_rope.store(cr.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(dtype))
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of the tile is written before the warpgroup's wgmma reads it


@gluon.jit
def _fill(KV, buf, k_rope, sc_smem, ids_smem, id0, stride_kv, kv_block_size, ready, free, free_phase,
          COL0: gl.constexpr, ROW: gl.constexpr, WITH_ROPE: gl.constexpr, KV_FMT: gl.constexpr,
          ROW_BYTES: gl.constexpr):
    """One half block: wait until the consumers free it, then copy its raw bytes; ``ready`` completes when
    they land (one arrive per thread), and the consumer that reads the half first decodes it
    (:func:`decode_half`)."""
    mbarrier.wait(free, free_phase)
    _load_half(KV, buf, k_rope, sc_smem, ids_smem, id0, stride_kv, kv_block_size, ready, COL0, ROW, WITH_ROPE, KV_FMT,
               ROW_BYTES)


@gluon.jit
def _release(ready, free, free_phase):
    """Hand a consumer the half it waits on first in a pair, unfilled, once it is free (the same order of
    phases as a fill): all :data:`FIRST_HALF_ARRIVALS` at once, after the warpgroup's barrier, so they
    release the stop decision the consumer then reads before it leaves."""
    mbarrier.wait(free, free_phase)
    gl.thread_barrier()
    mbarrier.arrive(ready, count=FIRST_HALF_ARRIVALS)


@gluon.jit
def fp8_producer(Q, KV, IDX, q_lo, q_hi, q_rope, k_lo, k_hi, k_rope, ids_smem, redo_smem, sc_smem, q_ready,
                 ready_lo, ready_hi, free_lo, free_hi, pid_h, pid_t, idx_base, start, end, num_pairs,
                 num_heads, num_rows, stride_qt, stride_qh, stride_kv, kv_block_size,
                 BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HALF_V: gl.constexpr, D_ROPE: gl.constexpr,
                 KV_FMT: gl.constexpr, ROW_BYTES: gl.constexpr):
    """Worker partition (one warpgroup): q once, then each pair of blocks half by half, in the order the
    consumers free the halves (even lo, odd hi, even hi, odd lo). Each half's raw bytes are copied as soon
    as the consumers free it; the consumers decode them (:func:`decode_half`).

    V3.2 rows: the tiles are bf16, exact only for the scales :func:`_inexact` accepts. The scales of each
    pair's ids are loaded a pair ahead, with its ids (16 bytes an id, one id a thread), and checked before
    the pair's first half: the decision is published (:func:`_publish`) before any half of the pair is
    handed over. To stop, the producer hands each consumer its first half of the pair unfilled
    (:func:`_release`); the consumers read the decision there (:func:`stop_flag`) and leave, so a token
    with other scales costs the CTA about one scale load per id of its first such pair. Consumer 1 writes
    the decision to the CTA's word of ``REDO`` and the launcher recomputes the program (:data:`KV_DS_EXACT`).

    :data:`KV_DS_EXACT`: no check; each half's scales go to the stash ``sc_smem`` (rows ``4 * slot + tile``), and
    the odd slot's RoPE comes with its lo half."""
    half_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    gather_q(Q, q_lo, q_hi, q_rope, q_ready, pid_h, pid_t, num_heads, stride_qt, stride_qh,
             BLOCK_H, HALF_V, D_ROPE, BLOCK_H, half_l, rope_l)
    nrows = num_rows.to(gl.uint32)
    ids_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ds: gl.constexpr = KV_FMT == KV_DS_MLA
    exact: gl.constexpr = KV_FMT == KV_DS_EXACT
    ids_next = pair_ids(IDX, idx_base, start, end, nrows, 2 * BLOCK_N, ids_l)
    if ds:
        scales_next = _pair_scales(KV, ids_next, kv_block_size, stride_kv, ROW_BYTES)
    j = num_pairs * 0  # an int32 scalar, carried by the loop
    go = num_pairs > 0
    while go:
        phase = j & 1
        free_phase = phase ^ 1  # the first wait on a fresh 'free' barrier passes
        gl.thread_barrier()  # every thread is done reading the previous pair's ids
        ids_smem.store(ids_next)
        stop = j * 0
        if ds:
            stop = gl.max(gl.max(_inexact(scales_next), axis=1), axis=0)
            _publish(redo_smem, j, stop)
        gl.thread_barrier()
        ids_next = pair_ids(IDX, idx_base, start + 2 * (j + 1) * BLOCK_N, end, nrows, 2 * BLOCK_N, ids_l)
        if ds:
            scales_next = _pair_scales(KV, ids_next, kv_block_size, stride_kv, ROW_BYTES)
        if stop == 0:
            _fill(KV, k_lo.index(0), k_rope.index(0), sc_smem, ids_smem, 0, stride_kv, kv_block_size,
                  ready_lo.index(0), free_lo.index(0), free_phase, 0, 0, False, KV_FMT, ROW_BYTES)
            if ds:  # the decision, written before the barrier above, is released with the first halves
                mbarrier.arrive(ready_lo.index(0))
            _fill(KV, k_hi.index(1), k_rope.index(1), sc_smem, ids_smem, BLOCK_N, stride_kv, kv_block_size,
                  ready_hi.index(1), free_hi.index(1), free_phase, HALF_V, 6, not exact, KV_FMT, ROW_BYTES)
            if ds:
                mbarrier.arrive(ready_hi.index(1))
            _fill(KV, k_hi.index(0), k_rope.index(0), sc_smem, ids_smem, 0, stride_kv, kv_block_size,
                  ready_hi.index(0), free_hi.index(0), free_phase, HALF_V, 2, True, KV_FMT, ROW_BYTES)
            _fill(KV, k_lo.index(1), k_rope.index(1), sc_smem, ids_smem, BLOCK_N, stride_kv, kv_block_size,
                  ready_lo.index(1), free_lo.index(1), free_phase, 0, 4, exact, KV_FMT, ROW_BYTES)
        else:
            _release(ready_lo.index(0), free_lo.index(0), free_phase)  # consumer 0's first half
            _release(ready_hi.index(1), free_hi.index(1), free_phase)  # consumer 1's first half
        j += 1
        go = (j < num_pairs) & (stop == 0)
