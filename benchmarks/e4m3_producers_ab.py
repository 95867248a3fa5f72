"""A/B of the seventy-sixth session: e4m3 (``fp8_e4m3``) launches on the column split with two producers of 32-row
steps (88 registers, the second consumer 112), as V3.2's long ranges and e4m3's unsplit 32-head launches have them.
Tree ``es``: the split rows ``e4m3_h16_split`` and ``e4m3_h32_split`` (one producer of whole-block steps, 152
registers, on main); tree ``ec``: the unsplit 16-head row ``e4m3_h16`` on the column split (the alternate blocks
with two whole-block producers on main). T = 32 / 64 are split launches at 16-32 heads (4 / 2 splits on 132 SMs at
H=16), T = 128 / 256 unsplit; bf16 H=16 T=64 is the bar's reference. Each variant a tree in a child process
(:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; outputs compared with the
first variant's.

    cd benchmarks && PYTHONPATH=..:. python3 -u e4m3_producers_ab.py OUT.json m1=../out/m76 es=../out/es ...
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_e4m3", 16, 256), ("fp8_e4m3", 16, 128), ("fp8_e4m3", 16, 64), ("fp8_e4m3", 16, 32),
         ("fp8_e4m3", 32, 64), ("fp8_e4m3", 32, 32), ("fp8_e4m3", 24, 64), ("bf16", 16, 64)]

run_variant, main = case_script("e4m3_producers_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
