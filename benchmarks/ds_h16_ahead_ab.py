"""A/B of the seventy-second session: V3.2 (``fp8_ds_mla``) at 16 heads with two producers of 32-row steps that keep
their next step in flight (``producer_ahead``, row ``ds_mla_h16`` with ``producers: 2, producer_rows: 32,
producer_regs: 88``), against main's one whole-block producer; V3.2 H=32 T=256 and bf16 H=16 T=256 as controls the
change does not touch. Each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2
flushed, sinks on, topk 2048, bf16 q; outputs compared with the first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_h16_ahead_ab.py OUT.json m1=../out/new h16a=../out/h16a ...
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 16, 256), ("fp8_ds_mla", 16, 64), ("fp8_ds_mla", 16, 128), ("fp8_ds_mla", 32, 256),
         ("bf16", 16, 256)]

run_variant, main = case_script("ds_h16_ahead_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
