"""Split or not at 32 heads between T=66 and T=131 (twenty-fourth session's planner audit): the tuning rows of 32-head
launches (``split_min_fill`` 0.5) leave these grids unsplit, 66-131 programs on 132 SMs. Each call forced to one and
to two KV splits (``sparse_mla_decode_triton(num_kv_splits=...)``, the planned kernel otherwise), same data,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q, 1 M-row pool. One H200 call.

    PYTHONPATH=. python3 -u benchmarks/mid_t_splits.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=5, replays=5)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {"bf16": kv.to(torch.bfloat16), "fp8_e4m3": kv.to(torch.float8_e4m3fn),
              "fp8_ds_mla": quantize_kv_cache(kv, scale="pow2")}
    del kv
    one = torch.ones(1, device="cuda")
    rows = []
    for kv_dtype, cache in caches.items():
        for T in (72, 96, 120):
            q = torch.randn(T, 32, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(32, device="cuda") + 8.0
            sc = one if kv_dtype == "fp8_e4m3" else None
            e = dict(kv=kv_dtype, H=32, T=T, planned=triton_plan_for(q, cache, idx, sinks=sinks).launch.num_kv_splits)
            for s in (1, 2):
                e[f"us_{s}"] = round(timer.time_us(lambda: sparse_mla_decode_triton(
                    q, cache, idx, sinks, kv_scale=sc, num_kv_splits=s)), 2)
            rows.append(e)
            print(e, flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
