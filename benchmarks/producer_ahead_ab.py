"""A/B of the thirty-second session (2026-12-03): the column split's producer of 16-byte aligned V3.2 rows in half-block
steps whose gathers are issued two steps ahead, the gathered codes carried across the loop as packed 32-bit words
(``_producer_ahead`` in the patch ``benchmarks/gluon_fp8_producer_ahead.patch``; ``tables/gluon_fp8.yaml`` row
``ds_mla_h32`` with ``producer_rows: 32``), against main's whole-block steps whose loads are issued only after the
previous block's store. V3.2 at H=32, T = 64 / 256 (the row's long ranges); each variant a tree in a child process
(:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; outputs compared with the
first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u producer_ahead_ab.py OUT.json main=../out/main ahead=../out/ahead ...
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 256)]

run_variant, main = case_script("producer_ahead_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
