"""A/B of routing and tile choices for fp8 caches, prepared in the fourth session (2026-12-01) and not yet run
(the session's device time ran out): run it first in the next one and record its JSON in BENCHMARKS.md.
One H200 call, about 3 minutes.

    PYTHONPATH=. python3 -u benchmarks/fp8_route_ab.py benchmarks/fp8_route_ab_<date>.json

A. The e4m3 seesaw at H=64 T=64 with 2 splits (1024 ids: whole pairs) against 3 (704 ids: the sm90_fp8 row's
   split_waves 1.0 today) and 4: would split_waves 0.75 on sm90_fp8 fix "e4m3 no slower than V3.2" there?
B. The e4m3 seesaw (padded) at H=24/32 against today's portable sm90_fp8_h32 row, T 2/64/256: would the
   sm90_fp8_gluon_seesaw row without its head bound win? (Its GPU correctness at H < 64 is untested for e4m3:
   run tests/test_gluon_gpu.py -k fp8 with an H=32 case added first.)
C. The portable kernel on V3.2 rows (the recompute of amax caches, fp16 q, non-sm90) with tiles that spill
   less (AOT sm90 ptxas stack: BLOCK_H 64/BLOCK_N 64/8 warps 1656 B today, BLOCK_N 32 464 B; BLOCK_H 16/BLOCK_N 64/
   4 warps 4864 B today, BLOCK_N 32 656 B, BLOCK_N 16 none; BLOCK_H 32/BLOCK_N 32/4 warps 1048 B, 8 warps 144 B).
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache
from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.paths.triton.plan import TritonConfig
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def cfg(bh, bn, w, st):
    return TritonConfig(block_h=bh, block_n=bn, num_warps=w, num_stages=st, max_kv_splits=32, min_ids_per_split=128,
                        split_waves=0.75, split_min_fill=0.5, combine_block_h=16, combine_block_d=128,
                        min_combine_block_d=32, fp8_f16=False)


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    e4m3 = kv.to(torch.float8_e4m3fn)
    kv_scale = torch.ones(1, device="cuda")
    amax = quantize_kv_cache(kv, scale="amax")
    del kv
    rep: dict = {"A": [], "B": [], "C": []}
    for H, T, splits in ((64, 64, 2), (64, 64, 3), (64, 64, 4)):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        us = timer.time_us(lambda: sparse_mla_decode_seesaw(q, e4m3, idx, sinks, num_kv_splits=splits,
                                                            kv_dtype="fp8_e4m3", kv_scale=kv_scale))
        rep["A"].append(dict(H=H, T=T, splits=splits, seesaw_us=us))
        print("A", rep["A"][-1], flush=True)
    for H in (24, 32):
        for T, splits in ((2, 16), (64, 4), (256, 1)):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda") + 8.0
            e = dict(H=H, T=T, splits=splits)
            e["seesaw_us"] = timer.time_us(lambda: sparse_mla_decode_seesaw(
                q, e4m3, idx, sinks, num_kv_splits=splits, kv_dtype="fp8_e4m3", kv_scale=kv_scale))
            e["portable_us"] = timer.time_us(lambda: sparse_mla_decode_triton(
                q, e4m3, idx, sinks, kv_scale=kv_scale, kernel="portable"))
            rep["B"].append(e)
            print("B", e, flush=True)
    for H, tiles in ((16, [(16, 64, 4, 2), (16, 32, 4, 2), (16, 16, 4, 2), (16, 64, 8, 2)]),
                     (32, [(32, 32, 4, 2), (32, 32, 8, 2), (32, 16, 4, 2)]),
                     (128, [(64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3)])):
        for T in (2, 64, 256):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda") + 8.0
            for t in tiles:
                us = timer.time_us(lambda: sparse_mla_decode_triton(q, amax, idx, sinks, config=cfg(*t)))
                rep["C"].append(dict(H=H, T=T, tiles=t, portable_us=us))
                print("C", rep["C"][-1], flush=True)
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
