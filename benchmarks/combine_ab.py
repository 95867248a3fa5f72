"""A/B of the split-KV combine kernel at small T (twenty-fifth session, 2026-12-03): each variant a tree run in a
child process (:mod:`tree_ab`) on the same data through the library (``mla_sink.sparse_mla_decode``, the plan's own
route and splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; outputs compared with the first
variant's. Cases: bf16, per-tensor e4m3 and the 656-byte V3.2 cache at H in {16, 32, 64, 128} x T in {2, 16}.

    cd benchmarks && PYTHONPATH=..:. python3 -u combine_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, h, t) for h in (16, 32, 64, 128) for t in (2, 16) for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla")]


run_variant, main = case_script("combine_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
