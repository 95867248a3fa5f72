"""The trees of the fifty-sixth session's five prepared changes for the H200's T=256 cases (issue #12; BENCHMARKS.md,
fifty-sixth session, section 7), each a ``git archive`` of :data:`BASE` (main) with its patch:

- ``main``: main's kernels;
- ``se2``: main with benchmarks/gluon_fp8_early_sinks.patch - the sinks loaded at entry by the consumer that applies
  them on the alternate blocks (``_consumer``'s merge: V3.2 and e4m3 at 16 heads, unsplit) and on the alternate
  scores (``_consumer_pairs``: e4m3's unsplit 17-32-head launches), as the column split's first consumer has loaded
  them since the fifty-fifth session (there with its 16-byte stores, -2.9 µs at V3.2 H=32 T=256 on an H100); the
  two H200 cases at bf16's time besides the missed bar, e4m3 H=32 and V3.2 H=16 at T=256, take these consumers.
  AOT sm90: no spill (tests/test_gluon_fp8_ptxas.py);
- ``tm``: main with benchmarks/gluon_fp8_first_one_tile_on_main.patch (the fifty-third session's
  benchmarks/gluon_fp8_first_one_tile.patch, rebased on main) - ``first_one_tile`` on ``ds_mla_h32``: the column
  split's first consumer accumulates one V3.2 value tile and the second three. On the H100 it loses about 1.2 µs
  at V3.2 H=32 T=256 (fifty-fifth and fifty-sixth sessions); on the H200 the first consumer's chain alone sets the
  period (timeline: it waits 0.064 µs a block for the producer), so it is timed there;
- ``ov``: main with benchmarks/gluon_fp8_factor_early.patch - on V3.2's long unsplit column-split ranges
  (``meta_by_second``) the first consumer hands the output factor (row sum, LSE, sinks) to the second in its last
  block, once that block's ``P`` is stored and before its own ``P V``, instead of after it: the H200 timeline
  (BENCHMARKS.md, fifty-sixth session, section 6) has the second consumer wait 0.93 µs for the factor after its last
  block, of which the first consumer's last ``P V`` (0.64) is no input to the factor. AOT sm90: no spill; the first
  consumer's loop holds the handover's code behind a branch (1332 instructions from the loop's head to its back
  branch, 762 on main), run once a CTA; split launches keep main's epilogue (with it they spilled 16 bytes);
- ``p2``: main with benchmarks/gluon_fp8_p_by_second.patch - on the same launches the first consumer stores its own
  two ``P_t`` (tiles 0 and 1) and ``P`` itself in fp32 over tiles 2 and 3; the second consumer, once ``P`` is
  ready, reads it and its two tile scales (its own copy in ``meta_by_second``'s ring, where block i's stay until it
  releases block i) and writes ``P_t`` for tiles 2 and 3 over it (the same fp32 products rounded once to bf16: outputs
  bitwise equal). Two of the four ``P_t`` leave the chain that sets the H200's period (section 6); the second
  consumer, which waits 0.16 µs a block for ``P`` and spends 0.8 on its ``P V`` in a 2.46 µs period, takes them.
  The fp32 tile's 8-byte pairs are swizzled by row (the accumulator layout's 8 rows a warp sit 128 bytes apart).
  AOT sm90: the first consumer's loop 716 instructions against 762, the second's 373 against 298; no spill
  (sinks on; unsplit, 2 and 16 splits, ``topk_length``, 19 and 24 heads) with the second consumer at 128 registers
  (the first 224; at 104 it spilled 56 bytes, at 112 24, at 120 16);
- ``fb``: main with benchmarks/gluon_fp8_first_half_by_second.patch - on the same launches the producer gathers and
  decodes rows 0-31 of a CTA's first block and the second consumer, idle until that block's ``P``, rows 32-63
  (16 rows a step; its arrival on a third slot of ``meta_by_second``'s barriers, which the first consumer waits for
  before its first block): the first block's decode, 1.38 µs of the 4.16 µs first hand-over on the H200, halved. So
  that its half does not land after the producer's, the second consumer issues the ids of its half and of the first
  two blocks' masks, scales and RoPE together, then their dependent loads together
  (``_second_prologue_with_half``, on ranges of two blocks or more). AOT sm90: no spill (unsplit, 2 splits,
  ``topk_length``, 19 heads); the per-block loops as on main.

    PYTHONPATH=. python3 benchmarks/h200_edge_trees.py out
    # on an H200, carrying out and .peers (about 40 s a tree):
    cd benchmarks && PYTHONPATH=..:. python3 -u few_heads_ab.py $OUT/ab.json m1=../out/main se2=../out/se2 \
        tm=../out/tm ov=../out/ov p2=../out/p2 fb=../out/fb m2=../out/main

Keep a tree only if every output is bitwise equal to ``m1``'s and it is faster where it is meant to be (``se2``: e4m3
H=32 and V3.2 H=16 at T=256; ``tm``, ``ov``, ``p2`` and ``fb``: V3.2 H=32 at T = 64 and 256) by more than the two main
runs' spread.
"""

from __future__ import annotations

import os
import sys

from tree_ab import trees_main

#: The commit the trees are archived from (main; the patches apply to it).
BASE = "HEAD"
#: Each tree -> the patches applied to an archive of the base.
TREES = {"main": (), "se2": (os.path.join("benchmarks", "gluon_fp8_early_sinks.patch"),),
         "tm": (os.path.join("benchmarks", "gluon_fp8_first_one_tile_on_main.patch"),),
         "ov": (os.path.join("benchmarks", "gluon_fp8_factor_early.patch"),),
         "p2": (os.path.join("benchmarks", "gluon_fp8_p_by_second.patch"),),
         "fb": (os.path.join("benchmarks", "gluon_fp8_first_half_by_second.patch"),)}


main = trees_main(TREES, BASE)


if __name__ == "__main__":
    main(*sys.argv[1:])
