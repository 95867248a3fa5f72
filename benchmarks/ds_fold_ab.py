"""A/B of V3.2 rows with the tile scales folded into the producer's tiles (twenty-fifth session, 2026-12-03;
``benchmarks/gluon_fp8_ds_fold_probe.patch``): the fp8 cases of :mod:`few_heads_ab` at T = 64 and 256 only, each
variant a tree run in a child process (:mod:`tree_ab`), outputs compared with the first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_fold_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, h, t) for h in (16, 32) for t in (64, 256) for kv in ("fp8_e4m3", "fp8_ds_mla")]


run_variant, main = case_script("ds_fold_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
