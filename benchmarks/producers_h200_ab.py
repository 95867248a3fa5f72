"""A/B of the V3.2 32-head arrangement on an H200 (issue #12, seventieth session, BENCHMARKS.md section 2), written
on the reading that there the gather is off the period and the first consumer's chain sets it (the seventy-first
session's probes found the gather's HBM latency about 11% of V3.2 H=32 T=256 on an H100; the H200 is not probed yet):
the table row ``ds_mla_h32`` as on main (two
producers of 88 registers, 32-row steps, the second consumer 112) against the row's parameters before the sixty-first
session (tree ``p1``: one producer of 152 registers, whole-block steps, the second consumer 104), the first consumer on
the scores only (``so``: ``scores_only``, the second consumer 176 registers) and the patches
``gluon_fp8_pv_overlap.patch`` (``pv``) and ``gluon_fp8_p_tiles_by_second.patch`` (``pt``), which shorten that chain.
Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph
replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's. The cases
that do not read the row keep main's kernel in ``p1`` and ``so`` (their spread is the runs' own); the bf16 cases are
the bar's reference (fp8 faster than bf16 at H = 16 and 32).

    PYTHONPATH=..:. python3 -u producers_h200_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 16, 256), ("fp8_e4m3", 32, 256),
         ("fp8_e4m3", 16, 256), ("bf16", 32, 256), ("bf16", 16, 256)]


run_variant, main = case_script("producers_h200_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
