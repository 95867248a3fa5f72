"""A/B of the thirty-third session (2026-12-03): on the column split's CTAs of one or two blocks (the ``*_short`` rows
of ``tables/gluon_fp8.yaml``), the first consumer computes only the scores, the softmax and ``P`` (for V3.2 the four
``P_t``) and the second accumulates all of ``P V`` (at 16-head CTAs all of ``O^T`` is 64 registers), so that the
first consumer's chain for a second block no longer waits for its own half of the first block's ``P V`` (the
variant ``so`` gave every short row ``SCORES_ONLY``; kept for V3.2's rows only, as the ``scores_only`` param of
``tables/gluon_fp8.yaml``). H = 16 / 24 / 32, T = 1 / 2 / 4, both fp8 caches, bf16 at the misses' shape; each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed,
sinks on, topk 2048, bf16 q.

    cd benchmarks && PYTHONPATH=..:. python3 -u scores_only_short_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([(kv, h, t) for h in (16, 24, 32) for t in (1, 2, 4) for kv in ("fp8_e4m3", "fp8_ds_mla")]
         + [("bf16", 32, 2), ("bf16", 16, 2)])

run_variant, main = case_script("scores_only_short_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
