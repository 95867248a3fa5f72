"""A/B of the few-heads cases that sit at bf16's time on the H200 (fifty-sixth session, 2026-12-06): V3.2 at H=16
and 32 and e4m3 at H=32, T=256, with bf16 at both head counts beside them - the cases of :mod:`few_heads_ab` that a
short device call can still time. Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data
through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared
with the first one's (max abs difference).

    PYTHONPATH=. python3 -u benchmarks/edge_cases_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("bf16", 16, 256), ("fp8_ds_mla", 16, 256), ("bf16", 32, 256), ("fp8_e4m3", 32, 256), ("fp8_ds_mla", 32, 256)]


run_variant, main = case_script("edge_cases_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
