"""A/B of the sixty-fifth session's two changes to the first consumer's chain on V3.2 rows at 32 heads (issue #12):
``sw``, the score wgmmas waited for one tile at a time, each tile's scaled scores added while the later tiles'
wgmmas run (same arithmetic, same order); ``p2``, the first consumer stores tiles 0-1's ``P_t^T`` and the fp32
``P^T`` (over tiles 2-3's slots), and the second consumer scales its own two tiles' ``P_t^T`` from it in place;
``both``. The same cases (with e4m3 H=16 T=256 added) timed the row-split producers (``rs``: each of the two
producers one half of every block's rows; ``rsp``, ``rss`` with ``p2`` or ``sw`` on top). Patches against main:
``gluon_fp8_staged_score_waits.patch``, ``gluon_fp8_p_tiles_by_second.patch``,
``gluon_fp8_row_split_producers.patch`` (none kept; BENCHMARKS.md, sixty-fifth session). Each variant is a tree
run in a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks
on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u chain_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 24, 256), ("fp8_ds_mla", 32, 2),
         ("fp8_e4m3", 16, 256)]


run_variant, main = case_script("chain_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
