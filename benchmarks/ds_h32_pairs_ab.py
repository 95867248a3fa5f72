"""A/B of the thirty-fourth session (2026-12-03): V3.2 rows at 17-32 heads on the alternate scores (both consumers
compute scores, each of its own block of a pair, and each accumulates half of ``O^T``; ``tables/gluon_fp8.yaml``
path ``alternate_scores``) with the tile scores chained (``gluon_fp8._ds_scores_chained``: at most two tile
accumulators in flight, so each consumer fits in 200-208 registers without spilling, AOT sm90), against the column
split they ran on (the first consumer's scores chain sets its period). Variants: ``pairs`` the unsplit launches
only, ``pairs_split`` split launches too. Each variant a tree in a child process (:mod:`tree_ab`), same data,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q. Not kept (slower: BENCHMARKS.md, thirty-fourth session).
The trees (``main`` = 8ad0772; ``pairs`` = main with ``gluon_fp8_ds_pairs.patch``; ``pairs_split`` = ``pairs`` with
the row ``ds_mla_h32`` of ``tables/gluon_fp8.yaml`` on the same path and params as ``ds_mla_h32_unsplit``)::

    git archive 8ad0772 mla_sink dispatch tables pyproject.toml | tar -x -C out/main
    cp -r out/main/. out/pairs && (cd out/pairs && patch -p1 < ../../benchmarks/gluon_fp8_ds_pairs.patch)
    cd benchmarks && PYTHONPATH=..:. python3 -u ds_h32_pairs_ab.py OUT.json main=../out/main pairs=../out/pairs \
        pairs_split=../out/pairs_split main2=../out/main pairs2=../out/pairs
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 32, t) for t in (256, 128, 64)] + [("fp8_ds_mla", h, 256) for h in (24, 17)]
         + [("fp8_e4m3", 32, 256), ("bf16", 32, 256)])

run_variant, main = case_script("ds_h32_pairs_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
