"""A/B of the e4m3 split policy at 17-32 heads and small T (twenty-fifth session, 2026-12-03): 64-id splits
(``min_ids_per_split: 64`` in ``tables/triton_tuning.yaml`` row ``sm90_fp8_h32``) against 128-id ones, each variant a
tree run in a child process (:mod:`tree_ab`) through the library, CUDA-graph replay, L2 flushed, sinks on, topk
2048, bf16 q; bf16 beside it for the bar (unchanged by the row).

    cd benchmarks && PYTHONPATH=..:. python3 -u e4m3_h32_splits_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, 32, t) for t in (2, 3, 4, 6, 8, 16) for kv in ("bf16", "fp8_e4m3")]


run_variant, main = case_script("e4m3_h32_splits_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
