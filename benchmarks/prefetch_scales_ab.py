"""A/B of the forty-eighth session's ``prefetch_scales`` (tables/gluon_fp8.yaml; trees from
``prefetch_scales_trees.py``), on the cases it can move and their bf16 controls - V3.2 at H = 16 / 32, T = 2 / 64 /
256 and bf16 at H = 16 / 32, T = 256 - kept short for a device call with little time left (few_heads_ab.py runs the
whole 18-case grid). Each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed,
sinks on, topk 2048, bf16 q; every variant's ``out`` compared with the first one's.

    cd benchmarks && PYTHONPATH=..:. python3 -u prefetch_scales_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", h, t) for h in (32, 16) for t in (256, 64, 2)] + [("bf16", 32, 256), ("bf16", 16, 256)]

run_variant, main = case_script("prefetch_scales_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
