"""A/B of the few-heads fp8 routes against bf16 (twelfth session, 2026-12-01): issue #12's last bar, "at H=16
and 32 the fp8 cases faster than bf16 at the same shape". Each variant is a tree run in a child process
(:mod:`tree_ab`) on the same data through the library (``mla_sink.sparse_mla_decode``, the plan's own route
and splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared
with the first one's (max abs difference). The cases: bf16, e4m3 (per-tensor) and the 656-byte V3.2 cache at
H in {16, 32} x T in {2, 64, 256}.

    PYTHONPATH=. python3 -u benchmarks/few_heads_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, h, t) for h in (16, 32) for t in (2, 64, 256) for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla")]


run_variant, main = case_script("few_heads_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
