"""A/B of the sixty-third session's ``second_score_tiles`` trees (issue #12): the second consumer computes part of
V3.2's scores at 32 heads, its part of the next block after this block's ``P V`` (branch
``wip/scores-by-second-early``) or before it (``wip/scores-by-second-before``, one ``part_ready`` a stage), with one
or two latent tiles. The 32-head cases the row serves, e4m3 at 32 heads (a row the trees do not change: the run's
noise) and bf16 at H=32 T=256. Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data
through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared
with the first one's.

    PYTHONPATH=..:. python3 -u scores_by_second_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("bf16", 32, 256), ("fp8_e4m3", 32, 256), ("fp8_ds_mla", 32, 2), ("fp8_ds_mla", 32, 64),
         ("fp8_ds_mla", 32, 256)]


run_variant, main = case_script("scores_by_second_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
