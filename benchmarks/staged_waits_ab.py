"""A/B of the sixty-fifth session's staged score waits (issue #12): every V3.2 launch's score wgmmas (the RoPE's and
the four latent tiles', issued together) are waited for one group at a time, and each tile's scaled scores are added
as soon as its group is done, while the later tiles' wgmmas still run (same arithmetic in the same order, so outputs
are bitwise equal). Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data through the
library, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the
first one's.

    PYTHONPATH=..:. python3 -u staged_waits_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 32, 64), ("fp8_ds_mla", 32, 2), ("fp8_ds_mla", 16, 256),
         ("fp8_ds_mla", 16, 64)]


run_variant, main = case_script("staged_waits_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
