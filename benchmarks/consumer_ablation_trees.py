"""The trees of the forty-ninth session's probe of what sets V3.2's period at 32 heads (issue #12's one missed bar,
V3.2 H=32 T=256 on the H200): each is a ``git archive`` of :data:`BASE` with one piece of the column split's first
consumer (``gluon_fp8._consumer_cols``, ROLE 0; the ``ds_mla_h32`` row) taken out. **Their outputs are wrong by
design** - they time what the period is without that piece, nothing else:

- ``main``: :data:`BASE` as it is;
- ``noscales``: no tile-scale loads - the four scales are 1.0 through a runtime product (``num_rows * 0.0 + 1.0``,
  so the multiplies by them stay);
- ``noloads``: no global load in the loop at all - no scales (as ``noscales``), no ids (every id counts as valid)
  and no RoPE copies for the blocks after the first two;
- ``noids`` (forty-ninth session, after the first timing): ``noloads`` with the RoPE copies kept - no ids and no
  scales loaded (the scales need the ids);
- ``norope``: only the RoPE copies of the blocks after the first two dropped (ids and scales loaded as on main), so
  that ``noids`` and ``norope`` split ``noloads``' 11%;
- ``align`` (fiftieth session): the producer's latent gather at ``id * 640`` (128-byte aligned rows), the
  consumer's loads as on main - what the 7 of 8 V3.2 rows whose 512 latent bytes straddle five 128-byte lines cost;
- ``nomax``: the softmax's running maximum fixed at 8 (no maximum over ids, which crosses the consumer's four warps);
- ``nopv``: the first consumer's half of ``P V`` not issued (the second consumer's half still is), so the stage is
  released as soon as its ``P_t`` are stored;
- ``warpmax`` (a candidate, output exact): the block's maximum over ids as each warp's maximum over its 16 ids
  (shuffles), one ``[4, heads]`` exchange through shared memory and one barrier, instead of Triton's generic
  cross-warp reduction (``nomax`` bounds what it can gain); timed again in the fifty-first session and kept, as the
  column split's ``warp_max`` (BENCHMARKS.md);
- ``p4`` (a candidate for the column split's V3.2 rows, output exact; the trees' other arrangements that read V3.2's
  ``P_t`` ring are not built for it): the four ``P_t`` of a stage in four allocations instead of four tiles of one
  ring, so that the barrier analysis does not put a barrier after each of their stores (three a block).

The expectation each tests: the piece that sets the period is the one whose removal moves the time by about its share
of the first consumer's 2.88 µs a block (seventeenth session's timeline); a piece off the period moves nothing.

    PYTHONPATH=. python3 benchmarks/consumer_ablation_trees.py out
    cd benchmarks && PYTHONPATH=..:. python3 -u consumer_ablation_ab.py $OUT/ab.json m1=../out/main \\
        s=../out/noscales l=../out/noloads x=../out/nomax p=../out/nopv w=../out/warpmax \\
        q=../out/p4 m2=../out/main
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

KERNEL = os.path.join("mla_sink", "kernels", "gluon", "gluon_fp8.py")
#: The commit the trees are archived from (forty-ninth session: main after ``prefetch_scales`` left it).
BASE = "c698ba9"

_IDS = "                ids, ok = _block_ids(IDX, idx_base, start, i, end, nrows, offs_n, BLOCK_N)\n"
_SCALES = "                sc0, sc1, sc2, sc3 = _tile_scales(KV, ids, ok, stride_kv, kv_block_size, acc_l, ROW_BYTES)\n"
_ONES = ("                sc0 = gl.full([BLOCK_N], 1.0, gl.float32, layout=gl.SliceLayout(1, acc_l)) * "
         "(num_rows.to(gl.float32) * 0.0 + 1.0)\n"
         "                sc1 = sc0\n                sc2 = sc0\n                sc3 = sc0\n")
_ROPE = "                if COPY_ROPE and i + STAGES < num_blocks:  # this stage's RoPE tile"
#: ``align``: the producer's latent gather at ``id * 640`` (128-byte aligned rows; 640 < 656 keeps every id in the
#: pool), the consumer's scales and RoPE where they are - what V3.2's rows straddling 128-byte lines cost the gather
_LATENT = ("                x_n = _gather_bytes(_rows(KV, ids_n, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES), ids_n, "
           "D_NOPE,\n")
_MAX = "    m_new = gl.maximum(m_i, gl.max(st, axis=0))\n"
_PV = "            if not SCORES_ONLY:\n                acc, acc_b = _half_pv(kn, p_ring, s * P_TILES"

_SOFTMAX = ("            p, alpha, m_i, l_i = _online_softmax(gl.where(ok[:, None], st * col_scale[None, :], "
            "float(\"-inf\")), m_i,\n                                                 l_i, DEFER)\n")
_SOFTMAX_W = ("            sx = gl.where(ok[:, None], st * col_scale[None, :], float(\"-inf\"))\n"
              "            p, alpha, m_i, l_i = _softmax_with_max(sx, m_i, l_i, DEFER, "
              "_ids_max(sx, wmax_smem.index(s), acc_l))\n")
#: ``warpmax``'s helpers, put before ``_online_softmax``: each warp's maximum over its 16 ids (shuffles only), one
#: ``[4, heads]`` exchange through shared memory (double-buffered by ring stage: the block after next rewrites a buffer
#: only after the barrier that follows this block's P_t stores) and one barrier, instead of the generic reduction.
_WARPMAX_HELPERS = """@gluon.jit
def _ids_max(st, buf, acc_l: gl.constexpr):
    BH: gl.constexpr = st.shape[1]
    wmax = gl.max(gl.reshape(st, [4, st.shape[0] // 4, BH]), axis=1)
    buf.store(wmax)
    gl.thread_barrier()
    if BH == 32:
        all_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 8], [0, 16], [1, 0], [2, 0]], lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
            warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, BH])
    else:
        all_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 8], [1, 0], [2, 0]], lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
            warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, BH])
    return gl.convert_layout(gl.max(buf.load(all_l), axis=0), gl.SliceLayout(0, acc_l))


@gluon.jit
def _softmax_with_max(st, m_i, l_i, DEFER: gl.constexpr, bmax):
    m_new = gl.maximum(m_i, bmax)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(st - m_safe[None, :])
    return p, alpha, m_new, _add_rows(l_i, alpha, p, DEFER)


@gluon.jit
def _online_softmax("""
_COLS_SIG = "                   EARLY_IDS: gl.constexpr, ids_smem, STAGED_IDS: gl.constexpr):\n"
_COLS_ARGS = "SCORES_ONLY, EARLY_IDS, ids_smem, STAGED_IDS)),"
_ALPHA = "        alpha_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_H], vec_l)\n"

_P4_HELPER = """@gluon.jit
def _pair_pv_bufs(kn, T0: gl.constexpr, pt0, pt1, acc, acc_b, alpha):
    acc = acc * alpha[None, :]
    acc_b = acc_b * alpha[None, :]
    acc = warpgroup_mma(kn.slice(T0 * DS_TILE, DS_TILE, dim=1).permute((1, 0)), pt0, acc, is_async=True)
    acc_b = warpgroup_mma(kn.slice((T0 + 1) * DS_TILE, DS_TILE, dim=1).permute((1, 0)), pt1, acc_b, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_b))


@gluon.jit
def _tile_pv("""
_P_STORE = "                _store_p_tiles(p_ring, s * P_TILES, p, sc0, sc1, sc2, sc3)\n"
_P_STORE4 = ("                pa.index(s).store((p * sc0[:, None]).to(pa.dtype))\n"
             "                pb.index(s).store((p * sc1[:, None]).to(pa.dtype))\n"
             "                pc.index(s).store((p * sc2[:, None]).to(pa.dtype))\n"
             "                pd.index(s).store((p * sc3[:, None]).to(pa.dtype))\n")
_PV0 = "                acc, acc_b = _half_pv(kn, p_ring, s * P_TILES, acc, acc_b, alpha, COL0, KV_DS_MLA)\n"
_PV1 = ("                acc, acc_b = _half_pv(kn_smem.index(s), p_ring, s * P_TILES, acc, acc_b, alpha, COL0, "
        "KV_DS_MLA)\n")
_RING = "        p_ring = gl.allocate_shared_memory(dt, [STAGES * p_tiles, BLOCK_N, BLOCK_H], p_layout)\n"
_RING4 = ("        p_ring = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, BLOCK_H], p_layout)\n"
          + "".join(f"        p{x} = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, BLOCK_H], p_layout)\n"
                    for x in "abcd"))

#: Variant -> the edits of gluon_fp8.py (:func:`tree_ab.edited_tree`: ``_COLS_ARGS`` occurs twice, both replaced).
VARIANTS = {
    "main": [],
    "noscales": [(_SCALES, _ONES)],
    "noloads": [(_SCALES, _ONES), (_IDS, "                ok = offs_n >= 0\n"),
                (_ROPE, _ROPE.replace("if COPY_ROPE and", "if False and"))],
    "noids": [(_SCALES, _ONES), (_IDS, "                ok = offs_n >= 0\n")],
    "norope": [(_ROPE, _ROPE.replace("if COPY_ROPE and", "if False and"))],
    "align": [(_LATENT, _LATENT.replace("_rows(KV, ids_n, stride_kv, kv_block_size, KV_DS_MLA, ROW_BYTES)",
                                         "KV + ids_n.to(gl.int64) * 640"))],
    "nomax": [(_MAX, "    m_new = gl.zeros_like(m_i) + 8.0\n")],
    "nopv": [(_PV, _PV.replace("if not SCORES_ONLY:", "if False:"))],
    "warpmax": [("@gluon.jit\ndef _online_softmax(", _WARPMAX_HELPERS), (_SOFTMAX, _SOFTMAX_W),
                (_COLS_SIG, _COLS_SIG.replace("STAGED_IDS: gl.constexpr):", "STAGED_IDS: gl.constexpr, wmax_smem):")),
                (_COLS_ARGS, _COLS_ARGS.replace("STAGED_IDS)),", "STAGED_IDS, wmax_smem)),"), 2),
                (_ALPHA, _ALPHA + "        wmax_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BLOCK_H], "
                                  "gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))\n")],
    "p4": [("@gluon.jit\ndef _tile_pv(", _P4_HELPER), (_P_STORE, _P_STORE4),
           (_PV0, "                if KV_DS_MLA:\n    "
            + _PV0.replace("_half_pv(kn, p_ring, s * P_TILES,", "_pair_pv_bufs(kn, 0, pa.index(s), pb.index(s),")
            .replace(", COL0, KV_DS_MLA)", ")") + "                else:\n    " + _PV0),
           (_PV1, "                if KV_DS_MLA:\n    "
            + _PV1.replace("_half_pv(kn_smem.index(s), p_ring, s * P_TILES,",
                           "_pair_pv_bufs(kn_smem.index(s), 2, pc.index(s), pd.index(s),")
            .replace(", COL0, KV_DS_MLA)", ")") + "                else:\n    " + _PV1),
           (_COLS_SIG, _COLS_SIG.replace("STAGED_IDS: gl.constexpr):", "STAGED_IDS: gl.constexpr, pa, pb, pc, pd):")),
           (_COLS_ARGS, _COLS_ARGS.replace("STAGED_IDS)),", "STAGED_IDS, pa, pb, pc, pd)),"), 2),
           (_RING, _RING4)],
}


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, KERNEL, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
