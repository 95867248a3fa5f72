"""A/B of the sixty-first session's two-producer trees (:mod:`two_producers_trees`; issue #12): the 32-head cases
the edited rows serve and the 16-head ones they do not (the run's noise), against bf16 at H=32 T=256. Each variant
is a tree run in a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2
flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u two_producers_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("bf16", 32, 256), ("fp8_e4m3", 32, 64), ("fp8_e4m3", 32, 256), ("fp8_ds_mla", 32, 2),
         ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 256), ("fp8_e4m3", 16, 256), ("fp8_ds_mla", 16, 256),
         ("bf16", 16, 256), ("fp8_ds_mla", 16, 64), ("fp8_e4m3", 16, 64), ("bf16", 32, 64)]


run_variant, main = case_script("two_producers_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
