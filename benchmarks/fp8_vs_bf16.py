"""fp8 (e4m3fn) KV against bf16 KV at few heads, interleaved: for each case, alternate the bf16 call, the
fp8 call with sinks and the fp8 call without sinks 5 times (each a CUDA-graph-replay median with the L2
flushed, as mla-sink bench) through the public launcher, and report the median of each, so that drift
between bench rows does not decide the comparison (and the fp8 sink cost is measured the same way).
Usage: PYTHONPATH=. python benchmarks/fp8_vs_bf16.py OUT.json"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from mla_sink.tools.bench import GraphTimer
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for


def main():
    torch.manual_seed(0)
    pool_rows = 3_500_000
    pool = torch.randn(pool_rows, 576, device="cuda", dtype=torch.bfloat16)
    pool8 = pool.to(torch.float8_e4m3fn)
    one = torch.tensor([1.0], device="cuda")
    timer = GraphTimer(reps=10, replays=7)
    rows = []
    for H, T in ((16, 256), (16, 132), (8, 256), (16, 512)):
        q = torch.randn(T, H, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, pool_rows, (T, 2048), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda")
        out = torch.empty(T, H, 512, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        t = {"bf16": [], "fp8": [], "fp8_nosinks": []}
        for _ in range(5):
            t["bf16"].append(timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=out, lse=lse)))
            t["fp8"].append(timer.time_us(
                lambda: sparse_mla_decode_triton(q, pool8, idx, sinks, kv_scale=one, out=out, lse=lse)))
            t["fp8_nosinks"].append(timer.time_us(
                lambda: sparse_mla_decode_triton(q, pool8, idx, None, kv_scale=one, out=out, lse=lse)))
        med = {k: statistics.median(v) for k, v in t.items()}
        rec = dict(H=H, T=T, kernel_bf16=triton_plan_for(q, pool, idx).launch.kernel,
                   kernel_fp8=triton_plan_for(q, pool8, idx).launch.kernel,
                   bf16_us=med["bf16"], fp8_us=med["fp8"], fp8_nosinks_us=med["fp8_nosinks"],
                   fp8_vs_bf16_pct=100 * (med["fp8"] / med["bf16"] - 1),
                   fp8_sink_overhead_pct=100 * (med["fp8"] / med["fp8_nosinks"] - 1), samples=t)
        rows.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "samples"}), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
