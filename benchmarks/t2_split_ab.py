"""A/B of the thirty-first session (2026-12-03): at 17-32 heads and one or two tokens the fp8 caches run two
16-head CTAs a token (head groups, thirtieth session) over 32 one-block splits; ``s128`` gives those launches
16 two-block splits instead (``min_ids_per_split: 128`` in ``tables/triton_tuning.yaml``'s rows
``sm90_fp8_h32_two_tokens`` and ``sm90_ds_mla_h32_bf16_two_tokens``): half the CTAs, and half the partials for
the combine (bf16's seesaw runs 16 two-block splits there). H = 24 / 32, T = 1 / 2 (and H=32 T=4, unchanged),
bf16 / e4m3 / V3.2; each variant a tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2
flushed, sinks on, topk 2048, bf16 q.

    cd benchmarks && PYTHONPATH=..:. python3 -u t2_split_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

KV = ("bf16", "fp8_e4m3", "fp8_ds_mla")
CASES = [(kv, h, t) for h in (24, 32) for t in (1, 2) for kv in KV] + [(kv, 32, 4) for kv in KV]

run_variant, main = case_script("t2_split_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
