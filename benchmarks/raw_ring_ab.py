"""A/B of the thirty-sixth session (2026-12-04): V3.2 rows at 17-32 heads on the raw ring (``raw_ring`` in
``tables/gluon_fp8.yaml``, ``gluon_fp8._consumer_raw``): the ring holds the rows' bytes as the cache has them (three
stages), copied by cp.async, and the consumers decode each code tile from shared memory into the register operand
of their wgmmas, against the column split. Each variant a tree in a child process (:mod:`tree_ab`), same data,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q. Not kept (BENCHMARKS.md, thirty-sixth session); the
kernel is ``gluon_fp8_raw_ring.patch`` (against 969f9bf), the trees are ``git archive`` of the branch ``wip/raw-ring``
(``main`` = 969f9bf; ``raw`` = c586c66: 1-byte ``V_t^T`` loads, bf16 ``P V``; ``raw2`` = 4827f2e: 32-bit ``V_t^T``
loads of permuted rows, fp16 ``P V`` with power-of-two tile units, 224 / 24 registers; ``raw3`` = d68b074: the tile
scales and units computed while the first score wgmmas run; ``raw3h16`` = raw3 with 16-head V3.2 launches of more than
two blocks on the raw ring too, 200 / 48 registers). Runs 1 and 2 timed the first eight cases (before the 16-head
cases were added)::

    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_ab.py OUT.json main=../out/main raw=../out/raw
    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_ab.py OUT.json main=../out/main raw2=../out/raw2
    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_ab.py OUT.json main=../out/main raw3=../out/raw3 \
        raw3h16=../out/raw3h16
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 32, t) for t in (256, 64, 8)] + [("fp8_ds_mla", 24, 256), ("fp8_ds_mla", 16, 256),
                                                          ("fp8_ds_mla", 16, 64), ("bf16", 32, 256), ("bf16", 16, 256),
                                                          ("fp8_e4m3", 32, 256), ("bf16", 32, 64)])

run_variant, main = case_script("raw_ring_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
