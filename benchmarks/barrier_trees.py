"""The trees of the fifty-seventh session's barrier cuts (issue #12; BENCHMARKS.md, fifty-seventh session, section
8), each a ``git archive`` of :data:`BASE` (main) with its patches:

- ``main``: main's kernels;
- ``pr``: main with benchmarks/gluon_fp8_p_rings.patch - V3.2's four ``P_t^T`` tiles, four slices of one shared
  allocation on main, each get an allocation of their own (the column split: ``p_ring`` .. ``p_ring3``, a stage
  each per ring; the alternate blocks: four per consumer). Triton's shared-memory hazard analysis does not tell the
  slices of one allocation apart and put a ``bar.sync`` between every two of the four stores: three barriers a block
  in the column split's first consumer (9 a block on main, 6 here: PTX of V3.2 H=32 unsplit) and in each
  alternate-block consumer (13 on main, 10 here: H=16). The same values in the same wgmmas: outputs bitwise equal.
  The scores-only second consumer's four-tile ``P V`` rescales every tile before its wgmmas (``_quad_pv_rings``, no
  C7517). AOT sm90: no spill, the shared memory of main (tests/test_gluon_fp8_ptxas.py passes);
- ``pw``: ``pr`` with benchmarks/gluon_fp8_softmax_by_warps.patch - on the alternate blocks (V3.2 at H <= 16 on CTAs
  of more than two blocks, split or not; e4m3 at H <= 16 on unsplit launches of more than two blocks) the softmax's block maximum and (V3.2: not deferred) row sum over ids by per-warp
  reductions, one exchange through shared memory and one barrier each (``_ids_max``, ``_ids_sum``), in two
  allocations per consumer: 7 barriers a block against 10 in ``pr`` (the generic ``gl.max`` and ``gl.sum`` take two
  and three). The same maximum (e4m3 at 16 heads, whose row sum is deferred, stays bitwise equal); V3.2's row sum
  is added in another order (last-bit differences). AOT sm90: no spill. If kept, gate it on the table's
  ``warp_max`` (set on the alternate blocks' defaults) rather than always on.

- ``pa``: ``pr`` with benchmarks/gluon_fp8_p_ready_after_issue.patch - the column split's first consumer arrives on
  ``p_ready`` (V3.2, not scores-only) once its own half of ``P V`` is issued instead of right after the barrier
  behind the ``P_t`` stores: an arrive there made the compiler add a barrier before the next mbarrier wait
  (``_read_meta``'s) and one before the ``P V`` wgmmas; after the wgmmas it adds one, before the arrive. 5 barriers a
  block against 6 in ``pr`` (9 on main). The second consumer learns of ``P`` that much later (the meta read, the
  rescale, the issue). Outputs bitwise equal. AOT sm90: no spill.

- ``pm``: ``pa`` with benchmarks/gluon_fp8_meta_rings.patch - the column split's second consumer publishes the tile
  scales (``META_BY_SECOND``) into four allocations, a slot a stage each, instead of four rows of one: 5 barriers
  a block in its loop against 8. Outputs bitwise equal. AOT sm90: no spill.

A helper (helper-123) reviewed ``pa`` and ``pm`` by hand (what the second consumer reads after ``p_ready``, one arrive
a block on every path, no wait cycle between the two consumers and the producer, the slots' indexing; the e4m3 and
scores-only PTX byte-identical): no defect. On a ``pa`` or ``pm`` tree, benchmarks/cols_timeline.py's "P ready" stamp
(anchored on the old arrive's text) lands after the ``P_t`` barrier, not at the new arrive: re-anchor it before timing
those trees.

A helper (helper-122) reviewed ``pr`` and ``pw`` by hand (the tile each consumer reads in every arrangement, stage
indexing, the per-warp buffers' reuse across blocks, layouts, shared memory; forced arrangements compiled): no
defect; its two small points (one consumer arrangement a launch, asserted; a docstring) are in the patches.

    PYTHONPATH=. python3 benchmarks/barrier_trees.py out
    # on the device, carrying out and .peers (about 40 s a tree):
    cd benchmarks && PYTHONPATH=..:. python3 -u few_heads_ab.py $OUT/ab.json m1=../out/main pr=../out/pr \
        pw=../out/pw pa=../out/pa pm=../out/pm m2=../out/main
    cd out/pw && PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_gluon_fp8_gpu.py tests/test_fp8_ds_mla_gpu.py

Keep ``pr`` if its outputs are bitwise equal to ``m1``'s and V3.2 (H=32 on the column split, H=16 on the alternate
blocks) is faster by more than the two main runs' spread; ``pw`` if it is faster than ``pr`` the same way and the
fp8 GPU tests pass on it; ``pa`` and ``pm`` if each is faster than the one before at V3.2 H=32 and bitwise equal.
"""

from __future__ import annotations

import sys

from tree_ab import trees_main

#: The commit the trees are archived from (main; the patches apply to it in order).
BASE = "HEAD"
#: ``{tree: patches}``.
TREES = {"main": [], "pr": ["benchmarks/gluon_fp8_p_rings.patch"],
         "pw": ["benchmarks/gluon_fp8_p_rings.patch", "benchmarks/gluon_fp8_softmax_by_warps.patch"],
         "pa": ["benchmarks/gluon_fp8_p_rings.patch", "benchmarks/gluon_fp8_p_ready_after_issue.patch"],
         "pm": ["benchmarks/gluon_fp8_p_rings.patch", "benchmarks/gluon_fp8_p_ready_after_issue.patch",
                "benchmarks/gluon_fp8_meta_rings.patch"]}

main = trees_main(TREES, BASE)

if __name__ == "__main__":
    main(*sys.argv[1:])
