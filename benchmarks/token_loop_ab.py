"""SPIKE A/B (eightieth session): the token loop against one CTA a token (issue #12). Each variant a tree in a child
process (:mod:`tree_ab`) on the same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q.

    PYTHONPATH=..:. python3 -u token_loop_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 200), ("fp8_ds_mla", 32, 512), ("fp8_ds_mla", 24, 256),
         ("fp8_ds_mla", 32, 128), ("fp8_ds_mla", 32, 64), ("bf16", 32, 256)]


run_variant, main = case_script("token_loop_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
