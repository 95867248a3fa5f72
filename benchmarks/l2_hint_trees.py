"""The trees of the fifty-eighth session's L2 prefetch-hint A/B (issue #12; BENCHMARKS.md, fifty-eighth session,
section 3): :data:`BASE` archived once per variant, with the producer's hinted row loads
(``gluon_fp8._LD_ROW_CHUNK`` and ``_LD_ROW_CHUNK8``, ``ld.global.L2::256B``) given another cache qualifier:

- ``main``: main's kernels;
- ``h128``: ``ld.global.L2::128B`` (the L2 fetches the 128-byte line a miss falls in);
- ``hnone``: ``ld.global`` (no prefetch hint: 32-byte sectors);
- ``na``: ``ld.global.L1::no_allocate.L2::256B`` (no L1 allocation).

    PYTHONPATH=. python3 benchmarks/l2_hint_trees.py out
    # on the device, carrying out (about 35 s a tree):
    cd benchmarks && TREE_AB_VARIANT_TIMEOUT=70 PYTHONPATH=..:. python3 -u few_heads_ab.py $OUT/ab.json \\
        m1=../out/main h128=../out/h128 hnone=../out/hnone na=../out/na m2=../out/main
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

#: The commit the trees were archived from (main when they were timed; from 331888c on, the hint is the table's
#: ``l2_prefetch`` and the loads' asm is built by ``gluon_fp8._ld_row_chunk``, so later commits have no such text).
BASE = "19e1b03"
#: The kernel file whose load asm each variant rewrites, relative to a tree.
KERNEL = os.path.join("mla_sink", "kernels", "gluon", "gluon_fp8.py")
#: The qualifier of main's two hinted loads (16 and 8 bytes a lane).
MAIN_QUALIFIER = "@p ld.global.L2::256B.v"
#: Each tree -> its edits of :data:`KERNEL` (both hinted loads; ``tree_ab.edited_tree`` checks that there are two).
VARIANTS = {name: [(MAIN_QUALIFIER, qualifier, 2)] for name, qualifier in
            {"main": MAIN_QUALIFIER, "h128": "@p ld.global.L2::128B.v", "hnone": "@p ld.global.v",
             "na": "@p ld.global.L1::no_allocate.L2::256B.v"}.items()}


def main(out_dir: str = "out", commit: str = BASE) -> None:
    """``out_dir/NAME`` for each of :data:`VARIANTS`: ``commit`` archived, its two hinted loads given the variant's
    qualifier (``tree_ab.build_trees``), each tree printed.

    Raises:
        ValueError: the kernel no longer has exactly two hinted loads (the variants would not be what they say).
    """
    build_trees(commit, out_dir, KERNEL, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
