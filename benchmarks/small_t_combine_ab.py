"""A/B of small-T split calls (twenty-seventh session, 2026-12-03). First run: the combine's columns narrowed to 16
(``min_combine_block_d: 16`` on every row of ``tables/triton_tuning.yaml``, so a T=2 call's combine runs more,
narrower programs) and, with it, e4m3's 64-id splits at 17-32 heads (32 splits at T=2); ``AB_CASES=wide`` (second
run): the combine's first group of partials loaded with the LSEs, and the fp8 split size by token count (64-id
splits at T <= 2, 128-id ones from T=3) at 1-8 tokens and 16 / 32 heads, T = 2 / 64 at 64 / 128 heads;
``AB_CASES=combine`` (third run): the combine's change alone at T = 2 / 16 / 64 and 32 / 64 / 128 heads, each tree
twice; ``AB_CASES=h16`` (fourth run): at 16 heads and T = 1-64, e4m3 on gluon_fp8 at every split count (its
row's two-split limit lifted), also with 64-id splits at T <= 2, and bf16 on the padded seesaw; ``AB_CASES=t2``
(twenty-eighth session): the combine's tile at T = 1 / 2 / 4 and 16 / 32 heads (the two-token rows' heads and
columns per combine program). Each variant is a tree run
in a child process (:mod:`tree_ab`) on the same data through the library, CUDA-graph replay, L2 flushed, sinks on,
topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    cd benchmarks && PYTHONPATH=..:. python3 -u small_t_combine_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import os
import sys

from tree_ab import case_script

KV = ("bf16", "fp8_e4m3", "fp8_ds_mla")
if os.environ.get("AB_CASES") == "wide":
    CASES = ([(kv, h, t) for h in (16, 32) for t in (1, 2, 3, 4, 8) for kv in KV]
             + [(kv, h, t) for h in (64, 128) for t in (2, 64) for kv in KV])
elif os.environ.get("AB_CASES") == "h16":
    CASES = [(kv, 16, t) for t in (1, 2, 4, 8, 16, 64) for kv in KV]
elif os.environ.get("AB_CASES") == "t2":
    CASES = [(kv, h, t) for h in (16, 32) for t in (1, 2, 4) for kv in KV]
elif os.environ.get("AB_CASES") == "combine":
    CASES = [(kv, h, t) for h in (32, 64, 128) for t in (2, 16, 64) for kv in KV]
else:
    CASES = ([(kv, 32, t) for t in (1, 2, 3, 4) for kv in KV]
             + [(kv, h, 2) for h in (16, 64, 128) for kv in KV])


run_variant, main = case_script("small_t_combine_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
