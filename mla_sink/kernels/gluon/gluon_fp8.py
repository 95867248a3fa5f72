"""Warp-specialised sparse MLA decode with fp8 KV and few heads, sm90, in Gluon: a per-tensor e4m3fn cache at
H <= 32, or the 656-byte V3.2 rows (``fp8_ds_mla``, four float32 tile scales per row) at H <= 32.

Semantics of :mod:`mla_sink.paths.triton.launch` (float64 reference in :mod:`mla_sink.core.reference`).
At few heads the portable kernel is bound by converting fp8 tiles inside its MMA loop (once per operand
layout) and by mma.sync's 16-row tiles re-reading q from shared memory in every warp, and the seesaw
kernel pads the heads to its 64-row wgmma tiles. Here one CTA = one token's heads (all of them, padded to
``BLOCK_H``: 16 or 32, or a group of ``BLOCK_H`` of them where the table's head block is smaller than H) and one id
range (``SPLIT``: the range of ``pid_s``; fp32 partials and
base-2 LSEs for the combine kernel, which applies the sink, launched as a programmatic dependent):

* roles are swapped so the tensor cores see a wide M: ``S^T = K q^T`` (wgmma M = 64 ids, N = BLOCK_H
  heads, K = 576) and ``O^T += V^T P^T`` (M = 512 value columns, N = BLOCK_H, K = 64 ids); the tiles
  are read by the tensor cores straight from shared memory, q and P are the small N-side operands;
* a producer warpgroup gathers each block's 64 fp8 rows into registers (loads with the L2's 256-byte
  prefetch, the ids loaded one block ahead, masked lanes read 0), converts them to fp16 once (``cvt`` e4m3
  -> f16: exact) and stores them into a 2-stage ring of ``[64, 512]`` + ``[64, 64]`` fp16 tiles. Its lanes
  sit 4 to a row (16 bytes a lane) and 8 rows to a warp, so every 8-lane phase of a 16-byte store covers the
  8 distinct 16-byte chunks of the 128-byte swizzle (no bank conflicts); with ``lines`` (tables/gluon_fp8.yaml:
  every row today), 16 to a row with 8 bytes a lane, so each load instruction reads whole 128-byte lines and each
  8-lane phase of a store one swizzle row. Where the table's row says ``producers: 2`` (the long id ranges: V3.2's,
  e4m3's split launches and its unsplit ones at 16 and 32 heads), two producer warpgroups fill alternate ring
  stages (blocks 0, 2, .. and 1, 3, ..), each with two block periods for its gather and conversion; on V3.2's
  unsplit launches (``producer_ahead``) each keeps its next step's rows in flight while it converts and stores this
  step's (:func:`_producer_ahead`);
* two consumer warpgroups take every block and split ``O^T`` by value columns, as FlashMLA's sm90 kernels split
  it: the first stages q (:func:`_stage_q`: in shared memory, fp16 for e4m3 with each head row scaled by a power of
  two so its largest ``|q|`` is 2^14, exact for bf16 mantissas and undone on the scores; bf16 as given for V3.2),
  computes ``S^T``, the softmax and ``P^T`` and accumulates ``O^T``'s columns 0-255, the second columns 256-511 with
  the first's ``P^T``; each applies the sink and the per-tensor ``kv_scale`` to its columns and stores them (the
  first also the natural-log LSE; split: the partial output and its base-2 LSE). Holding half of ``O^T`` each, they
  leave the producers the registers of their steps (e4m3 H=32 T=64 54.6 against 60.4 us on the alternate blocks,
  sixteenth session). Until the seventy-sixth session 16-head long ranges took alternate blocks instead (each
  consumer every other block with its own softmax state and all of ``O^T``, merged through shared memory at the
  end): V3.2's lost 6% to the column split with two producers (H=16 T = 256 / 64 / 16 165.2 / 51.9 / 24.4 against
  176.4 / 54.4 / 26.0 us, H100; rows ``ds_mla_h16``, ``ds_mla_h16_split``), e4m3's unsplit ones 4-7% (135.2 / 69.4
  against 141.6 / 74.3 us at T = 256 / 128; row ``e4m3_h16``), and with no row left on them the alternate blocks left
  the kernel (git history). e4m3's unsplit 32-head launches took the alternate scores (the blocks in pairs, each
  consumer one block's scores and one half of ``O^T`` over both) from the twenty-sixth session until the
  seventy-fourth, when two producers of 32-row steps on the column split took 150.1 against 172.8 us at T=256 on an
  H100 (row ``e4m3_h32_unsplit``; also in git history);
* on CTAs of one or two blocks (T <= 6 at topk 2048 on 132 SMs; the table's ``*_short`` rows) the two halves of a
  block's ``P V`` run at once and each consumer stores its own columns, with no merge of two consumers' states
  through shared memory (H=16 T=2, thirtieth session: e4m3 9.7, V3.2 10.4 against 11.5 and
  12.9 us on the alternate blocks; bf16 10.9). V3.2's short rows (``scores_only``, ``SCORES_ONLY``) leave the first
  consumer the scores, the softmax and the four ``P_t`` only and give the second all four value tiles (64 registers
  at 16 heads), so a second block's scores do not wait for the first consumer's half of the first block's ``P V``
  (thirty-third session: V3.2 H=32 T=2 12.43-12.57 against 12.69-12.92 us, H=16 T=2 10.44-10.49 against
  10.75-11.03; e4m3 lost 0.1-0.4 us with it). Their first consumer also loads the first block's ids and the first
  two blocks' RoPE ids before it stages q (``early_ids``, ``EARLY_IDS``), so the dependent loads of the tile scales
  and the RoPE copies do not wait behind q's (thirty-fifth session: V3.2 H=32 T=2 11.43-11.55 against 12.14-12.22
  us; on long id ranges it lost, 209 against 189 at T=256);
* e4m3's long id ranges (the table's ``staged_ids`` rows, ``STAGED_IDS``): the producer stores each block's checked
  ids in shared memory (:data:`IDS_STAGES` slots, two lanes a row) and the consumers read them there once the block's
  stage is filled, instead of loading them from ``indices`` before their wait: the load's round trip and the
  unsigned check left the consumers' chain (forty-first session, same runs: H=32 T=256 167.0-167.2 against
  169.1-169.7 us, T=64 51.7-52.4 against 54.3-54.6, H=16 T=256 138.4-138.7 against 140.1-140.5; V3.2's consumers need
  the ids before the stage is filled, for the tile scales' loads, and its tile scales staged the same way by cp.async
  took 199.5 against 189.0 at H=32 T=256);
* on the column split (the table's ``warp_max``, ``WARP_MAX``, the path's default) the first consumer takes each
  block's maximum over ids as each warp's maximum over its 16 ids (shuffles) and one ``[4, heads]`` exchange through
  shared memory behind one barrier (:func:`_ids_max`), instead of the generic reduction across its four warps
  (fifty-first session, same run on an H100, outputs bitwise equal: V3.2 H=32 T=256 195.3 against 200.9-201.6 us,
  T=64 61.4 against 62.7-62.8, T=2 11.5 against 11.8-11.9; e4m3 H=32 T=64 53.2 against 54.0-54.1);
* the softmax's row sum is deferred on long id ranges (``DEFER_ROW_SUM``, the rows' ``deferred_row_sum``): each
  thread adds its own ``P^T`` elements and the sum over ids, whose rows span the consumer's four warps, runs once at
  the end instead of once a block (:func:`_zero_row_sum`; e4m3 T=256 140.5 against 146.7 us at H=16, 168.1 against
  171.2 at H=32);
* V3.2 rows (``KV_DS_MLA``): the producer stores the latent codes as bf16 (exact); q is bf16 as given. The
  first consumer (the second where the table says ``rope_by_second``) copies the bf16 RoPE of its next block by
  cp.async into that block's ring stage's RoPE tile while it computes this one (where the
  rows are 16-byte aligned; otherwise the producer gathers it: at 32 heads, gathered by the producer on aligned rows
  too, V3.2 T = 256 / 64 took 205.2 / 65.3 against 201.0 / 62.6 us on an H100, forty-ninth session), and loads its
  block's four tile scales per id (float32, in place) and applies them exactly in fp32:
  ``S^T = K_rope q_rope^T + sum_t scale_t * (K_t q_t^T)`` with one wgmma accumulator per 128-column tile, and
  ``O^T_t += V_t^T (P^T * scale_t)`` with ``P^T`` stored once per tile, rounded to bf16 (as every bf16 kernel
  rounds ``P``). Every scale convention (powers of two, ``amax / 448``) decodes
  exactly in one launch. H=16 through the library: 14.8 / 54.4 / 91.7 / 178 us at T = 2 / 64 / 128 / 256
  against 18.1 / 70.0 / 115 / 203 for the seesaw on power-of-two scales (tenth session); with the RoPE copied
  by the consumers and q staged by the first (fifteenth session, grid) 13.4 / 50.7 / 163.5 us at T = 2 / 64 /
  256 (bf16 KV 14.8 / 54.4 / 162.7).

Measured on an H200 (BENCHMARKS.md; benchmarks/fp8_pingpong_probe_r*_2026-11-30.json): one consumer was
bound by its serial chain (2.7 us per 64-id block); two take 1.35 us per block, and the producer (2.1-2.5
us per block: one 36 KB block of rows in flight per SM) is now the limit: 157-159 us at H=16, T=256,
against 176-180 with one consumer and 162-166 for bf16 KV. With each consumer's ring stage fixed at compile
time (ninth session) 154 us at T=256, and at T=64 in two splits 47.8 us (bf16 KV 50.8).

Which arrangement a launch takes - the head block (16 or 32:
the smallest that holds the call's heads), the registers of each partition, the producer's rows per step and
whole-line loads, and the q dtypes each cache is read with - is a row of ``tables/gluon_fp8.yaml``, with the
measurements behind it (:func:`mla_sink.kernels.gluon.tuning.fp8_arrangement`, looked up by :func:`fp8_launch_args`
once per launch configuration).

Source: the swapped ("transposed") decode GEMMs of FlashInfer/FlashMLA small-head decode kernels,
FlashMLA's fp8 dequantisation outside the MMA warps and FlashAttention-3's two consumer warpgroups;
Triton's Gluon tutorials for the primitives.
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
from mla_sink.kernels.gluon.seesaw_common import _opaque_zero
from mla_sink.kernels.gluon.pdl import launch_dependents
from mla_sink.kernels.gluon.seesaw_fp8 import DS_ROPE_AT, DS_SCALES_AT, DS_TILE, _row_offsets
from mla_sink.kernels.gluon.tuning import BLOCK_IDS, RING_STAGES, cta_blocks, fp8_arrangement, fp8_kv_dtypes

STAGES = gl.constexpr(RING_STAGES)  # one ring stage per consumer warpgroup (the table checker's count too)
#: Slots of the staged ids (``STAGED_IDS``): the producer writes block i's ids once it has passed the waits of blocks
#: i - 2 and i - 1, which need blocks i - 4 and i - 3 released by every consumer that reads them, after each one read
#: their ids; three slots would do, four make the slot an AND.
IDS_STAGES = gl.constexpr(4)
#: Ids per block: the wgmma M dimension of ``S^T`` (one warpgroup's 64 rows; the table checker's count too).
BLOCK_N = BLOCK_IDS
#: Warps of one consumer warpgroup: the score accumulator's ids are ``BLOCK_N // WARPS`` = 16 a warp.
WARPS = gl.constexpr(4)
#: The layout ``out`` is stored from on the column split (:func:`_store_cols`): a thread's 8
#: consecutive value columns (16 bytes of bf16 or fp16) of one head, 8 threads one head's 64 columns (a 128-byte
#: line), a warp 4 heads, the 4 warps 16.
OUT_L = gl.constexpr(gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1]))
#: The layout of a block's ``[BLOCK_N, 4]`` V3.2 tile scales as loaded (:func:`_tile_scales`): its rows sit where
#: the score accumulator's do (a lane's row ``lane // 4``, one more 8 rows on, 16 rows a warp) and its 4 columns in
#: each thread's registers, so that picking a column is an in-thread sum and its conversion to the accumulator's rows
#: moves no data.
SCALES_L = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BLOCK_N, 4]))


@gluon.jit
def _rows(KV, ids, stride_kv, kv_block_size, KV_DS_MLA: gl.constexpr, ROW_BYTES: gl.constexpr):
    """Pointers (64-bit offsets) to the rows ``ids`` of KV: ``id * stride_kv`` for an e4m3 cache, the V3.2
    page arithmetic of :func:`_row_offsets` (bytes) for ``KV_DS_MLA``. Skipped ids (-1) point at row 0."""
    if KV_DS_MLA:
        return KV + _row_offsets(ids, kv_block_size, stride_kv, ROW_BYTES)
    else:
        return KV + ids.to(gl.int64) * stride_kv


@gluon.jit
def _gather(rows, ids, col0, WIDTH: gl.constexpr, layout: gl.constexpr):
    """Columns ``[col0, col0 + WIDTH)`` of the rows at ``rows`` (pointers of ``rows``' element type); id -1
    reads 0."""
    return gl.load((rows + col0)[:, None] + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))[None, :],
                   mask=(ids >= 0)[:, None], other=0.0)


def _ld_row_chunk(words: int, hint: str, pack: int = 0) -> str:
    """The predicated load of ``words`` 32-bit words a lane (``$0 ..`` the loaded elements, then ``pack`` addresses
    and as many masks, the first of each read; ``pack``: the elements of one asm instance, ``4 * words`` bytes by
    default, ``words`` for int32 elements), with the cache qualifier ``hint``: lanes whose mask is 0 read 0."""
    pack = pack or 4 * words
    outs = ", ".join(f"${i}" for i in range(words))
    zero = "".join(f"mov.b32 ${i}, 0;\n" for i in range(words))
    return (f"{{\n.reg .pred p;\nsetp.ne.b32 p, ${words + pack}, 0;\n{zero}"
            f"@p ld.global{hint}.v{words}.b32 {{{outs}}}, [${words}];\n}}")


def _ld_row_chunk_constraints(words: int, pack: int = 0) -> str:
    """The constraints of :func:`_ld_row_chunk`'s asm (``pack``: as there, ``4 * words`` by default)."""
    pack = pack or 4 * words
    return ",".join(["=r"] * words + ["l"] * pack + ["r"] * pack)


#: The cache qualifier of the producer's row loads where the arrangement asks the L2 for the 256-byte block a miss
#: falls in (``l2_prefetch`` in tables/gluon_fp8.yaml): a row's first miss brings in the lines its next loads read.
#: FlashMLA's sparse fp8 decode asks for it too. Measured both ways (BENCHMARKS.md, twelfth and fifty-eighth
#: sessions): on the H200, twelfth session, same run, us - e4m3 H=16 T=256 160.4 against 164.2 without (``.L2::128B``
#: 161.8), V3.2 rows 192.4 against 198.9, e4m3 H=32 T=256 176.0 against 182.3; FlashMLA's full form,
#: ``ld.global.nc.L1::no_allocate.L2::256B``, took 193.6 and 244.1. On two H100s, fifty-eighth session, with today's
#: kernel: e4m3 faster without it (H=16 T=256 148.1 / 148.4 against 150.8 / 151.1, H=32 172.2 / 173.8 against
#: 174.4 / 175.2), V3.2 slower without it (H=32 T=256 187.6 / 188.5 against 185.5 / 186.1); on the H200, fifty-ninth
#: session, e4m3 ties (H=16 T=256 138.3 / 138.2 without against 138.6 / 138.3, H=32 167.3 / 166.1 against 167.7 /
#: 166.2).
L2_PREFETCH_HINT = ".L2::256B"
#: The producer's load of 16 bytes a lane (``pack=16``, one ``ld.global.v4.b32``), with and without
#: :data:`L2_PREFETCH_HINT`; ``$0-$3`` the bytes, ``$4-$19`` their addresses, ``$20-$35`` their row's mask.
_LD_ROW_CHUNK = gl.constexpr(_ld_row_chunk(4, L2_PREFETCH_HINT))
_LD_ROW_CHUNK_PLAIN = gl.constexpr(_ld_row_chunk(4, ""))
_LD_ROW_CHUNK_CONSTRAINTS = gl.constexpr(_ld_row_chunk_constraints(4))
#: The same for 8 bytes a lane (``pack=8``): ``$0-$1`` the bytes, ``$2-$9`` their addresses, ``$10-$17`` the masks.
_LD_ROW_CHUNK8 = gl.constexpr(_ld_row_chunk(2, L2_PREFETCH_HINT))
_LD_ROW_CHUNK8_PLAIN = gl.constexpr(_ld_row_chunk(2, ""))
_LD_ROW_CHUNK8_CONSTRAINTS = gl.constexpr(_ld_row_chunk_constraints(2))


@gluon.jit
def _gather_bytes(rows, ids, WIDTH: gl.constexpr, layout: gl.constexpr, LANE_BYTES: gl.constexpr,
                  L2_PREFETCH: gl.constexpr):
    """Bytes ``[0, WIDTH)`` of the rows at ``rows`` as uint8 (``layout``: ``LANE_BYTES`` consecutive bytes a lane,
    16 or 8), by :data:`_LD_ROW_CHUNK` or :data:`_LD_ROW_CHUNK8` (with :data:`L2_PREFETCH_HINT` where
    ``L2_PREFETCH``, their ``_PLAIN`` forms otherwise); id -1 reads 0."""
    cols = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    addr = (rows.to(gl.pointer_type(gl.uint8), bitcast=True)[:, None] + cols[None, :]).to(gl.int64, bitcast=True)
    ok = gl.zeros([rows.shape[0], WIDTH], gl.int32, layout=layout) + (ids >= 0).to(gl.int32)[:, None]
    if LANE_BYTES == 8:
        asm: gl.constexpr = _LD_ROW_CHUNK8 if L2_PREFETCH else _LD_ROW_CHUNK8_PLAIN
        return gl.inline_asm_elementwise(asm, _LD_ROW_CHUNK8_CONSTRAINTS, [addr, ok], dtype=gl.uint8, is_pure=True,
                                         pack=8)
    else:
        asm: gl.constexpr = _LD_ROW_CHUNK if L2_PREFETCH else _LD_ROW_CHUNK_PLAIN
        return gl.inline_asm_elementwise(asm, _LD_ROW_CHUNK_CONSTRAINTS, [addr, ok], dtype=gl.uint8, is_pure=True,
                                         pack=16)


@gluon.jit
def _to_tile(codes, dtype: gl.constexpr, KV_DS_MLA: gl.constexpr):
    """e4m3fn codes -> the ring's dtype, exactly (one ``cvt`` per pair into fp16; V3.2 codes, read as bytes,
    into bf16 through fp32: e4m3 fits both). The V3.2 tile scales stay out: the consumers apply them. Moving each
    f16's bits into bf16's places instead (``code * 2^-112``, undone by powers of two in q, the tile scales and the
    output: bitwise equal outputs) lost on an H100: V3.2 H=32 T=256 207.9 against 200.4-201.0 us, 215.1 without the
    NaN-keeping multiply, which has 759 instructions a step against 761 here but 402 ``LOP3``/``SHF`` against 20:
    the fewer integer operations, the faster, so the integer pipe is the likely limit (not profiled; fifty-first
    session, benchmarks/gluon_fp8_f16_route.patch). One ``cvt`` a pair instead (wrong values, a ceiling probe:
    benchmarks/gluon_fp8_one_cvt_probe.patch) took 164.7 against 171.2-172.3 us at H=16 T=256 and nothing off
    H=32 (187.7 against 184.0-185.3; fifty-seventh session, H100). The bf16 pair taken as the upper halves of the
    two exact float32 by one ``prmt`` (integer pipe) instead of ``cvt.rn.bf16x2.f32`` lost: 179.9 against 175.5-175.6
    us at V3.2 H=16 T=256, outputs bitwise equal (seventy-third session, H100,
    benchmarks/gluon_fp8_prmt_to_tile.patch)."""
    if KV_DS_MLA:
        return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(dtype)
    else:
        return codes.to(dtype)


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


#: The producer's load of two 32-bit words of a row (8 bytes a lane) where it keeps the next step's rows in flight
#: (``PRODUCER_AHEAD``), with :data:`L2_PREFETCH_HINT` (``_PLAIN``: without): ``$0-$1`` the words, ``$2-$3`` their
#: addresses and ``$4-$5`` their row's mask (the first of each read); masked lanes read 0. The words stay packed in
#: registers across the step (as ``uint8`` elements they would take a register each: 128 a step, which spilled
#: kilobytes, AOT sm90).
_LD_WORDS = gl.constexpr(_ld_row_chunk(2, L2_PREFETCH_HINT, pack=2))
_LD_WORDS_PLAIN = gl.constexpr(_ld_row_chunk(2, "", pack=2))
_LD_WORDS_CONSTRAINTS = gl.constexpr(_ld_row_chunk_constraints(2, pack=2))
#: One word of four e4m3fn codes -> two words of two bf16 each (codes 0, 1 and 2, 3; low half first), exactly as
#: :func:`_to_tile` converts them (e4m3 -> f16 pairs by ``cvt``, each f16 -> f32 -> a bf16 pair; NaN stays NaN).
_CVT_WORD_BF16 = gl.constexpr("{\n.reg .b16 lo, hi, a0, a1, a2, a3;\n.reg .b32 h0, h1;\n.reg .f32 f0, f1, f2, f3;\n"
                              "mov.b32 {lo, hi}, $2;\ncvt.rn.f16x2.e4m3x2 h0, lo;\ncvt.rn.f16x2.e4m3x2 h1, hi;\n"
                              "mov.b32 {a0, a1}, h0;\nmov.b32 {a2, a3}, h1;\ncvt.f32.f16 f0, a0;\ncvt.f32.f16 f1, a1;\n"
                              "cvt.f32.f16 f2, a2;\ncvt.f32.f16 f3, a3;\ncvt.rn.bf16x2.f32 $0, f1, f0;\n"
                              "cvt.rn.bf16x2.f32 $1, f3, f2;\n}")
#: ``$1 & $2 & $3`` by two ``and``s, the last two first (:func:`_zero_after`).
_AND3 = gl.constexpr("{\n.reg .b32 t;\nand.b32 t, $2, $3;\nand.b32 $0, t, $1;\n}")
#: 32-bit words of one 128-code latent tile of a V3.2 row.
TILE_WORDS = gl.constexpr(DS_TILE // 4)


@gluon.jit
def _gather_words(rows, ids, WORDS: gl.constexpr, layout: gl.constexpr, dep, L2_PREFETCH: gl.constexpr):
    """Words ``[0, WORDS)`` of the rows at ``rows`` (byte pointers, 8-byte aligned) as int32 in ``layout`` (two
    consecutive words a lane), by :data:`_LD_WORDS` (``_PLAIN`` unless ``L2_PREFETCH``); id -1 reads 0. ``dep``
    (int32 in ``layout``, 0 at run time) is added to every address: the loads are issued only once ``dep`` is known
    (:func:`_zero_after`)."""
    cols = gl.arange(0, WORDS, layout=gl.SliceLayout(0, layout))
    addr = (rows.to(gl.pointer_type(gl.int32), bitcast=True)[:, None] + cols[None, :]).to(gl.int64, bitcast=True)
    addr = addr + dep.to(gl.int64)
    ok = gl.zeros([rows.shape[0], WORDS], gl.int32, layout=layout) + (ids >= 0).to(gl.int32)[:, None]
    asm: gl.constexpr = _LD_WORDS if L2_PREFETCH else _LD_WORDS_PLAIN
    return gl.inline_asm_elementwise(asm, _LD_WORDS_CONSTRAINTS, [addr, ok], dtype=gl.int32, is_pure=True, pack=2)


@gluon.jit
def _codes_to_bf16_words(w, out_l: gl.constexpr):
    """``[rows, n]`` words of e4m3fn codes -> ``([rows, 2 n]`` words of bf16 pairs in ``out_l``, the first of each
    word's two results in ``w``'s layout``)``, by :data:`_CVT_WORD_BF16` (exact)."""
    lo, hi = gl.inline_asm_elementwise(_CVT_WORD_BF16, "=r,=r,r", [w], dtype=(gl.int32, gl.int32), is_pure=True,
                                       pack=1)
    return gl.convert_layout(gl.reshape(gl.join(lo, hi), [w.shape[0], 2 * w.shape[1]]), out_l), lo


@gluon.jit
def _zero_after(x, late, zero):
    """0 (``zero`` is 0 at run time, opaque to LLVM and ptxas) computed from ``x`` and ``late`` by :data:`_AND3`:
    an instruction that reads it waits for ``x``'s loads, and ptxas cannot place that wait before ``late`` exists."""
    return gl.inline_asm_elementwise(_AND3, "=r,r,r,r", [x, late, zero], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _gather_latent(KV, ids, stride_kv, kv_block_size, ROW_BYTES: gl.constexpr, layout: gl.constexpr, dep,
                   L2_PREFETCH: gl.constexpr):
    """The latent codes of the V3.2 rows ``ids`` as their four 128-code tiles, each ``[rows, TILE_WORDS]`` packed
    words (:func:`_gather_words`, ``dep`` added to every address)."""
    rows = _rows(KV, ids, stride_kv, kv_block_size, True, ROW_BYTES)
    return (_gather_words(rows, ids, TILE_WORDS, layout, dep, L2_PREFETCH),
            _gather_words(rows + DS_TILE, ids, TILE_WORDS, layout, dep, L2_PREFETCH),
            _gather_words(rows + 2 * DS_TILE, ids, TILE_WORDS, layout, dep, L2_PREFETCH),
            _gather_words(rows + 3 * DS_TILE, ids, TILE_WORDS, layout, dep, L2_PREFETCH))


@gluon.jit
def _store_latent(dst, c0, c1, c2, c3, out_l: gl.constexpr):
    """The four tiles of :func:`_gather_latent` as bf16 into ``dst`` (the ring's ``[rows, 512]`` bf16 seen as
    ``[rows, 256]`` words), one tile at a time (converting all four before the first store held twice the
    registers). Returns the last tile's first conversion words (the ``late`` of :func:`_zero_after`)."""
    x, late = _codes_to_bf16_words(c0, out_l)
    dst.slice(0, 2 * TILE_WORDS, dim=1).store(x)
    x, late = _codes_to_bf16_words(c1, out_l)
    dst.slice(2 * TILE_WORDS, 2 * TILE_WORDS, dim=1).store(x)
    x, late = _codes_to_bf16_words(c2, out_l)
    dst.slice(4 * TILE_WORDS, 2 * TILE_WORDS, dim=1).store(x)
    x, late = _codes_to_bf16_words(c3, out_l)
    dst.slice(6 * TILE_WORDS, 2 * TILE_WORDS, dim=1).store(x)
    return late


@gluon.jit
def _step_start(start, k, FIRST: gl.constexpr, STEP: gl.constexpr, BLOCK_N: gl.constexpr, ROWS: gl.constexpr):
    """Id position of a producer's step ``k``: row ``(k % steps) * ROWS`` of its ``k // steps``-th block (blocks
    ``FIRST, FIRST + STEP, ..``; ``steps = BLOCK_N // ROWS``)."""
    steps: gl.constexpr = BLOCK_N // ROWS
    return start + (FIRST + (k // steps) * STEP) * BLOCK_N + (k % steps) * ROWS


@gluon.jit
def _producer_ahead(IDX, KV, kn_smem, ready, empty, idx_base, stride_kv, kv_block_size, nrows, start, end, num_blocks,
                    BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, ROWS: gl.constexpr, ROW_BYTES: gl.constexpr,
                    L2_PREFETCH: gl.constexpr, FIRST: gl.constexpr, STEP: gl.constexpr):
    """:func:`_producer` on 16-byte aligned V3.2 rows with the next step's rows in flight (``PRODUCER_AHEAD``): step
    ``k + 1``'s latent codes are loaded (packed words, :func:`_gather_latent`) before step ``k``'s are converted and
    stored - at a block's first step, before the wait for its free stage - so two steps' rows are in flight where
    :func:`_producer` has one, and a block's second step is not loaded only once its first is stored. The ids are
    loaded two steps ahead. Each step's loads add a 0 computed from the step before's bytes and the last conversion
    of the step before that (:func:`_zero_after`): they are issued once those bytes have landed, so a step's
    conversion does not wait on the scoreboard of the loads issued after it (ptxas puts every row load on one).
    Seventy-second session, three calls on an H100 (outputs bitwise equal): V3.2 H=32 T=256 179.15 / 178.65 / 178.82 us
    against 179.95-182.14, T=64 (two splits) 58.3 / 58.6 against 56.9-57.9, so split launches keep :func:`_producer`
    (benchmarks/producer_ahead_*_seventysecond_2026-12-07.json). With one producer (two steps ahead, the
    thirty-second session's benchmarks/gluon_fp8_producer_ahead.patch) the same idea lost: 197.6 against 189.1 us
    at T=256 on the H200."""
    steps: gl.constexpr = BLOCK_N // ROWS
    words_l: gl.constexpr = gl.BlockedLayout([1, 2], [2, 16], [4, 1], [1, 0])  # 8 bytes a lane, 16 lanes a row
    out_l: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # 8 bf16 a lane: 16-byte stores
    # the ring's bf16 tiles as words of bf16 pairs: the same 128-byte swizzle over the same bytes
    kw = kn_smem._reinterpret(gl.int32, [STAGES, BLOCK_N, D_NOPE // 2],
                              gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    zero = (nrows >> 31).to(gl.int32)  # 0: a pool has fewer than 2^31 rows (MAX_ROWS); unknown to the compilers
    late = gl.zeros([ROWS, TILE_WORDS], gl.int32, layout=words_l)
    zeros = late + zero
    ids = _checked(_raw_ids(IDX, idx_base, end, _step_start(start, 0, FIRST, STEP, BLOCK_N, ROWS), ROWS, words_l),
                   nrows)
    raw_next = _raw_ids(IDX, idx_base, end, _step_start(start, 1, FIRST, STEP, BLOCK_N, ROWS), ROWS, words_l)
    x0, x1, x2, x3 = _gather_latent(KV, ids, stride_kv, kv_block_size, ROW_BYTES, words_l, late, L2_PREFETCH)
    ids_next = _checked(raw_next, nrows)
    raw_next = _raw_ids(IDX, idx_base, end, _step_start(start, 2, FIRST, STEP, BLOCK_N, ROWS), ROWS, words_l)
    k = 0
    for i in range(FIRST, num_blocks, STEP):
        s = i % STAGES
        for h in gl.static_range(steps):
            # the next step's rows, issued once this step's bytes and the last conversion are in
            y0, y1, y2, y3 = _gather_latent(KV, ids_next, stride_kv, kv_block_size, ROW_BYTES, words_l,
                                            _zero_after(x0, late, zeros), L2_PREFETCH)
            ids_next = _checked(raw_next, nrows)
            raw_next = _raw_ids(IDX, idx_base, end, _step_start(start, k + 3, FIRST, STEP, BLOCK_N, ROWS), ROWS,
                                words_l)
            if h == 0:
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            late = _store_latent(kw.index(s).slice(h * ROWS, ROWS), x0, x1, x2, x3, out_l)
            x0 = y0
            x1 = y1
            x2 = y2
            x3 = y3
            k += 1
        fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
        gl.thread_barrier()
        mbarrier.arrive(ready.index(s))


@gluon.jit
def _producer(IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, kv_block_size, num_rows, start, end,
              num_blocks, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr, ROWS: gl.constexpr,
              KV_DS_MLA: gl.constexpr, ROW_BYTES: gl.constexpr, ROWS_16B: gl.constexpr, LINES: gl.constexpr,
              ids_smem, STAGED_IDS: gl.constexpr, L2_PREFETCH: gl.constexpr, FIRST: gl.constexpr = 0,
              STEP: gl.constexpr = 1, PRODUCER_AHEAD: gl.constexpr = False):
    """Worker partition: fp8 rows -> registers -> fp16 (V3.2: bf16) once -> the shared-memory ring, ``ROWS``
    rows of a block at a time (``BLOCK_N``, or half of it where the producers have fewer registers: V3.2's 32-head
    blocks with two producers of 88). Blocks ``FIRST, FIRST + STEP, ..``: one producer takes every block (0, 1); two
    take one ring stage each (``FIRST`` 0 or 1, ``STEP`` 2 = ``STAGES``), so each has two block periods a block.
    V3.2 rows: the latent codes without their scales; the bf16 RoPE only where the rows are not 16-byte aligned
    (``ROWS_16B``; otherwise the consumers that compute scores copy it, :func:`_copy_rope`). The next step's ids are
    loaded before this step's rows and checked after its store, off the gather's critical path.
    Four other schedules measured no faster (H200, ninth session; benchmarks/fp8_few_heads_*_2026-12-01.json):
    rows copied by cp.async into a staging block with the next block's copy issued before this one is
    converted (151.6 us at H=16, T=256 against 152.6 for bf16 KV in the same run; 49.9 us at T=64 in two
    splits against 47.8 before), the rows of block i + 2 prefetched into L2 (``prefetch.global.L2``) after
    block i is stored (154.2 against 153.4 for bf16; 50.3 at T=64), two producer warpgroups, one per ring
    stage, at 104 registers each (162.4 against 153.9 for bf16, 84.3 at T=128 against 78.9 before; ptxas
    spills in both producers and in the first consumer: kept since the sixty-first session where they fit without
    spills and gain, tables/gluon_fp8.yaml's producers), and converting before waiting for the ring stage,
    which the compiler moves back after the wait. Twelfth session: the codes decoded by integer instructions
    instead of ``cvt`` (byte permutes, shifts and masks; branch ``wip/e4m3-int-decode``) took 172.0 against
    164.2 us (V3.2 rows 225.3 against 198.9; benchmarks/few_heads_int_decode_ab_2026-12-01.json). ncu at
    H=16, T=256 (166.8 us under the profiler): DRAM 38% busy, tensor pipe 11%, 79% of cycles with no eligible
    warp; the consumers' top stall is their wait for a filled stage and the producer's is the first use of the
    gathered bytes (long scoreboard), yet neither more bytes in flight, nor L2 hits, nor a second producer moved
    it; the L2's 256-byte prefetch on the gather's loads (:data:`_LD_ROW_CHUNK`) did, by 2-3.5%. Thirteenth
    session (BENCHMARKS.md): 16-row steps whose loads are issued one step ahead took 186.4 against 159.4 us (fewer
    rows in flight), V3.2 codes decoded into an fp16 ring with one ``cvt`` a pair 190.7 against 191.6 (the
    conversion is not the limit), a second block in flight (cp.async staging) 157.9 against 159.8, and the
    pool's size and the ids' order move the time by 4-6% only. Loads of whole 128-byte lines (8 bytes a lane, 16
    lanes a row: ``lines`` in tables/gluon_fp8.yaml) took 150.0 against 160.4: the L1's wavefronts, not DRAM, set
    the period.
    Fourteenth session: V3.2 rows on whole lines, with the consumers' scales in one load, 183.6 against 192.2; a
    probe without the V3.2 RoPE gather took 163.5, one without it and the consumers' scale work 154.9 (e4m3:
    150.5), so the bf16 RoPE's 128 bytes a row cost V3.2 about 19 us at T=256 (BENCHMARKS.md). Fifteenth
    session: with the consumers copying it instead, 164.9 against 181.6 (outputs bitwise equal;
    benchmarks/few_heads_rope_consumers_ab_2026-12-02.json); 16 bytes a lane over 256 bytes of two rows a warp
    (fewer lines touched a row than the whole lines' 128 bytes) took 161.4 against 150.0 for e4m3 and moved
    V3.2 rows by nothing (benchmarks/few_heads_half_rows_ab_2026-12-02.json). Seventeenth session: on e4m3's 32-head
    alternate blocks, rows copied by cp.async into three 16-row staging slots two steps ahead and converted from
    shared memory (bytes in flight without registers) took 199.5 against 176.1 us at T=256
    (benchmarks/few_heads_t2_splits_staged_ab_2026-12-02.json); the timeline there (benchmarks/cols_timeline.py)
    gives this producer a period of 2.34 us a block at 32 heads and 2.21 at 16. Fifty-seventh session (H100,
    BENCHMARKS.md): a V3.2 row starts ``16 * (id % 8)`` bytes into a 128-byte line, so each of its 128-byte chunks
    straddles two lines; ids that are all multiples of 8 take 174.7 against 187-188 us at H=32 T=256 with random
    ids, but loading whole lines and moving each 8-byte chunk into place by warp shuffles (64 ``SHFL`` and 64
    ``SEL`` a block) took 207.9 against 185.3-186.3 (benchmarks/gluon_fp8_aligned_lines.patch). Seventy-first
    session (H100, BENCHMARKS.md): with only these gathers sent to L2-resident rows (a timing probe,
    benchmarks/gluon_fp8_gather_l2_probe.patch) V3.2 H=32 T=256 took 160.4 / 161.9 against 180.3-181.9 us, each of a
    block's two 32-row steps about half of it: HBM's latency over the producers' bytes in flight holds about 11% of
    that shape; asking the L2 for later blocks' rows from the second consumer tied or lost (line prefetches three and
    four blocks ahead 180.1 / 188.0 against 179.6-181.0, bulk prefetches 244.7)."""
    if LINES:  # 8 codes a lane, 16 lanes a row: each load instruction reads whole 128-byte lines
        lane_bytes: gl.constexpr = 8
        nope_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        rope_l: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # 4 codes or 4 bf16 a lane
    else:
        lane_bytes: gl.constexpr = 16
        nope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # 16 codes (bytes) a lane
        if KV_DS_MLA:
            rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # 8 bf16 (16 bytes) a lane
        else:
            rope_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    ids_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # STAGED_IDS: 64 ids over 128 lanes, two a row
    nrows = num_rows.to(gl.uint32)
    if PRODUCER_AHEAD and ROWS_16B:  # the 8-byte word loads need 8-byte aligned rows; others take the steps below
        gl.static_assert(KV_DS_MLA and LINES and not STAGED_IDS and ROWS < BLOCK_N and STEP == STAGES,
                         "PRODUCER_AHEAD: V3.2 rows, whole lines, steps within a block, two producers "
                         "(tuning.check_fp8_table)")
        _producer_ahead(IDX, KV, kn_smem, ready, empty, idx_base, stride_kv, kv_block_size, nrows, start, end,
                        num_blocks, BLOCK_N, D_NOPE, ROWS, ROW_BYTES, L2_PREFETCH, FIRST, STEP)
    else:
        ids_n = _checked(_raw_ids(IDX, idx_base, end, start + FIRST * BLOCK_N, ROWS, nope_l), nrows)
        if LINES:  # the latent's rows, spread as the RoPE's are (a free conversion), as at the end of each step
            ids_r = gl.convert_layout(ids_n, gl.SliceLayout(1, rope_l))
        else:
            ids_r = _checked(_raw_ids(IDX, idx_base, end, start + FIRST * BLOCK_N, ROWS, rope_l), nrows)
        for i in range(FIRST, num_blocks, STEP):
            s = i % STAGES
            for h in gl.static_range(BLOCK_N // ROWS):
                # the next step's ids: this block's next rows, or (after its last) the next block's first
                if h + 1 == BLOCK_N // ROWS:
                    next_at = start + (i + STEP) * BLOCK_N
                else:
                    next_at = start + i * BLOCK_N + (h + 1) * ROWS
                next_n = _raw_ids(IDX, idx_base, end, next_at, ROWS, nope_l)
                if not LINES:
                    next_r = _raw_ids(IDX, idx_base, end, next_at, ROWS, rope_l)
                if ROWS_16B:  # the asm row loads (vector loads, hinted or not) need 16-byte aligned rows
                    x_n = _gather_bytes(_rows(KV, ids_n, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES), ids_n, D_NOPE,
                                        nope_l, lane_bytes, L2_PREFETCH)
                    if not KV_DS_MLA:
                        x_n = x_n.to(gl.float8e4nv, bitcast=True)
                else:
                    x_n = _gather(_rows(KV, ids_n, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES), ids_n, 0, D_NOPE,
                                  nope_l)
                if KV_DS_MLA:  # the bf16 RoPE after the scales, unless the consumers copy it (16-byte aligned rows)
                    if not ROWS_16B:
                        rows_r = (_rows(KV, ids_r, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES) + DS_ROPE_AT).to(
                            gl.pointer_type(gl.bfloat16), bitcast=True)
                        x_r = _gather(rows_r, ids_r, 0, D_ROPE, rope_l)
                else:  # the RoPE codes after the latent ones
                    x_r = _gather(_rows(KV, ids_r, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES), ids_r, D_NOPE,
                                  D_ROPE, rope_l)
                if STAGED_IDS:  # the checked ids for the consumers, who read them once the block is handed over (two
                    # lanes store a row's id: in the gather's layout all 16 lanes of a row would)
                    ids_smem.index(i % IDS_STAGES).slice(h * ROWS, ROWS).store(gl.convert_layout(ids_n, ids_l))
                if h == 0:
                    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                kn_smem.index(s).slice(h * ROWS, ROWS).store(_to_tile(x_n, kn_smem.dtype, KV_DS_MLA))
                if not (KV_DS_MLA and ROWS_16B):
                    kr_smem.index(s).slice(h * ROWS, ROWS).store(x_r.to(kr_smem.dtype))
                ids_n = _checked(next_n, nrows)
                if LINES:  # the latent's rows, spread as the RoPE's are
                    ids_r = gl.convert_layout(ids_n, gl.SliceLayout(1, rope_l))
                else:
                    ids_r = _checked(next_r, nrows)
            fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s))


@gluon.jit
def _block_ids(IDX, idx_base, start, i, end, nrows, offs_n, BLOCK_N: gl.constexpr):
    """``(ids, ok)`` of block ``i`` of the id range: ids as loaded (``-1`` past ``end``) and whether each is
    read (``0 <= id < N``: one unsigned compare)."""
    pos = start + i * BLOCK_N + offs_n
    ids = gl.load(IDX + idx_base + pos, mask=pos < end, other=-1)
    return ids, (ids.to(gl.uint32, bitcast=True) < nrows) & (pos < end)


@gluon.jit
def _staged_ids(ids_smem, i, offs_n):
    """``(ids, ok)`` of block ``i`` from the producer's copy (``STAGED_IDS``: read once the block's stage is filled).
    ``ok`` is :func:`_block_ids`'s; ``ids`` are the checked ones (-1 where :func:`_block_ids` gives the raw skipped
    id: negative, ``>= N`` or past ``end``), which the e4m3 consumers read through ``ok`` only."""
    ids = ids_smem.index(i % IDS_STAGES).load(offs_n.type.layout)
    return ids, ids >= 0


@gluon.jit
def _softmax_from_max(st, block_max, m_i, l_i, DEFER: gl.constexpr):
    """One block of the base-2 online softmax over ``S^T`` (``[ids, heads]``, skipped ids ``-inf``) given the
    block's maximum over ids (``[heads]``, as ``gl.max(st, axis=0)`` or :func:`_ids_max` gives it: both exact, so
    ``P^T`` is the same either way): ``(P^T, alpha, m, l)``; an all ``-inf`` column keeps ``m = -inf`` and
    ``l = 0``. ``l`` is a row sum of :func:`_zero_row_sum` (``DEFER``: deferred)."""
    m_new = gl.maximum(m_i, block_max)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(st - m_safe[None, :])
    return p, alpha, m_new, _add_rows(l_i, alpha, p, DEFER)


@gluon.constexpr_function
def _all_warps_layout(block_h):
    """The layout in which every thread of a consumer holds the ``[4, block_h]`` per-warp maxima of its own heads
    (:func:`_ids_max`): the heads as the wgmma accumulator spreads them (``NVMMADistributedLayout`` v3 of
    ``instr_shape [16, block_h, 16]``: a thread's heads ``2 (lane % 4) + {0, 1} + 8 k``), the four warps' rows in
    its registers, so that the maximum over them is in-thread and lands in the accumulator's heads."""
    heads = [[0, 1]] + [[0, 8 << k] for k in range(int(block_h).bit_length() - 4)]  # head bit 0, then bits 3 ..
    n_warps = int(WARPS.value)
    warps = [[1 << k, 0] for k in range(n_warps.bit_length() - 1)]  # every warp's row, in each thread
    return gl.DistributedLinearLayout(reg_bases=heads + warps, lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
                                      warp_bases=[[0, 0]] * len(warps), block_bases=[], shape=[n_warps, block_h])


@gluon.jit
def _ids_max(st, buf, acc_l: gl.constexpr):
    """The maximum over ids of ``S^T`` (``[BLOCK_N, heads]`` in the wgmma accumulator layout ``acc_l``, 16 ids a
    warp) for every head, ``[heads]`` in ``acc_l``'s head slice: each warp's maximum over its own 16 ids (shuffles
    within the warp), stored as one row of ``buf`` (``[4, heads]`` fp32 in shared memory), one barrier, and the
    four rows read back by every thread. The generic ``gl.max(st, axis=0)`` crosses the warps by its own round trip
    and barriers; this one is cheaper on the column split's first consumer, whose chain is V3.2's period at 32 heads
    (BENCHMARKS.md, forty-ninth and fifty-first sessions). ``buf`` may be rewritten once every warp has passed the
    next barrier of the caller after this read (the one behind the ``P_t`` stores)."""
    BH: gl.constexpr = st.shape[1]
    warp_max = gl.max(gl.reshape(st, [WARPS, st.shape[0] // WARPS, BH]), axis=1)  # rows of warp w: 16 w .. 16 w + 15
    buf.store(warp_max)
    gl.thread_barrier()  # every warp's row stored
    return gl.convert_layout(gl.max(buf.load(_all_warps_layout(BH)), axis=0), gl.SliceLayout(0, acc_l))


@gluon.jit
def _zero_row_sum(acc_l: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DEFER: gl.constexpr):
    """A scores-computing consumer's zero row sum ``l``: per head (``[BLOCK_H]``), or deferred (``DEFER``:
    ``[ids, heads]`` in ``acc_l``, each thread adding its own ``P^T`` elements, rescaled by ``alpha``). The sum over
    ids crosses the consumer's four warps (a shared-memory round trip and a barrier); deferred, it runs once, at
    the end (:func:`_row_sum`). Which one a launch takes is its ``tables/gluon_fp8.yaml`` row's
    ``deferred_row_sum`` (measured faster on long id ranges, slower on CTAs of one or two blocks; BENCHMARKS.md,
    thirtieth session)."""
    if DEFER:
        return gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
    else:
        return gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))


@gluon.jit
def _add_rows(l_i, alpha, p, DEFER: gl.constexpr):
    """``l * alpha + (the row sums of P^T)``: one block added to a row sum of :func:`_zero_row_sum` (``alpha`` and the
    result per head; deferred, ``P^T`` itself is added)."""
    if DEFER:
        return l_i * alpha[None, :] + p
    else:
        return l_i * alpha + gl.sum(p, axis=0)


@gluon.jit
def _row_sum(l_i, DEFER: gl.constexpr):
    """The per-head sum ``l`` of a row sum of :func:`_zero_row_sum`: deferred, its one reduction over ids."""
    if DEFER:
        return gl.sum(l_i, axis=0)
    else:
        return l_i


@gluon.jit
def _tile_scores(kn, qn, s_zero, t: gl.constexpr):
    """Issue ``K_t q_t^T`` (async wgmma, fresh fp32 accumulator): the scores of latent tile ``t`` (columns
    ``128 t .. 128 t + 127``) before its scale."""
    return warpgroup_mma(kn.slice(t * DS_TILE, DS_TILE, dim=1), qn.slice(t * DS_TILE, DS_TILE, dim=1).permute((1, 0)),
                         s_zero, use_acc=False, is_async=True)


@gluon.jit
def _ds_score_wgmmas(kn, kr, qn, qr, s_zero):
    """Issue a block of V3.2 rows' five score wgmmas (async, fresh fp32 accumulators): ``(K_rope q_rope^T, K_0 q_0^T,
    .., K_3 q_3^T)``, to be waited for by :func:`_ds_scores_of`."""
    sr = warpgroup_mma(kr, qr.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return (sr, _tile_scores(kn, qn, s_zero, 0), _tile_scores(kn, qn, s_zero, 1), _tile_scores(kn, qn, s_zero, 2),
            _tile_scores(kn, qn, s_zero, 3))


@gluon.jit
def _ds_scores_of(sr, s0, s1, s2, s3, sc0, sc1, sc2, sc3):
    """Wait for :func:`_ds_score_wgmmas`' five accumulators and combine them with the ids' tile scales ``sc_t`` (in
    the accumulator's rows): ``K_rope q_rope^T + sum_t scale_t * (K_t q_t^T)``."""
    sr, s0, s1, s2, s3 = warpgroup_mma_wait(num_outstanding=0, deps=(sr, s0, s1, s2, s3))
    return sr + s0 * sc0[:, None] + s1 * sc1[:, None] + s2 * sc2[:, None] + s3 * sc3[:, None]


@gluon.jit
def _ds_scores(kn, kr, qn, qr, s_zero, sc0, sc1, sc2, sc3):
    """``S^T`` of a block of V3.2 rows (``[ids, heads]`` fp32, before the per-head score scale):
    ``K_rope q_rope^T + sum_t scale_t * (K_t q_t^T)``, one wgmma accumulator per tile, ``sc_t`` the ids' tile
    scales (in the accumulator's rows)."""
    sr, s0, s1, s2, s3 = _ds_score_wgmmas(kn, kr, qn, qr, s_zero)
    return _ds_scores_of(sr, s0, s1, s2, s3, sc0, sc1, sc2, sc3)


@gluon.jit
def _store_p_tiles(p_smem, base, p, sc0, sc1, sc2, sc3):
    """``P_t^T = P^T * scale_t`` (rounded once to ``p_smem``'s dtype) into ``p_smem[base + t]``, t = 0..3."""
    p_smem.index(base + 0).store((p * sc0[:, None]).to(p_smem.dtype))
    p_smem.index(base + 1).store((p * sc1[:, None]).to(p_smem.dtype))
    p_smem.index(base + 2).store((p * sc2[:, None]).to(p_smem.dtype))
    p_smem.index(base + 3).store((p * sc3[:, None]).to(p_smem.dtype))


@gluon.jit
def _softmax_state(acc_l: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DEFER: gl.constexpr):
    """A scores-computing consumer's state before its first block: ``(m, l, s_zero)`` - the base-2 running max
    (``-inf``) per head, the zero row sum (:func:`_zero_row_sum`; ``DEFER``: deferred), and the zero ``[ids, heads]``
    accumulator every block's scores start from (in ``acc_l``'s rows and columns)."""
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
    return m_i, _zero_row_sum(acc_l, BLOCK_H, BLOCK_N, DEFER), gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)


@gluon.jit
def _tile_pair_pv_issued(kn, T0: gl.constexpr, p_ring, base, acc, acc_b, alpha):
    """Issue a column-split consumer's ``P V`` of one block of V3.2 rows (async, not waited for): tiles ``T0`` and
    ``T0 + 1`` (``acc``, ``acc_b``) with their ``P_t^T`` at ``p_ring[base + t]``. Both accumulators are rescaled
    before either wgmma is issued: rescaling the second while the first runs made ptxas serialise them (C7517)."""
    acc = acc * alpha[None, :]
    acc_b = acc_b * alpha[None, :]
    acc = warpgroup_mma(kn.slice(T0 * DS_TILE, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base + T0), acc,
                        is_async=True)
    acc_b = warpgroup_mma(kn.slice((T0 + 1) * DS_TILE, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base + T0 + 1),
                          acc_b, is_async=True)
    return acc, acc_b


@gluon.jit
def _tile_pair_pv(kn, T0: gl.constexpr, p_ring, base, acc, acc_b, alpha):
    """:func:`_tile_pair_pv_issued`, waited for."""
    acc, acc_b = _tile_pair_pv_issued(kn, T0, p_ring, base, acc, acc_b, alpha)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_b))


@gluon.jit
def _tile_quad_pv(kn, p_ring, base, acc0, acc1, acc2, acc3, alpha):
    """One block's ``P V`` of V3.2 rows into all four 128-column tiles of ``O^T`` (the column split's second consumer
    when the first computes the scores only), with their ``P_t^T`` at ``p_ring[base + t]``, waited for. Every tile is
    rescaled before any wgmma is issued (rescaling between them made ptxas serialise the wgmmas, C7517, as in
    :func:`_tile_pair_pv`)."""
    acc0 = acc0 * alpha[None, :]
    acc1 = acc1 * alpha[None, :]
    acc2 = acc2 * alpha[None, :]
    acc3 = acc3 * alpha[None, :]
    acc0 = warpgroup_mma(kn.slice(0, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base), acc0, is_async=True)
    acc1 = warpgroup_mma(kn.slice(DS_TILE, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base + 1), acc1,
                         is_async=True)
    acc2 = warpgroup_mma(kn.slice(2 * DS_TILE, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base + 2), acc2,
                         is_async=True)
    acc3 = warpgroup_mma(kn.slice(3 * DS_TILE, DS_TILE, dim=1).permute((1, 0)), p_ring.index(base + 3), acc3,
                         is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2, acc3))


@gluon.jit
def _tile_scales(KV, ids, ok, stride_kv, kv_block_size, acc_l: gl.constexpr, ROW_BYTES: gl.constexpr):
    """The four float32 tile scales of a block's ids (``ids``, ``ok`` in the rows of ``acc_l``), each
    ``[BLOCK_N]`` in those rows (skipped ids 0; their codes read 0 too). One 16-byte load a row, in
    :data:`SCALES_L`: four 4-byte loads a row took 4 L1 wavefronts where this takes one (the L1's load pipe is the
    producer's limit: BENCHMARKS.md, thirteenth and fourteenth sessions)."""
    ok = gl.convert_layout(ok, gl.SliceLayout(1, SCALES_L))
    ids = gl.where(ok, gl.convert_layout(ids, gl.SliceLayout(1, SCALES_L)), -1)
    rows = (_rows(KV, ids, stride_kv, kv_block_size, True, ROW_BYTES) + DS_SCALES_AT).to(gl.pointer_type(gl.float32),
                                                                                           bitcast=True)
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, SCALES_L))
    sc = gl.load(rows[:, None] + t[None, :], mask=ok[:, None], other=0.0)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    return (_column(sc, t, 0, row_l), _column(sc, t, 1, row_l), _column(sc, t, 2, row_l), _column(sc, t, 3, row_l))


@gluon.jit
def _column(x, cols, c: gl.constexpr, row_l: gl.constexpr):
    """Column ``c`` of ``x`` (``[rows, n]``, every column in each thread's registers: an in-thread sum), in the
    row layout ``row_l``."""
    return gl.convert_layout(gl.sum(gl.where(cols[None, :] == c, x, 0.0), axis=1), row_l)


@gluon.jit
def _copy_rope(KV, kr, ids, stride_kv, kv_block_size, ROW_BYTES: gl.constexpr, layout: gl.constexpr):
    """cp.async of the bf16 RoPE of the rows ``ids`` (``layout``'s rows; -1 fills 0) into ``kr`` (``[64, 64]``
    bf16), committed as one group. 16-byte copies need 16-byte aligned rows: the RoPE of a pool 4 bytes off a
    boundary is only 2-byte aligned, and cp.async copies 4 bytes at least (the caller's ``COPY_ROPE``)."""
    rows = (_rows(KV, ids, stride_kv, kv_block_size, True, ROW_BYTES) + DS_ROPE_AT).to(gl.pointer_type(gl.bfloat16),
                                                                                        bitcast=True)
    cols = gl.arange(0, kr.shape[1], layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(kr, rows[:, None] + cols[None, :], mask=(ids >= 0)[:, None])
    async_copy.commit_group()


@gluon.jit
def _publish_meta(ids_smem, sc_ring, slot, bar, ok, sc0, sc1, sc2, sc3):
    """A block's mask and tile scales (``ok``, ``sc0 .. sc3``: each ``[BLOCK_N]``) into slot ``slot`` of the second
    consumer's shared-memory copy (``ids_smem`` ``[BLOCK_N]`` int32; ``sc_ring`` ``[slots * 4, BLOCK_N]`` fp32, the
    slot's rows ``4 slot ..``), then one arrival on ``bar`` once every thread of the warpgroup has stored
    (``META_BY_SECOND``)."""
    ids_smem.store(ok.to(gl.int32))
    sc_ring.index(4 * slot).store(sc0)
    sc_ring.index(4 * slot + 1).store(sc1)
    sc_ring.index(4 * slot + 2).store(sc2)
    sc_ring.index(4 * slot + 3).store(sc3)
    gl.thread_barrier()  # every thread's stores, before the one arrival
    mbarrier.arrive(bar)


@gluon.jit
def _read_meta(ids_smem, sc_ring, slot, bar, phase, offs_n):
    """``(ok, sc0, .., sc3)`` of a block, in ``offs_n``'s layout, from the slot :func:`_publish_meta` filled, once
    ``bar`` has completed ``phase``."""
    row_l: gl.constexpr = offs_n.type.layout
    mbarrier.wait(bar, phase)
    ok = ids_smem.load(row_l) != 0
    return (ok, sc_ring.index(4 * slot).load(row_l), sc_ring.index(4 * slot + 1).load(row_l),
            sc_ring.index(4 * slot + 2).load(row_l), sc_ring.index(4 * slot + 3).load(row_l))


@gluon.jit
def _copy_rope_signalled(KV, kr, bar, raw_ids, nrows, stride_kv, kv_block_size, ROW_BYTES: gl.constexpr,
                         layout: gl.constexpr):
    """cp.async of the RoPE of the rows ``raw_ids`` (:func:`_raw_ids`, checked here) into ``kr`` (:func:`_copy_rope`),
    then one ``cp.async.mbarrier.arrive.noinc`` on ``bar`` per thread, which lands once this thread's copies have
    (``bar`` counts a warpgroup's threads)."""
    _copy_rope(KV, kr, _checked(raw_ids, nrows), stride_kv, kv_block_size, ROW_BYTES, layout)
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _final_lse2(m, l):
    """``(empty_row, l_safe, lse2)`` per head from a consumer's final base-2 running max ``m`` and sum ``l``: rows
    with no valid id (``l == 0``), ``l`` with those set to 1, and the sink-free base-2 LSE (``-inf`` on them)."""
    empty_row = l == 0.0
    l_safe = gl.where(empty_row, 1.0, l)
    return empty_row, l_safe, gl.where(empty_row, float("-inf"), m + gl.log2(l_safe))


@gluon.jit
def _load_sinks(SINKS, offs_h, hmask, HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr):
    """The sinks of heads ``offs_h`` (``-inf`` where ``hmask`` is off) for :func:`_out_scale`, where an unsplit
    launch applies them (a split launch's combine applies the sink once); else zeros, never read."""
    if HAS_SINKS and not SPLIT:
        return gl.load(SINKS + offs_h, mask=hmask, other=float("-inf"))
    else:
        return (offs_h * 0).to(gl.float32)


@gluon.jit
def _out_scale(l_safe, lse2, empty_row, KV_SCALE, sink, HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr,
               KV_DS_MLA: gl.constexpr):
    """The per-head factor of the output: ``1 / l``, times the per-tensor ``kv_scale`` for e4m3 (V3.2's tile scales
    were applied per block), times the sink's weight in unsplit launches (``sink`` from :func:`_load_sinks`; a split
    launch's combine applies the sink once); 0 on empty rows with a sink."""
    if KV_DS_MLA:
        scale = 1.0 / l_safe
    else:
        scale = gl.load(KV_SCALE) / l_safe
    if HAS_SINKS and not SPLIT:
        scale = sink_scale(scale, sink, lse2, empty_row)
    return scale


@gluon.jit
def _finite_abs(x):
    """``|x|`` where finite, 0 at ``inf`` and NaN (``kmath.finite_abs``, for :func:`_stage_q`'s row scale)."""
    a = gl.abs(x)
    return gl.where(a < float("inf"), a, 0.0)


@gluon.jit
def _stage_q(Q, KV_SCALE, q_n, q_r, scale_smem, sm_scale, pid_t, stride_qt, stride_qh, num_heads,
             BLOCK_H: gl.constexpr, KV_DS_MLA: gl.constexpr):
    """q of token ``pid_t`` into shared memory, while the producer already gathers the first block. The first
    consumer stages it. On the alternate blocks (until the seventy-sixth session) the second consumer staged it,
    which waits for the ring's second block anyway: at 32 heads
    (e4m3) 170.0 and 170.7 against 171.6 and 172.3 us at T=256 staged before the partitions start, two runs,
    eighteenth session, benchmarks/few_heads_q_by_consumer_ab_2026-12-02.json and
    benchmarks/few_heads_widen_ab_2026-12-02.json (the first consumer took 177.7 there, and 195.4 against 175.3
    with the fifteenth session's registers; half of the head rows in each consumer 197.2 against 175.8,
    seventeenth session); at 16 heads, where the first consumer staged it since the fifteenth session (H=16 T=256
    e4m3 148.3 against 149.8 us staged before the partitions), 144.6 against 147.8 us for e4m3 at T=256 and
    165.4 / 50.9 against 167.5 / 52.1 for V3.2 (paged) at T = 256 / 64 (nineteenth session,
    benchmarks/few_heads_paged_ab_nineteenth_2026-12-02.json). Then ``fence_async_shared`` and a barrier of the
    calling warps after it: fp16 for an e4m3 cache, each head row scaled so that its largest |q| is 2^14, and the
    per-head factor that undoes it (with sm_scale, kv_scale and log2(e)) into ``scale_smem``; bf16 as it is for
    V3.2 rows."""
    D_NOPE: gl.constexpr = q_n.shape[2]
    D_ROPE: gl.constexpr = q_r.shape[2]
    dt: gl.constexpr = q_n.dtype
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    offs_hq = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_l))
    q_rows = Q + pid_t * stride_qt + offs_hq.to(gl.int64)[:, None] * stride_qh
    hmask = (offs_hq < num_heads)[:, None]
    qn = gl.load(q_rows + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask, other=0.0)
    qr = gl.load(q_rows + D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, ld_l))[None, :], mask=hmask,
                 other=0.0)
    if KV_DS_MLA:  # bf16 q as it is
        q_n.index(0).store(qn.to(dt))
        q_r.index(0).store(qr.to(dt))
        scale_smem.store(gl.full([BLOCK_H], sm_scale * LOG2E, gl.float32, gl.SliceLayout(1, ld_l)))
    else:
        qn = qn.to(gl.float32)
        qr = qr.to(gl.float32)
        # the largest finite |q| of each head row (an inf or NaN stays itself: an infinite max would make the
        # scale 0 and inf * 0 NaN)
        qmax = gl.maximum(gl.max(_finite_abs(qn), axis=1), gl.max(_finite_abs(qr), axis=1))
        row_exp = gl.ceil(gl.log2(gl.maximum(qmax, 1e-30)))
        q_n.index(0).store((qn * gl.exp2(14.0 - row_exp)[:, None]).to(dt))
        q_r.index(0).store((qr * gl.exp2(14.0 - row_exp)[:, None]).to(dt))
        scale_smem.store(gl.exp2(row_exp - 14.0) * (sm_scale * gl.load(KV_SCALE) * LOG2E))
    fence_async_shared()  # generic-proxy stores -> the consumers' wgmma (async proxy)
    gl.thread_barrier()


@gluon.jit
def _half_state(acc_l: gl.constexpr, NCOLS: gl.constexpr, BLOCK_H: gl.constexpr, KV_DS_MLA: gl.constexpr):
    """``(acc, acc_b)``: a consumer's zero half of ``O^T`` (``NCOLS`` value columns) on the column split - V3.2
    rows: its two 128-column tiles (one per tile scale); e4m3: one ``[NCOLS, heads]`` accumulator and an unread
    ``acc_b`` (:func:`_half_pv` passes it through)."""
    if KV_DS_MLA:
        acc = gl.zeros([DS_TILE, BLOCK_H], gl.float32, layout=acc_l)
        acc_b = gl.zeros([DS_TILE, BLOCK_H], gl.float32, layout=acc_l)
    else:
        acc = gl.zeros([NCOLS, BLOCK_H], gl.float32, layout=acc_l)
        acc_b = gl.zeros([1], gl.float32, layout=gl.SliceLayout(1, acc_l))
    return acc, acc_b


@gluon.jit
def _half_pv(kn, p_ring, base, acc, acc_b, alpha, COL0: gl.constexpr, KV_DS_MLA: gl.constexpr):
    """One consumer's half of a block's ``P V`` (value columns ``COL0 .. COL0 + 255`` of ``O^T``), rescaled by
    ``alpha`` first, with the block's ``P^T`` at ``p_ring[base]`` (V3.2: its two tiles' ``P_t^T`` at ``base + t``,
    into ``acc`` and ``acc_b``; e4m3: one ``[256, heads]`` accumulator ``acc``, ``acc_b`` passed through), waited
    for."""
    if KV_DS_MLA:
        acc, acc_b = _tile_pair_pv(kn, COL0 // DS_TILE, p_ring, base, acc, acc_b, alpha)
    else:
        acc = warpgroup_mma(kn.slice(COL0, acc.shape[0], dim=1).permute((1, 0)), p_ring.index(base),
                            acc * alpha[None, :], is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, acc_b


@gluon.jit
def _e4m3_scores(kn, kr, qn, qr, s_zero):
    """``S^T = K q^T`` of a block of an e4m3 cache (``[ids, heads]`` fp32, before the per-head score scale): the
    latent and RoPE wgmmas into one accumulator, waited for."""
    st = warpgroup_mma(kn, qn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    st = warpgroup_mma(kr, qr.permute((1, 0)), st, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(st,))


@gluon.jit
def _store_half(acc, acc_b, PART_OUT, OUT, pid_t, pid_s, offs_h, stride_pt, stride_ps, stride_ph, stride_ot,
                stride_oh, scale, hmask, COL0: gl.constexpr, SPLIT: gl.constexpr, KV_DS_MLA: gl.constexpr):
    """A consumer's half of ``O^T`` (:func:`_half_state`: value columns ``COL0 ..``) times the per-head ``scale``
    into the fp32 partials (``SPLIT``) or ``out`` (:func:`_store_cols`)."""
    if SPLIT:
        o_row = PART_OUT + pid_t * stride_pt + pid_s * stride_ps + offs_h.to(gl.int64) * stride_ph
    else:
        o_row = OUT + pid_t * stride_ot + offs_h.to(gl.int64) * stride_oh
    _store_cols(acc, o_row, COL0, scale, hmask, SPLIT)
    if KV_DS_MLA:
        _store_cols(acc_b, o_row, COL0 + DS_TILE, scale, hmask, SPLIT)


@gluon.jit
def _consumer_cols(Q, IDX, KV, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p_ring, alpha_smem, kn_smem,
                   kr_smem, ready, empty, p_ready, scale_smem, f_smem, f_ready, sm_scale, stride_qt, stride_qh,
                   pid_t, pid_s, idx_base, stride_kv, kv_block_size, num_heads, num_rows, start, end, num_blocks,
                   stride_ot, stride_oh, stride_lt, stride_lh, stride_pt, stride_ps, stride_ph, stride_plt,
                   stride_pls, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr,
                   HAS_SINKS: gl.constexpr, SPLIT: gl.constexpr, ROLE: gl.constexpr, KV_DS_MLA: gl.constexpr,
                   ROW_BYTES: gl.constexpr, COPY_ROPE: gl.constexpr, DEFER: gl.constexpr, SCORES_ONLY: gl.constexpr,
                   EARLY_IDS: gl.constexpr, ids_smem, STAGED_IDS: gl.constexpr, wmax_smem, WARP_MAX: gl.constexpr,
                   rope_ready, ROPE_BY_SECOND: gl.constexpr, meta_ids, meta_sc, meta_ready,
                   META_BY_SECOND: gl.constexpr, PV_OVERLAP: gl.constexpr = False):
    """One of two consumers that split ``O^T`` by value columns: both take every block. ROLE 0
    stages q, computes ``S^T``, the online softmax and ``P^T`` (into the block's stage of ``p_ring``, with the
    rescale ``alpha`` into ``alpha_smem``), signals ``p_ready`` and accumulates value columns ``0 .. 255``; ROLE 1
    waits for ``P^T`` and accumulates columns ``256 .. 511``. Each holds a ``[256, BLOCK_H]`` fp32 half, so the
    producer gets the registers of whole-block, whole-line steps. A stage is freed when both have read it
    (``empty`` counts two); ROLE 0 rewrites a stage's ``P^T`` and ``alpha`` only after that stage's next ``ready``,
    which needs ROLE 1's release of it. ROLE 0 runs the epilogue's statistics and hands the per-head output factor
    to ROLE 1 through ``f_smem``; each stores its own columns from the accumulator layout. ROLE 0 computing the
    scores only (ROLE 1 all 512 columns at 176 registers) measured slower: 182.6 / 55.0 us against 179.1 / 54.6 at
    H=32 T = 256 / 64 (benchmarks/few_heads_col_split_ab_2026-12-02.json); ROLE 0 software-pipelined (block i's
    scores issued before block i - 1's ``P V``) took 53.9 against 55.1 us for e4m3 at T=64 and 212.6 against 193.4
    for V3.2 at T=256 (benchmarks/few_heads_cols_pipelined_ab_2026-12-02.json). V3.2 rows (``KV_DS_MLA``): ROLE 0
    applies
    the tile scales to the scores (:func:`_ds_scores`) and stores the four ``P_t^T`` (:func:`_store_p_tiles`);
    each consumer accumulates two 128-column tiles; with ``COPY_ROPE`` ROLE 0, the only reader of the RoPE tiles,
    copies the RoPE of the block two ahead into this block's stage by cp.async once this block's scores are read,
    so a copy has a whole block to land (twenty-sixth session, same run: 190.6 / 57.4 us at T = 256 / 64 against
    192.2 / 58.1 with the next block's copied, outputs bitwise equal; the tile scales loaded by ROLE 1 a block
    ahead into shared memory instead took 213.4 / 63.7: benchmarks/ds_h32_ab_twentysixth_2026-12-03.json). Source:
    the roles
    of FlashMLA's sm90 sparse fp8 decode (one warpgroup the scores, the softmax and half of ``P V``, one the other
    half). ``SCORES_ONLY`` (V3.2's CTAs of one or two blocks at 16 heads, ``tables/gluon_fp8.yaml``): ROLE 0 computes
    no ``P V`` and stores no columns; ROLE 1 accumulates and stores all four value tiles, each rescaled before any of
    their wgmmas is issued (rescaling between them made ptxas serialise the wgmmas, C7517). ``EARLY_IDS`` (V3.2's
    CTAs of one or two blocks, ``early_ids``): ROLE 0 loads the first block's ids and the first two blocks' RoPE ids
    before it stages q and issues those copies once q is stored, and loads each later block's ids a block ahead
    (thirty-fifth session, benchmarks/ds_first_ids_ab_thirtyfifth_2026-12-04.json: H=32 T=2 11.43-11.55 against
    12.14-12.22 us; T=256 208.8 against 189.0, so long ranges keep the loads at each block's turn). On long V3.2
    ranges a block's ids and then their tile scales (two dependent global loads) are waited for at the start of that
    block, before its score wgmmas are issued (AOT sm90 SASS: the first instruction after the stage's wait reads a
    scale); a two-deep pipeline in which no load is read in the block that issues it (ids two blocks ahead, scales
    one ahead) moved that wait after the ``P_t`` stores and took 205.5-206.6 against 200.1-201.9 us at H=32 T=256 on
    an H100 (forty-ninth session, benchmarks/prefetch_scales_ab_fortyninth_2026-12-05.json; patch
    benchmarks/gluon_fp8_prefetch_scales.patch): those round trips are not on the period. ``WARP_MAX``: ROLE 0 takes
    each block's maximum over ids by :func:`_ids_max` (through ``wmax_smem``, ``[4, BLOCK_H]`` fp32), not by
    the generic reduction. ``ROPE_BY_SECOND`` (with ``COPY_ROPE``): ROLE 1 copies every block's RoPE instead - the
    first two before its first wait, block ``i + 2``'s into block ``i``'s stage once it has released that stage - and
    signals each copy's landing on ``rope_ready`` by ``cp.async.mbarrier.arrive.noinc`` (one arrival a thread), so
    ROLE 0's chain waits on that barrier instead of issuing copies, waiting for them and a barrier.
    ``META_BY_SECOND`` (V3.2 rows, long ranges): ROLE 1 loads each block's ids and tile scales - the first two
    blocks' before its first wait, block ``i + 2``'s once it has released block ``i`` - and publishes the mask and
    scales in a two-slot shared-memory ring (:func:`_publish_meta`, ``meta_ready``); ROLE 0 reads block ``i + 1``'s
    during block ``i``, after its ``P_t`` stores (:func:`_read_meta`), so no global load is left in its loop. Both
    on (the table row ``ds_mla_h32``): V3.2 H=32 T=256 190.3 against 195.2-196.4 us, ``ROPE_BY_SECOND`` alone 193.0
    (fifty-second session, same run on an H100, outputs bitwise equal,
    benchmarks/second_consumer_ab_fiftysecond_2026-12-05.json). ROLE 1's ids loaded four blocks ahead and its scales
    one iteration before it publishes them (no load waited for in the iteration that issues it) took 190.6 against
    185.1-185.5 us on an H100 (fifty-seventh session, benchmarks/gluon_fp8_meta_pipeline.patch). ``PV_OVERLAP`` (with
    both, V3.2 rows, not ``SCORES_ONLY``; the row ``ds_mla_h32``'s ``pv_overlap``): ROLE 0 issues its half of block
    ``i``'s ``P V`` and leaves it in flight; block ``i + 1``'s five score wgmmas are issued before ROLE 0 waits for it,
    and block ``i``'s stage is released after that wait. Alone it lost (sixty-sixth session, H100: 181.7-182.7 against
    180.0 us at V3.2 H=32 T=256, benchmarks/gluon_fp8_pv_overlap.patch); with the producers' next step in flight
    (``PRODUCER_AHEAD``, which refills a stage sooner) it took 174.54 against 179.30 / 178.84 (seventy-second session,
    H100, outputs bitwise equal, benchmarks/pv_overlap_ahead_ab_h100_seventysecond_2026-12-07.json)."""
    META2: gl.constexpr = KV_DS_MLA and META_BY_SECOND  # the ids and tile scales loaded by ROLE 1
    COPY2: gl.constexpr = COPY_ROPE and ROPE_BY_SECOND  # the RoPE copied by ROLE 1
    # PV_OVERLAP: ROLE 0 issues block i's score wgmmas before it waits for its half of block i - 1's P V
    PIPE: gl.constexpr = PV_OVERLAP and KV_DS_MLA and META2 and COPY2 and not SCORES_ONLY
    rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16 bytes a copy, 8 a row
    NCOLS: gl.constexpr = D_NOPE if SCORES_ONLY else D_NOPE // 2  # this consumer's value columns of O^T
    COL0: gl.constexpr = 0 if SCORES_ONLY else ROLE * NCOLS
    P_TILES: gl.constexpr = p_ring.shape[0] // STAGES
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_H, 16])
    head_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    acc, acc_b = _half_state(acc_l, NCOLS, BLOCK_H, KV_DS_MLA)
    if SCORES_ONLY and KV_DS_MLA and ROLE == 1:  # the second consumer holds all four tiles
        acc_c, acc_d = _half_state(acc_l, NCOLS, BLOCK_H, KV_DS_MLA)
    offs_h = gl.arange(0, BLOCK_H, layout=head_l)
    hmask = offs_h < num_heads
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))  # a block's ids, in the accumulator's rows
    nrows = num_rows.to(gl.uint32)
    if ROLE == 0:
        if KV_DS_MLA and EARLY_IDS:  # the ids the first block's scales and the first two blocks' RoPE copies need,
            # loaded while q is staged: issued after it, those dependent loads each waited a round trip behind q's
            ids, ok = _block_ids(IDX, idx_base, start, 0, end, nrows, offs_n, BLOCK_N)
            if COPY_ROPE and not COPY2:
                gl.static_assert(STAGES == 2, "the first two blocks' RoPE ids, one per ring stage")
                rope_ids0 = _raw_ids(IDX, idx_base, end, start, BLOCK_N, rope_l)
                rope_ids1 = _raw_ids(IDX, idx_base, end, start + BLOCK_N, BLOCK_N, rope_l)
        # the sinks now, read in the epilogue: loaded there, under a full memory system, they took 0.7 us after the
        # last block (fifty-fifth session, timeline on an H100)
        sink = _load_sinks(SINKS, offs_h, hmask, HAS_SINKS, SPLIT)
        _stage_q(Q, KV_SCALE, q_n, q_r, scale_smem, sm_scale, pid_t, stride_qt, stride_qh, num_heads, BLOCK_H,
                 KV_DS_MLA)
        col_scale = scale_smem.load(head_l)  # per head: q scaling, sm_scale, kv_scale, log2(e)
        m_i, l_i, s_zero = _softmax_state(acc_l, BLOCK_H, BLOCK_N, DEFER)
        if COPY_ROPE and not COPY2:  # the first two blocks' RoPE; each later block's is copied two blocks ahead
            for b in gl.static_range(STAGES):
                if b < num_blocks:
                    if EARLY_IDS:
                        rope_ids = rope_ids0 if b == 0 else rope_ids1
                    else:
                        rope_ids = _raw_ids(IDX, idx_base, end, start + b * BLOCK_N, BLOCK_N, rope_l)
                    _copy_rope(KV, kr_smem.index(b), _checked(rope_ids, nrows), stride_kv, kv_block_size, ROW_BYTES,
                               rope_l)
        if META2:  # the first block's mask and scales, from ROLE 1 (each later block's read a block ahead)
            gl.static_assert(not EARLY_IDS, "META_BY_SECOND loads every block's ids in ROLE 1")
            # an empty range (topk_length 0, or a split past it) has none: ROLE 1 publishes no block then, and a
            # wait for one would never end
            ok = offs_n < 0
            sc0 = gl.zeros([BLOCK_N], gl.float32, layout=gl.SliceLayout(1, acc_l))
            sc1, sc2, sc3 = sc0, sc0, sc0
            if num_blocks > 0:
                ok, sc0, sc1, sc2, sc3 = _read_meta(meta_ids.index(0), meta_sc, 0, meta_ready.index(0), 0, offs_n)
        if PIPE:  # the P V accumulators are carried through the loop in flight
            acc = warpgroup_mma_init(acc)
            acc_b = warpgroup_mma_init(acc_b)
        for i in range(num_blocks):
            s = i % STAGES
            phase = (i // STAGES) & 1
            if not ((KV_DS_MLA and EARLY_IDS) or STAGED_IDS or META2):  # (EARLY_IDS: loaded a block ahead)
                ids, ok = _block_ids(IDX, idx_base, start, i, end, nrows, offs_n, BLOCK_N)
            if KV_DS_MLA:
                if COPY_ROPE and not COPY2:
                    ids_next = _raw_ids(IDX, idx_base, end, start + (i + STAGES) * BLOCK_N, BLOCK_N, rope_l)
                if not META2:
                    sc0, sc1, sc2, sc3 = _tile_scales(KV, ids, ok, stride_kv, kv_block_size, acc_l, ROW_BYTES)
            mbarrier.wait(ready.index(s), phase)
            if STAGED_IDS:
                ids, ok = _staged_ids(ids_smem, i, offs_n)
            kn = kn_smem.index(s)
            z = _opaque_zero(i)  # q indexed through an opaque 0: its descriptors stay in the loop (not hoisted)
            if KV_DS_MLA:
                if COPY2:  # ROLE 1's copy of this block's RoPE landed (its arrivals follow its copies' completion)
                    mbarrier.wait(rope_ready.index(s), phase)
                    fence_async_shared()  # the copies' writes -> this consumer's wgmma (async proxy)
                elif COPY_ROPE:
                    if i + 1 < num_blocks:  # the next block's copy may still be in flight
                        async_copy.wait_group(1)
                    else:
                        async_copy.wait_group(0)
                    fence_async_shared()  # the RoPE's cp.async writes -> the wgmma (async proxy)
                    gl.thread_barrier()  # every warp's copies landed
                if PIPE:
                    sr, s0, s1, s2, s3 = _ds_score_wgmmas(kn, kr_smem.index(s), q_n.index(z), q_r.index(z), s_zero)
                    # block i - 1's half of P V, issued before these five (none in flight at the first block)
                    acc, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_b))
                    if i > 0:
                        gl.thread_barrier()  # every warp of this consumer is done with the other stage
                        mbarrier.arrive(empty.index((i + 1) % STAGES))
                    st = _ds_scores_of(sr, s0, s1, s2, s3, sc0, sc1, sc2, sc3)
                else:
                    st = _ds_scores(kn, kr_smem.index(s), q_n.index(z), q_r.index(z), s_zero, sc0, sc1, sc2, sc3)
            else:
                st = _e4m3_scores(kn, kr_smem.index(s), q_n.index(z), q_r.index(z), s_zero)
            st = gl.where(ok[:, None], st * col_scale[None, :], float("-inf"))
            block_max = _ids_max(st, wmax_smem, acc_l) if WARP_MAX else gl.max(st, axis=0)
            p, alpha, m_i, l_i = _softmax_from_max(st, block_max, m_i, l_i, DEFER)
            if KV_DS_MLA:
                _store_p_tiles(p_ring, s * P_TILES, p, sc0, sc1, sc2, sc3)
            else:
                p_ring.index(s).store(p.to(gl.float16))
            alpha_smem.index(s).store(alpha)
            fence_async_shared()
            gl.thread_barrier()  # P^T and alpha complete in shared memory before the wgmma and ROLE 1 read them
            mbarrier.arrive(p_ready.index(s))
            if PIPE:  # issued only, before the next block's mask and scales are read: waited for behind the next
                # block's score wgmmas
                acc, acc_b = _tile_pair_pv_issued(kn, COL0 // DS_TILE, p_ring, s * P_TILES, acc, acc_b, alpha)
            if KV_DS_MLA:
                if COPY_ROPE and not COPY2 and i + STAGES < num_blocks:  # this stage's RoPE tile was read
                    _copy_rope(KV, kr_smem.index(s), _checked(ids_next, nrows), stride_kv, kv_block_size, ROW_BYTES,
                               rope_l)
                if EARLY_IDS:  # the next block's
                    ids, ok = _block_ids(IDX, idx_base, start, i + 1, end, nrows, offs_n, BLOCK_N)
                if META2:  # the next block's, published by ROLE 1 (its P_t above took this block's scales)
                    if i + 1 < num_blocks:
                        n = (i + 1) % STAGES
                        ok, sc0, sc1, sc2, sc3 = _read_meta(meta_ids.index(n), meta_sc, n, meta_ready.index(n),
                                                            ((i + 1) // STAGES) & 1, offs_n)
            if not PIPE:
                if not SCORES_ONLY:
                    acc, acc_b = _half_pv(kn, p_ring, s * P_TILES, acc, acc_b, alpha, COL0, KV_DS_MLA)
                gl.thread_barrier()  # every warp of this consumer is done with stage s
                mbarrier.arrive(empty.index(s))
        if PIPE:  # the last block's half of P V
            acc, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_b))
        empty_row, l_safe, lse2 = _final_lse2(m_i, _row_sum(l_i, DEFER))
        scale = _out_scale(l_safe, lse2, empty_row, KV_SCALE, sink, HAS_SINKS, SPLIT, KV_DS_MLA)
        f_smem.store(scale)
        gl.thread_barrier()
        mbarrier.arrive(f_ready)
        if SPLIT:
            gl.store(PART_LSE + pid_t * stride_plt + pid_s * stride_pls + offs_h, lse2, mask=hmask)
        else:
            gl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E, mask=hmask)
    else:
        if META2:  # the first two blocks' mask and scales, while ROLE 0 stages q
            for b in gl.static_range(STAGES):
                if b < num_blocks:
                    m_ids, m_ok = _block_ids(IDX, idx_base, start, b, end, nrows, offs_n, BLOCK_N)
                    m0, m1, m2, m3 = _tile_scales(KV, m_ids, m_ok, stride_kv, kv_block_size, acc_l, ROW_BYTES)
                    _publish_meta(meta_ids.index(b), meta_sc, b, meta_ready.index(b), m_ok, m0, m1, m2, m3)
        if COPY2:  # the first two blocks' RoPE, while ROLE 0 stages q
            for b in gl.static_range(STAGES):
                if b < num_blocks:
                    _copy_rope_signalled(KV, kr_smem.index(b), rope_ready.index(b),
                                         _raw_ids(IDX, idx_base, end, start + b * BLOCK_N, BLOCK_N, rope_l),
                                         nrows, stride_kv, kv_block_size, ROW_BYTES, rope_l)
        for i in range(num_blocks):
            s = i % STAGES
            mbarrier.wait(p_ready.index(s), (i // STAGES) & 1)
            if COPY2:  # the ids of the RoPE this stage takes next, loaded while this block's P V runs
                ids_next = _raw_ids(IDX, idx_base, end, start + (i + STAGES) * BLOCK_N, BLOCK_N, rope_l)
            if META2:  # block i + 2's ids, loaded while this block's P V runs
                m_ids, m_ok = _block_ids(IDX, idx_base, start, i + STAGES, end, nrows, offs_n, BLOCK_N)
            alpha = alpha_smem.index(s).load(head_l)
            if SCORES_ONLY and KV_DS_MLA:
                acc, acc_b, acc_c, acc_d = _tile_quad_pv(kn_smem.index(s), p_ring, s * P_TILES, acc, acc_b, acc_c,
                                                         acc_d, alpha)
            else:
                acc, acc_b = _half_pv(kn_smem.index(s), p_ring, s * P_TILES, acc, acc_b, alpha, COL0, KV_DS_MLA)
            gl.thread_barrier()  # every warp of this consumer is done with stage s and its P^T
            mbarrier.arrive(empty.index(s))
            if COPY2 and i + STAGES < num_blocks:  # ROLE 0 has read this stage's RoPE (its P^T is ready)
                _copy_rope_signalled(KV, kr_smem.index(s), rope_ready.index(s), ids_next, nrows, stride_kv,
                                     kv_block_size, ROW_BYTES, rope_l)
            if META2 and i + STAGES < num_blocks:  # slot s held block i's, which ROLE 0 read during block i - 1
                m0, m1, m2, m3 = _tile_scales(KV, m_ids, m_ok, stride_kv, kv_block_size, acc_l, ROW_BYTES)
                _publish_meta(meta_ids.index(s), meta_sc, s, meta_ready.index(s), m_ok, m0, m1, m2, m3)
        mbarrier.wait(f_ready, 0)
        scale = f_smem.load(head_l)
    if not (SCORES_ONLY and ROLE == 0):
        _store_half(acc, acc_b, PART_OUT, OUT, pid_t, pid_s, offs_h, stride_pt, stride_ps, stride_ph, stride_ot,
                    stride_oh, scale, hmask, COL0, SPLIT, KV_DS_MLA)
    if SCORES_ONLY and KV_DS_MLA and ROLE == 1:
        _store_half(acc_c, acc_d, PART_OUT, OUT, pid_t, pid_s, offs_h, stride_pt, stride_ps, stride_ph, stride_ot,
                    stride_oh, scale, hmask, D_NOPE // 2, SPLIT, KV_DS_MLA)


@gluon.jit
def _store_cols(acc, o_row, col0, scale, hmask, SPLIT: gl.constexpr):
    """Value columns ``col0 ..`` of ``O^T`` (``acc``, ``[columns, heads]`` in the accumulator layout) times the
    per-head ``scale``, stored at ``o_row`` (per-head row pointers): fp32 partials when ``SPLIT``, else in the
    output's dtype. ``out`` is stored from :data:`OUT_L` (16-byte stores: a thread's 8 consecutive columns of one
    head); in the accumulator layout a thread holds 2-byte values of two heads, 1 KB apart in ``out``, and the
    stores of a V3.2 32-head CTA's ``O^T`` half took 1.8 us after its last block (fifty-fifth session, timeline on an
    H100; with these stores and the column split's early sinks, V3.2 H=32 T=256 187.3 against 190.1-190.5 us, e4m3
    175.3 against 175.8-176.3, outputs bitwise equal: BENCHMARKS.md). The partials keep the accumulator layout: their
    fp32 conversion's scratch would not fit beside the ring (253,536 bytes of shared memory at V3.2 H=32, AOT sm90)."""
    rows = acc * scale[None, :]
    if SPLIT:
        offs_d = col0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc.type.layout))
        gl.store(o_row[None, :] + offs_d[:, None], rows, mask=hmask[None, :])
    else:
        rows = gl.convert_layout(rows.to(o_row.dtype.element_ty), OUT_L)
        offs_d = col0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, OUT_L))
        o_row = gl.convert_layout(o_row, gl.SliceLayout(0, OUT_L))
        hmask = gl.convert_layout(hmask, gl.SliceLayout(0, OUT_L))
        gl.store(o_row[None, :] + offs_d[:, None], rows, mask=hmask[None, :])


@gluon.jit
def sparse_mla_decode_fp8_ws_kernel(
    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, sm_scale,
    num_heads, num_rows, topk, ids_per_split, kv_block_size: gl.constexpr,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_lh,
    stride_pt, stride_ps, stride_ph, stride_plt, stride_pls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    HAS_SINKS: gl.constexpr, HAS_TOPK_LEN: gl.constexpr, SPLIT: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PRODUCER_ROWS: gl.constexpr,
    KV_DS_MLA: gl.constexpr, ROW_BYTES: gl.constexpr, ROWS_16B: gl.constexpr,
    LINES: gl.constexpr, DEFER_ROW_SUM: gl.constexpr,
    SCORES_ONLY: gl.constexpr, EARLY_IDS: gl.constexpr, STAGED_IDS: gl.constexpr, WARP_MAX: gl.constexpr,
    ROPE_BY_SECOND: gl.constexpr, META_BY_SECOND: gl.constexpr, L2_PREFETCH: gl.constexpr,
    PRODUCERS: gl.constexpr, PRODUCER_AHEAD: gl.constexpr, PV_OVERLAP: gl.constexpr,
):
    """One CTA = (head group, id range ``pid_s``, token): heads ``BLOCK_H * group ..`` of the token (every head
    when one group holds them). See the module docstring.
    ``LAUNCH_DEPENDENTS``: let the combine, launched as a programmatic dependent, start at once. ``DEFER_ROW_SUM``:
    the softmax's row sum per thread, summed over ids once at the end (:func:`_zero_row_sum`). ``KV_DS_MLA``:
    KV is the 656-byte V3.2 rows as bytes (``ROW_BYTES`` per row, ``kv_block_size`` rows per page of
    ``stride_kv`` bytes; 1 for ``[N, 656]``), the ring and q are bf16, q unscaled; else an e4m3fn cache of
    ``stride_kv``-element rows, fp16 ring and scaled q. The two consumers split ``O^T`` by value columns
    (:func:`_consumer_cols`; the alternate-block consumers, the other arrangement until the seventy-sixth session,
    are in git history). ``EARLY_IDS``: V3.2 rows on the column split, the first consumer's first ids loaded before q
    (:func:`_consumer_cols`). ``WARP_MAX``: on the column split, the first consumer's block maximum per warp
    (:func:`_ids_max`)."""
    if LAUNCH_DEPENDENTS:
        launch_dependents(gl.program_id(1))
    pid_s = gl.program_id(1)
    pid_t = gl.program_id(2).to(gl.int64)
    # head group pid_h: heads h0 .. h0 + BLOCK_H - 1 of the token (one group unless the table's head block is
    # smaller than the call's heads), as a CTA of that many heads whose q, outputs and sinks start at head h0
    h0 = gl.program_id(0) * BLOCK_H
    Q += h0 * stride_qh
    OUT += h0 * stride_oh
    LSE += h0 * stride_lh
    PART_OUT += h0 * stride_ph
    PART_LSE += h0  # [T, splits, H]: heads at stride 1
    SINKS += h0
    num_heads -= h0
    t_end = topk
    if HAS_TOPK_LEN:
        t_end = gl.minimum(gl.maximum(gl.load(TOPK_LEN + pid_t), 0), topk)
    start = pid_s * ids_per_split
    end = gl.minimum(start + ids_per_split, t_end)
    num_blocks = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    idx_base = pid_t * stride_it
    # [1, ..]: indexed like the ring stages, through the consumers' opaque index, so that the scores' wgmma
    # descriptors of q are computed in the loop rather than hoisted out of it (and spilled)
    # the operands' dtype: fp16 for e4m3 (exact codes; q scaled into range), bf16 for V3.2 (exact codes, the
    # bf16 RoPE and q as they are; P_t = P * tile scale needs bf16's range)
    if KV_DS_MLA:
        dt: gl.constexpr = gl.bfloat16
        p_tiles: gl.constexpr = D_NOPE // DS_TILE  # one P^T per tile scale
    else:
        dt: gl.constexpr = gl.float16
        p_tiles: gl.constexpr = 1
    q_n = gl.allocate_shared_memory(dt, [1, BLOCK_H, D_NOPE],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_NOPE], dt))
    q_r = gl.allocate_shared_memory(dt, [1, BLOCK_H, D_ROPE],
                                    gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], dt))
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], dt)
    # one P^T ring read by both consumers (a stage's P^T per tile scale)
    p_ring = gl.allocate_shared_memory(dt, [STAGES * p_tiles, BLOCK_N, BLOCK_H], p_layout)
    kn_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, D_NOPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_NOPE], dt))
    kr_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, D_ROPE],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], dt))
    vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    scale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_l)
    f_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], vec_l)  # the per-head output factor, ROLE 0 -> 1
    if STAGED_IDS:  # each block's checked ids, from the producer to the consumers
        gl.static_assert(not KV_DS_MLA, "V3.2 rows: the consumers load each block's ids before its stage is filled")
        ids_smem = gl.allocate_shared_memory(gl.int32, [IDS_STAGES, BLOCK_N], vec_l)
    else:
        ids_smem = scale_smem  # (a placeholder, never read)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    f_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # f_smem written
    p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())  # P^T ready
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers read every stage
        mbarrier.init(p_ready.index(s), count=1)
    mbarrier.init(f_ready, count=1)
    fence_async_shared()  # the barriers' initialisation, before any partition uses them
    gl.thread_barrier()

    # 16 heads: the first consumer is the default partition (the rest of the registers), the second consumer
    # and the producer workers, as at 32 heads on every arrangement (tables/gluon_fp8.yaml). Until the twenty-sixth
    # session e4m3's unsplit 32-head alternate blocks made the producer the default partition and both consumers
    # workers (as the default partition, the first consumer spilled the loop's wgmma descriptors at any register
    # split that left the producer room); the alternate scores (each consumer half of O^T) replaced them, and the
    # column split with two producers replaced those (seventy-fourth session)
    alpha_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_H], vec_l)
    if WARP_MAX:  # the first consumer's per-warp maxima of a block (_ids_max)
        wmax_smem = gl.allocate_shared_memory(gl.float32, [WARPS, BLOCK_H],
                                              gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    else:
        wmax_smem = alpha_smem  # not read
    if ROPE_BY_SECOND and KV_DS_MLA and ROWS_16B:  # each stage's RoPE copied by the second consumer
        rope_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(rope_ready.index(s), count=WARPS * 32)  # one noinc arrival a thread
        fence_async_shared()
        gl.thread_barrier()
    else:
        rope_ready = ready  # not used
    if META_BY_SECOND and KV_DS_MLA:  # each block's mask and tile scales from the second consumer
        meta_ids = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], vec_l)
        meta_sc = gl.allocate_shared_memory(gl.float32, [STAGES * 4, BLOCK_N], vec_l)  # slot s: rows 4 s ..
        meta_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(meta_ready.index(s), count=1)
        fence_async_shared()
        gl.thread_barrier()
    else:
        meta_ids = ids_smem  # not used
        meta_sc = alpha_smem
        meta_ready = ready
    # the second producer (the two fill alternate ring stages: tables/gluon_fp8.yaml's producers) only where
    # PRODUCERS is 2: Triton 3.6's Gluon takes the partitions only as a list literal of the call, sliced here
    gl.warp_specialize([
        (_consumer_cols, (Q, IDX, KV, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p_ring,
                          alpha_smem, kn_smem, kr_smem, ready, empty, p_ready, scale_smem, f_smem, f_ready,
                          sm_scale, stride_qt, stride_qh, pid_t, pid_s, idx_base, stride_kv, kv_block_size,
                          num_heads, num_rows, start, end, num_blocks, stride_ot, stride_oh, stride_lt, stride_lh,
                          stride_pt, stride_ps, stride_ph, stride_plt, stride_pls, BLOCK_H, BLOCK_N, D_NOPE,
                          HAS_SINKS, SPLIT, 0, KV_DS_MLA, ROW_BYTES, KV_DS_MLA and ROWS_16B, DEFER_ROW_SUM,
                          SCORES_ONLY, EARLY_IDS, ids_smem, STAGED_IDS, wmax_smem, WARP_MAX, rope_ready,
                          ROPE_BY_SECOND, meta_ids, meta_sc, meta_ready, META_BY_SECOND, PV_OVERLAP)),
        (_consumer_cols, (Q, IDX, KV, SINKS, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, q_n, q_r, p_ring,
                          alpha_smem, kn_smem, kr_smem, ready, empty, p_ready, scale_smem, f_smem, f_ready,
                          sm_scale, stride_qt, stride_qh, pid_t, pid_s, idx_base, stride_kv, kv_block_size,
                          num_heads, num_rows, start, end, num_blocks, stride_ot, stride_oh, stride_lt, stride_lh,
                          stride_pt, stride_ps, stride_ph, stride_plt, stride_pls, BLOCK_H, BLOCK_N, D_NOPE,
                          HAS_SINKS, SPLIT, 1, KV_DS_MLA, ROW_BYTES, KV_DS_MLA and ROWS_16B, DEFER_ROW_SUM,
                          SCORES_ONLY, EARLY_IDS, ids_smem, STAGED_IDS, wmax_smem, WARP_MAX, rope_ready,
                          ROPE_BY_SECOND, meta_ids, meta_sc, meta_ready, META_BY_SECOND, PV_OVERLAP)),
        (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, kv_block_size, num_rows, start,
                     end, num_blocks, BLOCK_N, D_NOPE, D_ROPE, PRODUCER_ROWS, KV_DS_MLA, ROW_BYTES, ROWS_16B,
                     LINES, ids_smem, STAGED_IDS, L2_PREFETCH, 0, PRODUCERS, PRODUCER_AHEAD)),
        (_producer, (IDX, KV, kn_smem, kr_smem, ready, empty, idx_base, stride_kv, kv_block_size, num_rows, start,
                     end, num_blocks, BLOCK_N, D_NOPE, D_ROPE, PRODUCER_ROWS, KV_DS_MLA, ROW_BYTES, ROWS_16B,
                     LINES, ids_smem, STAGED_IDS, L2_PREFETCH, 1, PRODUCERS, PRODUCER_AHEAD)),
    ][:2 + PRODUCERS], [4, 4, 4][:1 + PRODUCERS], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS][:1 + PRODUCERS])


def fp8_launch_args(q, kv_cache, indices, *, num_kv_splits: int, ids_per_split: int, out_strides: tuple,
                    kv_dtype: str = "fp8_e4m3"):
    """``(grid, scalars, constexprs, options)`` of a :func:`sparse_mla_decode_fp8_ws_kernel` launch on these
    tensors' metadata (the grid: head groups ``cdiv(H, head block)``, splits, tokens; shared by
    :func:`sparse_mla_decode_fp8_gluon` and the prepared runner of :mod:`mla_sink.paths.triton.launch`). ``scalars`` are
    the integer arguments by name; ``out_strides`` the ``(token, head)`` strides of ``out``. Split launches
    (``num_kv_splits > 1``) write fp32 partials ``[T, splits, H, 512]`` and base-2 LSEs ``[T, splits, H]`` and let the
    combine launch early. ``kv_dtype``: ``"fp8_e4m3"`` (``kv_cache`` ``[N, 576]`` float8_e4m3fn) or ``"fp8_ds_mla"``
    (``kv_cache`` the 656-byte rows as uint8, ``[N, 656]`` or ``[blocks, block_size, 656]`` with any block stride).
    ``ROWS_16B`` (:func:`rows_16b`) is this ``kv_cache``'s: a runner reused for other pools checks it per call.
    The head block, the partitions' registers, the producer's steps and the
    row sums are the row of ``tables/gluon_fp8.yaml`` for (kv dtype, q dtype, heads, split or not, blocks a CTA)
    (:func:`mla_sink.kernels.gluon.tuning.fp8_arrangement`, cached; a sweep may rebind this module's
    ``fp8_arrangement`` to try others).

    Raises:
        ValueError: ``kv_dtype`` not one the table declares, or not the cache's own (its dtype and row size,
            :func:`mla_sink.core.dtypes.kv_dtype_key`), or a cache of another shape than ``[N, 576]`` (e4m3) or
            ``[N, 656]`` / ``[blocks, block_size, 656]`` (V3.2); q of a dtype with no dtype key
            (:func:`mla_sink.core.dtypes.dtype_key`); a refusal row of the table (q of a dtype the cache is not
            read with - V3.2 rows: bf16 only -, or more heads than its largest head block, 32).
    """
    from mla_sink.core import kv_layout
    from mla_sink.core.dtypes import DS_MLA_KEYS, dtype_key, kv_dtype_key
    from mla_sink.core.records import D_V, MAX_ROWS

    T, H, d_qk = q.shape
    d_v = D_V
    if kv_dtype not in fp8_kv_dtypes():
        raise ValueError(f"the gluon_fp8 kernel reads kv_dtype {' or '.join(map(repr, fp8_kv_dtypes()))}, got "
                         f"kv_dtype={kv_dtype!r}")
    splits = num_kv_splits
    try:
        q_key = dtype_key(q.dtype)
    except ValueError as e:
        raise ValueError(f"the gluon_fp8 kernel: q {e}") from None
    arr = fp8_arrangement(kv_dtype, q_key, H, splits > 1, cta_blocks(ids_per_split, indices.shape[1]))
    if kv_dtype_key(kv_cache) != kv_dtype:  # a 656-byte V3.2 pool read as e4m3 codes would decode as garbage
        raise ValueError(f"the gluon_fp8 kernel: 'kv_cache' ({kv_cache.dtype}, shape {tuple(kv_cache.shape)}) is a "
                         f"{kv_dtype_key(kv_cache)!r} cache, not the kv_dtype={kv_dtype!r} asked for")
    shapes = ((2, kv_layout.ROW_BYTES), (3, kv_layout.ROW_BYTES)) if kv_dtype in DS_MLA_KEYS else ((2, d_qk),)
    if (kv_cache.dim(), kv_cache.shape[-1]) not in shapes:  # e4m3 [N, 576]; V3.2 [N, 656] or paged
        want = "[N, 656] or [blocks, block_size, 656]" if kv_dtype in DS_MLA_KEYS else f"[N, {d_qk}]"
        raise ValueError(f"the gluon_fp8 kernel: a kv_dtype={kv_dtype!r} 'kv_cache' must be {want} (got shape "
                         f"{tuple(kv_cache.shape)})")
    ds = kv_dtype in DS_MLA_KEYS  # the rows carry their tile scales (and a bf16 RoPE)
    num_rows = kv_layout.num_rows(kv_cache)
    # pages that follow each other without a gap are the flat pool they are (kv_layout.row_addressing)
    kv_block_size, stride_kv = kv_layout.row_addressing(kv_cache)
    scalars = dict(
        num_heads=H, num_rows=min(num_rows, MAX_ROWS), topk=indices.shape[1], ids_per_split=ids_per_split,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_it=indices.stride(0),
        stride_ot=out_strides[0], stride_oh=out_strides[1], stride_lt=H, stride_lh=1,
        stride_pt=splits * H * d_v, stride_ps=H * d_v, stride_ph=d_v, stride_plt=splits * H, stride_pls=H,
    )
    # the rows' page size as a constexpr: a paged cache's `id // kv_block_size` and `id % kv_block_size` become a
    # shift and a mask (a runtime 64 put an integer division into every row's address: AOT sm90, V3.2 at 16 heads,
    # 935 instructions a block in the producer's loop against 786; a flat cache's 1 was specialised already)
    constexprs = dict(kv_block_size=kv_block_size,
                      BLOCK_H=arr.head_block, BLOCK_N=BLOCK_N, D_NOPE=d_v, D_ROPE=d_qk - d_v,
                      HAS_SINKS=False, HAS_TOPK_LEN=False, SPLIT=splits > 1, LAUNCH_DEPENDENTS=splits > 1,
                      CONSUMER_REGS=arr.consumer_regs, PRODUCER_REGS=arr.producer_regs, PRODUCER_ROWS=arr.producer_rows,
                      KV_DS_MLA=ds,
                      ROW_BYTES=kv_layout.ROW_BYTES if ds else d_qk, ROWS_16B=rows_16b(kv_cache), LINES=arr.lines,
                      DEFER_ROW_SUM=arr.deferred_row_sum,
                      SCORES_ONLY=arr.scores_only, EARLY_IDS=arr.early_ids, STAGED_IDS=arr.staged_ids,
                      WARP_MAX=arr.warp_max, ROPE_BY_SECOND=arr.rope_by_second,
                      META_BY_SECOND=arr.meta_by_second, L2_PREFETCH=arr.l2_prefetch,
                      PRODUCERS=arr.producers, PRODUCER_AHEAD=arr.producer_ahead, PV_OVERLAP=arr.pv_overlap)
    return (arr.ctas_per_token(H), splits, T), scalars, constexprs, dict(num_warps=4)


#: Bytes a row's start must be a multiple of for the producer's asm row loads (:data:`_LD_ROW_CHUNK` and kin).
ROW_ALIGN = 16


def rows_16b(kv_cache) -> bool:
    """Whether every row of ``kv_cache`` starts at a multiple of 16 bytes (pool pointer and row / block strides),
    as the producer's asm row loads (:data:`_LD_ROW_CHUNK` and kin) need; otherwise it gathers with ``gl.load``,
    which Triton compiles for the alignment it sees (a V3.2 pool may sit 4 bytes past a boundary, with 660-byte
    rows). The per-row stride of a paged cache is the row size (656 bytes: a multiple of 16)."""
    size = kv_cache.element_size()
    return kv_cache.data_ptr() % ROW_ALIGN == 0 and all(st * size % ROW_ALIGN == 0 for st in kv_cache.stride()[:-1])


def sparse_mla_decode_fp8_gluon(q, kv_cache, indices, sinks=None, sm_scale=None, *, topk_length=None,
                                kv_scale=None, out=None, lse=None, num_kv_splits: int = 1, ids_per_split=None,
                                combine_tile: tuple = (16, 128), kv_dtype: str = "fp8_e4m3"):
    """Launch :func:`sparse_mla_decode_fp8_ws_kernel` (CUDA sm90; ``H <= 32``; e4m3fn KV with bf16/fp16 q, or
    the 656-byte V3.2 rows with bf16 q), with
    the combine kernel (a programmatic dependent) when split; for tests and benchmarks (the library's
    runner, :mod:`mla_sink.paths.triton.launch`, launches the same kernels with the plan's splits).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 (V3.2: bf16), innermost stride 1. kv_cache: ``[N, 576]``
            float8_e4m3fn, innermost stride 1; with ``kv_dtype="fp8_ds_mla"`` uint8 ``[N, 656]`` or
            ``[blocks, block_size, 656]`` (rows contiguous, any block stride that is a multiple of 4 bytes).
            indices: int32 ``[T, topk]``, innermost stride 1 (``-1`` / negative /
            ``>= N`` skipped). sinks: optional fp32 ``[H]``. sm_scale: default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]`` (contiguous). kv_scale: fp32 ``[1]`` (value = stored *
            scale); ``None`` means 1. out, lse: optional ``[T, H, 512]`` (innermost stride 1) and fp32
            ``[T, H]`` buffers. num_kv_splits: programs per token, each over ``ids_per_split`` ids (default:
            ``topk`` split evenly in multiples of 64). combine_tile: ``(heads, value columns)`` of one
            combine program. kv_dtype: ``"fp8_e4m3"`` or ``"fp8_ds_mla"`` (no ``kv_scale``: the rows carry
            theirs).

    Returns:
        ``(out, lse)`` as :func:`mla_sink.paths.triton.launch.sparse_mla_decode_triton` returns them.

    Raises:
        ValueError: ``num_heads > 32``; an unknown ``kv_dtype``; V3.2 rows with q not bf16.
    """
    import torch

    from mla_sink.core.records import D_V
    from mla_sink.kernels.gluon import launch_buffers
    from mla_sink.kernels.triton.combine import combine_jit, combine_launch_args

    T, H, _ = q.shape
    topk = indices.shape[1]
    out, lse, sm_scale = launch_buffers(q, out, lse, sm_scale)
    if ids_per_split is None:
        ids_per_split = -(-(-(-max(topk, 1) // num_kv_splits)) // BLOCK_N) * BLOCK_N
    grid, scalars, constexprs, options = fp8_launch_args(q, kv_cache, indices, num_kv_splits=num_kv_splits,
                                                         ids_per_split=ids_per_split,
                                                         out_strides=(out.stride(0), out.stride(1)), kv_dtype=kv_dtype)
    if T == 0 or H == 0:
        return out, lse
    if kv_scale is None:
        kv_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    split = num_kv_splits > 1
    part_out = torch.empty((T, num_kv_splits, H, D_V), dtype=torch.float32, device=q.device) if split else lse
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
