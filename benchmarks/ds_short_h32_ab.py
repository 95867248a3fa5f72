"""A/B of the thirty-fifth session (2026-12-04): V3.2 rows at 17-32 heads on CTAs of one or two blocks (the row
``ds_mla_h32_short`` of ``tables/gluon_fp8.yaml``) in one 32-head CTA a split, with the first consumer on the scores
only and the second accumulating all four value tiles (176 / 152 registers; AOT sm90 no spill), against two 16-head
CTAs a split (head groups). Not kept (BENCHMARKS.md, thirty-fifth session). Variants: ``hb32s16`` the same 16
two-block splits at T=2 (32 CTAs); ``hb32s32`` with 64-id splits too (``min_ids_per_split: 64`` in the row
``sm90_ds_mla_h32_bf16`` of ``tables/triton_tuning.yaml``: 32 one-block splits at T=2, 64 CTAs). Each variant a
tree in a child process (:mod:`tree_ab`), same data, CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q.
The trees (``main`` = 4335112; the others main with those table rows edited)::

    cd benchmarks && PYTHONPATH=..:. python3 -u ds_short_h32_ab.py OUT.json main=../out/main \
        hb32s16=../out/hb32s16 hb32s32=../out/hb32s32 main2=../out/main hb32s32_2=../out/hb32s32
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = ([("fp8_ds_mla", 32, t) for t in (1, 2, 4)] + [("fp8_ds_mla", 24, 2), ("fp8_e4m3", 32, 2), ("bf16", 32, 2)])

run_variant, main = case_script("ds_short_h32_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
