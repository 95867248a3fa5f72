"""A/B of the forty-ninth session's producer-gathered RoPE at V3.2 H=32 (the ``ds_mla_h32`` row, the column split):
the consumer ablations (``consumer_ablation_ab.py``) put the first consumer's loads on its period, and at 32 heads the
producer has slack (2.40 against 2.88 µs a block), so the tree ``prope`` (c698ba9 with the producer gathering the bf16
RoPE on the column split instead of the first consumer's cp.async copies) is timed against main. A bf16 case first
warms the GPU's clocks (the first case of a fresh process measured up to 15% slow). Each variant a tree in a child
process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q.

    cd benchmarks && PYTHONPATH=..:. python3 -u producer_rope_ab.py OUT.json m1=../out/main r=../out/prope \
        m2=../out/main

(``out/prope``: c698ba9 with benchmarks/gluon_fp8_producer_rope.patch; or ``out/pr`` from ``producer_rope_trees.py``,
the same sm90 SASS.)
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("bf16", 32, 64), ("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("bf16", 32, 256)]

run_variant, main = case_script("producer_rope_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
