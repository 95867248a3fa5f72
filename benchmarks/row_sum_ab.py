"""A/B of the thirtieth session (2026-12-03): the few-heads fp8 kernel's row sum deferred (each consumer adds its
own ``P^T`` elements per thread and sums over ids once at the end, instead of a reduction across its four warps
every block) and the column-split consumers at 16 heads for split launches (one-block splits at T <= 2), at 16 and
32 heads, T = 1 / 2 / 4 / 64 / 256 (``AB_CASES=rows``: also 8 and 16; ``AB_CASES=heads``: 24 and 32 heads at
T = 1-8, two 16-head CTAs a token at T <= 6), bf16 / e4m3 / V3.2 caches. Each variant is a tree run in a child process
(:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16
q; every variant's ``out`` is compared with the first one's.

    cd benchmarks && PYTHONPATH=..:. python3 -u row_sum_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import os
import sys

from tree_ab import case_script

KV = ("bf16", "fp8_e4m3", "fp8_ds_mla")
#: First run: T = 1 / 2 / 4 / 64 / 256; ``AB_CASES=rows`` (second run, the table's rows): also T = 8 and 16.
T_VALUES = (1, 2, 4, 8, 16, 64, 256) if os.environ.get("AB_CASES") == "rows" else (1, 2, 4, 64, 256)
CASES = [(kv, h, t) for h in (16, 32) for t in T_VALUES for kv in KV]
if os.environ.get("AB_CASES") == "heads":  # third run: 17-32 heads in two 16-head CTAs a token at T <= 8
    CASES = ([(kv, h, t) for h in (24, 32) for t in (1, 2, 4, 8) for kv in KV]
             + [(kv, 32, 64) for kv in KV] + [(kv, 16, t) for t in (2, 256) for kv in KV])

run_variant, main = case_script("row_sum_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
