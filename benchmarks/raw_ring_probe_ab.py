"""Probes of the thirty-sixth session's raw ring (2026-12-04, ``raw_ring_ab.py``) on its first tree (``raw`` =
c586c66 of ``wip/raw-ring``): the same kernel with the second consumer's ``V_t^T`` operands not decoded (zeros:
``noV``) or the first consumer's ``K_t`` operands not decoded (``noK``), outputs wrong, to see which decode sets the
period. Same harness as ``raw_ring_ab.py``::

    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_probe_ab.py OUT.json main=../out/main raw=../out/raw \
        noV=../out/raw_noV noK=../out/raw_noK
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64)]

run_variant, main = case_script("raw_ring_probe_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
