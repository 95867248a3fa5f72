"""The trees of the fifty-seventh session's prepared fp16 ring for V3.2 rows at 16 heads (issue #12; BENCHMARKS.md,
fifty-seventh session, section 6), each a ``git archive`` of :data:`BASE` (main) with its patch:

- ``main``: main's kernels;
- ``f16r``: main with benchmarks/gluon_fp8_ds_fp16_ring.patch - on the alternate blocks (the row ``ds_mla_h16``:
  V3.2 CTAs of more than two blocks at H <= 16) the producer converts the codes into an fp16 ring with one ``cvt`` a
  pair (its loop 376 instructions against 761; the consumers' 1257 / 1282 against 757 / 782); q's latent part is scaled per head into fp16 as for e4m3 and its
  RoPE, times the same power of two, stays bf16 with the rows' RoPE; ``P_t`` is stored in fp16 in per-tile,
  per-head units (``_next_unit``: a running bound on ``|P * scale_t|``, its block maxima by ``_tile_maxima``, the
  block's softmax maximum by ``_ids_max``), each tile's ``O^T`` moved between units with ``alpha`` and taken out of
  its unit before the merge; the per-head score scale is applied to each score accumulator before its tile scale
  (``_ds_scores_scaled``: with q scaled up, ``s_t * scale_t`` first overflowed on a tile scale of 2^120 where the
  true score does not - found by a review, helper-121, as was the unit factor's exponent reaching 128). Registers 208 / 88 (second consumer / producer). AOT sm90: 16-24 bytes spilled (one
  or two ``STL`` / ``LDL`` a block, the row sum's reduction); the 32-head and e4m3 kernels unchanged (no spill).
  ``tests/test_gluon_tables.py::test_the_measured_arrangements`` and the no-spill test fail on this tree by design
  (the row's registers and the spill). Its float64 emulation (benchmarks/fp16_ring_units_emulation.py) puts its
  ``O^T`` 5-10x closer to the exact sum than main's bf16 ``P_t`` on every adversarial case.

The one-``cvt`` ceiling probe (benchmarks/gluon_fp8_one_cvt_probe.patch, outputs wrong) took 164.7 against
171.2-172.3 µs at V3.2 H=16 T=256 on an H100; the H200 case at stake is V3.2 H=16 T=256 (157.4 against bf16's 156.1
in the fifty-sixth session's grid).

    PYTHONPATH=. python3 benchmarks/fp16_ring_trees.py out
    # on the device, carrying out and .peers:
    cd benchmarks && PYTHONPATH=..:. python3 -u few_heads_ab.py $OUT/ab.json m1=../out/main f16r=../out/f16r \
        m2=../out/main f16r2=../out/f16r
    cd out/f16r && PYTHONPATH=. python3 -m pytest -q -m gpu tests/test_gluon_fp8_gpu.py tests/test_fp8_ds_mla_gpu.py \
        -k "ds_mla and not 32"

Outputs differ from ``m1``'s by ``P_t``'s rounding (fp16 in units against bf16); keep it only if the V3.2 GPU tests
pass and V3.2 at H <= 16 is faster by more than the two main runs' spread.
"""

from __future__ import annotations

import sys

from tree_ab import trees_main

#: The commit the trees are archived from (main; the patch applies to it).
BASE = "HEAD"
#: ``{tree: patches}``.
TREES = {"main": [], "f16r": ["benchmarks/gluon_fp8_ds_fp16_ring.patch"]}

main = trees_main(TREES, BASE)

if __name__ == "__main__":
    main(*sys.argv[1:])
