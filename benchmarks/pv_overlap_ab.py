"""A/B of the sixty-sixth session's change to the first consumer of V3.2 rows at 32 heads (issue #12): its half of a
block's ``P V`` issued and not waited for, so the next block's five score wgmmas follow it in the tensor pipe and
one wait covers both (``pl0``: ``P V`` issued after the next block's mask and scales are read; ``pl1``: before).
Patch against main: ``gluon_fp8_pv_overlap.patch`` (``pl1``). Each variant is a tree run in a child process
(:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q;
every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u pv_overlap_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 24, 256), ("fp8_ds_mla", 32, 128),
         ("fp8_e4m3", 32, 256)]


run_variant, main = case_script("pv_overlap_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
