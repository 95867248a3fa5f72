"""A/B of the seventy-sixth session: V3.2 (``fp8_ds_mla``) at 16 heads and fewer on the 32-head column-split
arrangement (row ``ds_mla_h32``'s two producers of 32-row steps that keep their next step in flight, and the first
consumer's half of P V left in flight, at head_block 16: tree ``c16``, ``benchmarks/gluon_fp8_ds_h16_cols.patch``)
against main's alternate blocks with one whole-block producer; tree ``c16s`` keeps ``c16`` on unsplit launches and
gives split ones ``ds_mla_h32_split``'s parameters (no producer_ahead, no pv_overlap) at head_block 16. T = 16 / 32 /
64 are split launches at H=16 (8 / 4 / 2 splits on 132 SMs), T = 128 / 256 unsplit; bf16 H=16 is the bar's reference.
Each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk
2048, bf16 q; outputs compared with the first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_h16_cols_ab.py OUT.json m1=../out/m75 c16=../out/c16 ...
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 16, 16), ("fp8_ds_mla", 16, 32), ("fp8_ds_mla", 16, 64), ("fp8_ds_mla", 16, 128),
         ("fp8_ds_mla", 16, 256), ("fp8_ds_mla", 8, 256), ("bf16", 16, 64), ("bf16", 16, 256)]

run_variant, main = case_script("ds_h16_cols_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
