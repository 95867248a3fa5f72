"""A/B of the sixty-fourth session's step prefetch (issue #12; not kept: the patch is
``gluon_fp8_step_prefetch.patch``): on V3.2 rows at 32 heads the two producers step half blocks (32 rows), and a
block's second step is gathered only after its first is stored, once the stage is free; the variant asks the L2 for
the second step's rows (``prefetch.global.L2``, five lines a row) right after the first step's loads, before the
stage wait. Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data through the library,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u step_prefetch_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64)]


run_variant, main = case_script("step_prefetch_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
