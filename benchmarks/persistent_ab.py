"""A/B of the sixty-fourth session's persistent V3.2 launches at 17-32 heads (issue #12; not kept: the patch is
``gluon_fp8_persistent.patch``): one CTA an SM over an equal run of every token's blocks, tokens cut by a run boundary
merged in the kernel, against main's one CTA a token. Cases at and beside the SM count (the persistent
launches: T >= SMs), V3.2 below it (the same kernel in both trees: the run's noise), e4m3 and bf16 at H=32 T=256 (not
touched). Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data through the library,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u persistent_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_e4m3", 32, 256), ("bf16", 32, 256),
         ("fp8_ds_mla", 32, 132), ("fp8_ds_mla", 32, 200), ("fp8_ds_mla", 24, 256), ("fp8_ds_mla", 32, 512),
         ("fp8_ds_mla", 32, 128)]


run_variant, main = case_script("persistent_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
