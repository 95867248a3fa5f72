"""A/B of the sixty-sixth session's split first block on V3.2 rows at 32 heads (issue #12): with two producers of
half blocks, block 0's two halves are gathered at once, one by each producer (``ready`` counting two arrivals, a whole
block's producer arriving twice), so that the first hand-over waits for one half-block step instead of two; the
producer's step is one helper (``_producer_step``) for every arrangement. Patch against main:
``gluon_fp8_split_first_block.patch`` (tree ``sf``). Each variant is a tree run in a child process (:mod:`tree_ab`)
on the same data through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's
``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u split_first_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 128), ("fp8_ds_mla", 24, 256),
         ("fp8_e4m3", 32, 256), ("fp8_e4m3", 16, 256)]


run_variant, main = case_script("split_first_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
