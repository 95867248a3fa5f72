"""A/B of the sixty-first session's two producers on an H200 (issue #12, seventieth session): the table row
``ds_mla_h32`` as on main (two producers of 88 registers, 32-row steps, the second consumer 112) against the same
kernel with the row's parameters before the sixty-first session (one producer of 152 registers, whole-block steps,
the second consumer 104: tree ``p1``, the row edited in ``tables/gluon_fp8.yaml``). Each variant is a tree run in
a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks on,
topk 2048, bf16 q; every variant's ``out`` is compared with the first one's. The other cases do not read the row
(the trees' kernels are the same there): their spread is the runs' own; the bf16 cases are the bar's reference
(fp8 faster than bf16 at H = 16 and 32).

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
