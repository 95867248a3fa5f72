"""Drive one launch of a probe variant (benchmarks/fp8_pingpong_probe.py) or of the portable kernel for ncu,
and time the producer-only variant on pools of several sizes (TLB / locality check).
Usage: PYTHONPATH=. python benchmarks/fp8_probe_ncu.py {ncu VARIANT T | pools OUT.json}"""

import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import fp8_pingpong_probe as pp  # noqa: E402

from mla_sink.bench import GraphTimer  # noqa: E402
from mla_sink.kernels.triton_decode import sparse_mla_decode_triton  # noqa: E402

# the probe variants of the 2026-11-30 run (benchmarks/fp8_probe_pools_2026-11-30.json)
VARIANTS = {
    "producer_only_4_words": dict(consumer_regs=128, producer_regs=200, prefetch=2, probe=1),
    "producer_only_8_ids": dict(consumer_regs=128, producer_regs=96, producer_warps=8, prefetch=1, probe=1),
    "pp8_ids": dict(consumer_regs=128, producer_regs=96, producer_warps=8, prefetch=1),
}


def case(T, pool_rows, H=16):
    torch.manual_seed(0)
    pool = torch.randn(pool_rows, 576, device="cuda", dtype=torch.bfloat16)
    pool8 = pool.to(torch.float8_e4m3fn)
    q = torch.randn(T, H, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, pool_rows, (T, 2048), device="cuda", dtype=torch.int32)
    sinks = torch.randn(H, device="cuda")
    o = torch.empty(T, H, 512, device="cuda", dtype=torch.bfloat16)
    l = torch.empty(T, H, device="cuda")
    one = torch.tensor([1.0], device="cuda")
    return pool, pool8, q, idx, sinks, o, l, one


if sys.argv[1] == "ncu":
    name, T = sys.argv[2], int(sys.argv[3])
    pool, pool8, q, idx, sinks, o, l, one = case(T, 3_500_000)
    for _ in range(2):
        if name == "portable_bf16":
            sparse_mla_decode_triton(q, pool, idx, sinks, out=o, lse=l)
        else:
            pp.launch(q, pool8, idx, sinks, kv_scale=one, out=o, lse=l, **VARIANTS[name])
    torch.cuda.synchronize()
    print("ok")
else:
    rows = []
    timer = GraphTimer(reps=6, replays=3)
    for rows_n in (3_500_000, 1_000_000, 200_000, 50_000):
        pool, pool8, q, idx, sinks, o, l, one = case(132, rows_n)
        rec = {"pool_rows": rows_n}
        for name in ("producer_only_4_words", "producer_only_8_ids", "pp8_ids"):
            rec[name] = timer.time_us(lambda: pp.launch(q, pool8, idx, sinks, kv_scale=one, out=o, lse=l, **VARIANTS[name]))
        rec["portable_bf16"] = timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=o, lse=l))
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        del pool, pool8
    json.dump(rows, open(sys.argv[2], "w"), indent=1)
