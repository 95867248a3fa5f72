"""A/B of the thirty-first session (2026-12-03): gluon_fp8's column-split first consumer loads the next block's ids
and V3.2 tile scales while it computes this block (``scales_ahead`` in ``tables/gluon_fp8.yaml``, constexpr
``SCALES_AHEAD``), instead of at the start of each block, where that dependent load (ids, then the scales at their
rows) sits on a two-block CTA's critical path. ``ahead``: on the short rows (``ds_mla_h16_short``,
``ds_mla_h32_short``: CTAs of one or two blocks); ``aheadall``: also ``ds_mla_h32`` (32-head blocks, long ranges).
V3.2 at H = 16 / 32, T = 1 / 2 / 4 (and 64 / 256 at 32 heads), bf16 controls; each variant a tree in a child
process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q.

    cd benchmarks && PYTHONPATH=..:. python3 -u scales_ahead_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 16, t) for t in (1, 2, 4)] + [("fp8_ds_mla", 32, t) for t in (1, 2, 4, 64, 256)]
         + [("bf16", 16, 2), ("bf16", 32, 2)])

run_variant, main = case_script("scales_ahead_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
