"""A/B of the sixty-ninth session's next-wave prefetch (issue #12): once a producer has filled its last ring stage,
it asks the L2 (``prefetch.global.L2``) for the ids and rows of the first blocks of the CTA launched one wave (the
SMs' count) after its own, so that the second wave's first hand-overs (about 4 us after a CTA's entry, fifty-sixth
session's timeline) read the L2 instead of HBM. Patch against main: ``gluon_fp8_next_wave_lines.patch`` (tree
``nw``: two blocks; ``nw4`` the same with four, ``NEXT_WAVE_BLOCKS``). Each variant is a tree run in a child process
(:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q;
every variant's ``out`` is compared with the first one's. T=64 is one wave (the prefetch's cost alone).

    PYTHONPATH=..:. python3 -u next_wave_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 200), ("fp8_ds_mla", 16, 256),
         ("fp8_e4m3", 32, 256), ("fp8_e4m3", 16, 256)]


run_variant, main = case_script("next_wave_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
