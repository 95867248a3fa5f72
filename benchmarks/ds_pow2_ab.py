"""A/B of the thirty-fifth session (2026-12-04): V3.2 rows at 17-32 heads decoded into bf16 by the producer
(codes x tile scale, exact for power-of-two scales: ``tables/gluon_fp8.yaml`` param ``pow2_decode``,
``gluon_fp8.POW2_DECODE``), so the consumers run e4m3's single score accumulator and one ``P^T`` instead of one
accumulator and one ``P_t^T`` per tile scale. Variants: ``p2pairs`` unsplit launches on the alternate scores (184 /
144 registers), split ones and the short rows on the column split, all decoded; ``p2cols`` the column split decoded
(the short rows as they were). Each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph
replay, L2 flushed, sinks on, topk 2048, bf16 q, power-of-two scales. Not kept (slower: BENCHMARKS.md,
thirty-fifth session). The trees (``main`` = 8852abe; ``p2pairs`` and ``p2cols`` = main with
``gluon_fp8_ds_pow2.patch`` and the rows of ``tables/gluon_fp8.yaml`` edited as above; the diagnostic trees
``p2noload`` and ``p2nomul`` = ``p2pairs`` with the producer's scale loads replaced by 1.0, or its multiply removed:
wrong values, timing only)::

    git archive 8852abe mla_sink dispatch tables pyproject.toml | tar -x -C out/main
    cp -r out/main/. out/p2pairs && (cd out/p2pairs && patch -p1 < ../../benchmarks/gluon_fp8_ds_pow2.patch)
    cd benchmarks && PYTHONPATH=..:. python3 -u ds_pow2_ab.py OUT.json main=../out/main p2pairs=../out/p2pairs \
        p2cols=../out/p2cols main2=../out/main p2pairs2=../out/p2pairs
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 32, t) for t in (256, 64, 2)] + [("fp8_ds_mla", 24, 256), ("fp8_ds_mla", 17, 64)]
         + [("fp8_e4m3", 32, 256), ("bf16", 32, 256)])

run_variant, main = case_script("ds_pow2_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
