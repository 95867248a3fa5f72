"""The trees of the forty-ninth session's probe of what sets V3.2's period at 32 heads (issue #12's one missed bar,
V3.2 H=32 T=256 on the H200): each is a ``git archive`` of :data:`BASE` with one piece of the column split's first
consumer (``gluon_fp8._consumer_cols``, ROLE 0; the ``ds_mla_h32`` row) taken out. **Their outputs are wrong by
design** - they time what the period is without that piece, nothing else:

- ``main``: :data:`BASE` as it is;
- ``noscales``: no tile-scale loads - the four scales are 1.0 through a runtime product (``num_rows * 0.0 + 1.0``,
  so the multiplies by them stay);
- ``noloads``: no global load in the loop at all - no scales (as ``noscales``), no ids (every id counts as valid)
  and no RoPE copies for the blocks after the first two;
- ``nomax``: the softmax's running maximum fixed at 8 (no maximum over ids, which crosses the consumer's four warps);
- ``nopv``: the first consumer's half of ``P V`` not issued (the second consumer's half still is), so the stage is
  released as soon as its ``P_t`` are stored.

The expectation each tests: the piece that sets the period is the one whose removal moves the time by about its share
of the first consumer's 2.88 µs a block (seventeenth session's timeline); a piece off the period moves nothing.

    PYTHONPATH=. python3 benchmarks/consumer_ablation_trees.py out
    cd benchmarks && PYTHONPATH=..:. python3 -u consumer_ablation_ab.py $OUT/ab.json m1=../out/main \\
        s=../out/noscales l=../out/noloads x=../out/nomax p=../out/nopv m2=../out/main
"""

from __future__ import annotations

import os
import sys

from tree_ab import archive_tree

KERNEL = os.path.join("mla_sink", "kernels", "gluon", "gluon_fp8.py")
#: The commit the trees are archived from (forty-ninth session: main after ``prefetch_scales`` left it).
BASE = "059d8df"

_IDS = "                ids, ok = _block_ids(IDX, idx_base, start, i, end, nrows, offs_n, BLOCK_N)\n"
_SCALES = "                sc0, sc1, sc2, sc3 = _tile_scales(KV, ids, ok, stride_kv, kv_block_size, acc_l, ROW_BYTES)\n"
_ONES = ("                sc0 = gl.full([BLOCK_N], 1.0, gl.float32, layout=gl.SliceLayout(1, acc_l)) * "
         "(num_rows.to(gl.float32) * 0.0 + 1.0)\n"
         "                sc1 = sc0\n                sc2 = sc0\n                sc3 = sc0\n")
_ROPE = "                if COPY_ROPE and i + STAGES < num_blocks:  # this stage's RoPE tile"
_MAX = "    m_new = gl.maximum(m_i, gl.max(st, axis=0))\n"
_PV = "            if not SCORES_ONLY:\n                acc, acc_b = _half_pv(kn, p_ring, s * P_TILES"

#: Variant -> the (old, new) edits of gluon_fp8.py (each ``old`` occurs once).
VARIANTS = {
    "main": [],
    "noscales": [(_SCALES, _ONES)],
    "noloads": [(_SCALES, _ONES), (_IDS, "                ok = offs_n >= 0\n"),
                (_ROPE, _ROPE.replace("if COPY_ROPE and", "if False and"))],
    "nomax": [(_MAX, "    m_new = gl.zeros_like(m_i) + 8.0\n")],
    "nopv": [(_PV, _PV.replace("if not SCORES_ONLY:", "if False:"))],
}


def build(out_dir: str, name: str) -> str:
    """``out_dir/name``: :data:`BASE`'s tree with :data:`VARIANTS`'s edits of the kernel. Returns its path.

    Raises:
        ValueError: an edit's text is not in the kernel exactly once.
        subprocess.CalledProcessError: the archive failed.
    """
    tree = archive_tree(BASE, os.path.join(out_dir, name))
    path = os.path.join(tree, KERNEL)
    text = open(path).read()
    for old, new in VARIANTS[name]:
        if text.count(old) != 1:
            raise ValueError(f"{name}: {old!r} occurs {text.count(old)} times in {KERNEL} (expected once)")
        text = text.replace(old, new)
    open(path, "w").write(text)
    return tree


def main(out_dir: str = "out") -> None:
    for name in VARIANTS:
        print(build(out_dir, name))


if __name__ == "__main__":
    main(*sys.argv[1:])
