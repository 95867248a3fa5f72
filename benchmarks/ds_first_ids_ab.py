"""A/B of the thirty-fifth session (2026-12-04): on the column split, V3.2's first consumer loads the first block's
ids (for its tile scales) and the first two blocks' RoPE ids before it stages q, and each later block's ids a block
ahead (``gluon_fp8._consumer_cols``), instead of after q: those dependent loads no longer wait a round trip behind
q's. The target is V3.2 H=32 T=2 (12.0-12.2 against bf16's 11.5-11.9 us). Kept on CTAs of one or two blocks only
(the ``early_ids`` param of the rows ``ds_mla_h16_short`` and ``ds_mla_h32_short`` of ``tables/gluon_fp8.yaml``):
on long id ranges it lost (BENCHMARKS.md, thirty-fifth session). Each variant a tree in a child process
(:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q. The trees (``main`` =
114c6eb; ``early`` = main with the change on every V3.2 column-split launch, the kernel of the kept rows: AOT sm90,
their SASS is the kept tree's, instruction for instruction)::

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_first_ids_ab.py OUT.json main=../out/main early=../out/early \
        main2=../out/main early2=../out/early
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 32, t) for t in (1, 2, 4, 64, 256)] + [("fp8_ds_mla", 16, 2), ("fp8_ds_mla", 24, 2),
                                                                 ("bf16", 32, 2), ("fp8_e4m3", 32, 2)])

run_variant, main = case_script("ds_first_ids_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
