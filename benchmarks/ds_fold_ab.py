"""A/B of V3.2 rows with the tile scales folded into the producer's tiles (twenty-fifth session, 2026-12-03;
``benchmarks/gluon_fp8_ds_fold_probe.patch``): the fp8 cases of :mod:`few_heads_ab` at T = 64 and 256 only, each
variant a tree run in a child process (:mod:`tree_ab`), outputs compared with the first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_fold_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

CASES = [(kv, h, t) for h in (16, 32) for t in (64, 256) for kv in ("fp8_e4m3", "fp8_ds_mla")]


def run_variant(variant: str, dump: str) -> dict:
    """Time every case with the ``mla_sink`` on the path (the timing loop of :mod:`seesaw_wgmma_ab`)."""
    import seesaw_wgmma_ab
    return seesaw_wgmma_ab.run_variant(variant, dump, CASES)


def main(path: str, *variants: str) -> None:
    """Run each ``NAME=TREE`` variant in a child process (``tree_ab.cases_report``) and write the report."""
    from tree_ab import cases_report
    cases_report(path, "ds_fold_ab", CASES, variants)


if __name__ == "__main__":
    main(*sys.argv[1:])
