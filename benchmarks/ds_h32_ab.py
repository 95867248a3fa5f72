"""A/B of V3.2 rows at 32 heads against bf16 (twenty-sixth session, 2026-12-03): the column split's first consumer
with each block's RoPE copied two blocks ahead, and with the tile scales loaded by the second consumer. Each
variant is a tree run in a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph replay,
L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_h32_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, 32, t) for t in (2, 64, 256) for kv in ("bf16", "fp8_ds_mla")]


run_variant, main = case_script("ds_h32_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
