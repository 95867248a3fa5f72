"""Timing of the forty-ninth session's ablation trees (``consumer_ablation_trees.py``): a bf16 warm-up case, V3.2 at
H=32, T = 256 and 64
(the ``ds_mla_h32`` row, the column split), bf16 at H=32 T=256 as the control the trees do not touch, and V3.2 at
H=16 T=256 (the alternate blocks: only ``nomax`` and a tree of the P tiles change it). Each variant
a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; the
ablations' outputs differ from main's by design.

    cd benchmarks && PYTHONPATH=..:. python3 -u consumer_ablation_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

#: bf16 H=32 T=64 first: the first case a fresh process times reads slow (forty-ninth session: 89 against 81 us), so
#: it is a warm-up that no tree changes
CASES = [("bf16", 32, 64), ("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("bf16", 32, 256), ("fp8_ds_mla", 16, 256)]

run_variant, main = case_script("consumer_ablation_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
