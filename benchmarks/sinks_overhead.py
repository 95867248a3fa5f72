"""Sink overhead with interleaved timing: for each case, alternate the with-sinks and without-sinks calls
5 times (each a CUDA-graph-replay median with the L2 flushed, as mla-sink bench), and report the median
of each, so that drift between two consecutive bench rows does not masquerade as a sink cost.
Usage: PYTHONPATH=. python benchmarks/sinks_overhead.py OUT.json"""

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
    timer = GraphTimer(reps=10, replays=7)
    rows = []
    for H in (16, 32, 64, 128):
        for T in (2, 64, 256):
            q = torch.randn(T, H, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, pool_rows, (T, 2048), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda")
            out = torch.empty(T, H, 512, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(T, H, device="cuda")
            t = {"sinks": [], "nosinks": []}
            for _ in range(5):
                t["sinks"].append(timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=out, lse=lse)))
                t["nosinks"].append(timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, None, out=out, lse=lse)))
            s, n = statistics.median(t["sinks"]), statistics.median(t["nosinks"])
            plan = triton_plan_for(q, pool, idx).launch
            rec = dict(H=H, T=T, kernel=plan.kernel, splits=plan.num_kv_splits, sinks_us=s, nosinks_us=n,
                       overhead_pct=100 * (s / n - 1), samples=t)
            rows.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "samples"}), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
