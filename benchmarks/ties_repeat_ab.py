"""Run-to-run spread of the fp8-against-bf16 comparisons that the thirty-first session's grid left tied or missed
at 16 and 32 heads (H=16 T=256, H=32 T=256, H=32 T=2), three caches each: the same tree timed as several variants,
each in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q.

    cd benchmarks && PYTHONPATH=..:. python3 -u ties_repeat_ab.py OUT.json r1=TREE r2=TREE r3=TREE
"""

from __future__ import annotations

import sys

from tree_ab import case_script

KV = ("bf16", "fp8_e4m3", "fp8_ds_mla")
CASES = [(kv, h, t) for h, t in ((16, 256), (32, 256), (32, 2)) for kv in KV]

run_variant, main = case_script("ties_repeat_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
