"""Variant sweep of the Triton decode kernel on one GPU (cold L2, CUDA-graph replay; see mla_sink/bench.py).

Usage: PYTHONPATH=. python benchmarks/sweep.py OUT.json [budget_seconds] [plan: main | fp8 | even | small]
Each line of the output is one (case, config, splits) timing; a config that fails to compile or
produces a wrong result is recorded with its error.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from mla_sink.tools.bench import GraphTimer
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.paths.triton.plan import TritonConfig
from mla_sink.core.reference import sparse_mla_decode_reference

D_QK = 576
POOL = 3_500_000

# (case, [(block_h, block_n, warps, stages, splits[, fp8_f16[, fp8_bits]]])])
PLAN_FP8 = [
    (dict(H=16, T=256, kv="fp8"), [(16, 32, 4, 3, 1, True, False), (16, 32, 4, 3, 1, True, True),
                                   (16, 64, 4, 2, 1, True, True), (16, 64, 8, 2, 1, True, True),
                                   (16, 32, 8, 3, 1, True, True)]),
    (dict(H=128, T=256, kv="fp8"), [(64, 64, 8, 3, 1, False, False), (64, 64, 8, 3, 1, True, True)]),
    (dict(H=16, T=2, kv="fp8"), [(16, 32, 4, 3, 8, True, False), (16, 32, 4, 3, 8, True, True)]),
]
# 2026-11-30: after the EVEN / unsigned-compare id check and the column-split combine.
# Entries: (block_h, block_n, warps, stages, splits, fp8_f16, fp8_bits, combine_block_d)
PLAN_EVEN = [
    (dict(H=128, T=2, kv="bf16"), [(64, 64, 8, 3, s, True, False, d) for s in (8, 16, 32) for d in (128, 512)]
                                  + [(64, 64, 8, 2, s, True, False, 128) for s in (16, 32)]),
    (dict(H=64, T=2, kv="bf16"), [(64, 64, 8, 3, s, True, False, 128) for s in (16, 32)]),
    (dict(H=16, T=2, kv="bf16"), [(16, 64, 8, 2, s, True, False, 128) for s in (8, 16, 32)]),
    (dict(H=128, T=256, kv="bf16"), [(64, 64, 8, 3, 1), (64, 64, 8, 2, 1)]),
    (dict(H=128, T=256, kv="bf16", sinks=False), [(64, 64, 8, 3, 1)]),
    (dict(H=64, T=256, kv="bf16"), [(64, 64, 8, 3, 1), (64, 64, 8, 2, 1)]),
    (dict(H=32, T=256, kv="bf16"), [(32, 64, 4, 2, 1), (32, 64, 4, 3, 1), (32, 32, 4, 3, 1), (32, 64, 8, 2, 1)]),
    (dict(H=16, T=256, kv="bf16"), [(16, 64, 8, 2, 1), (16, 64, 4, 2, 1), (16, 64, 8, 3, 1)]),
    (dict(H=16, T=256, kv="fp8"), [(16, 32, 4, 3, 1, True), (16, 64, 4, 2, 1, True), (16, 32, 8, 3, 1, True)]),
    (dict(H=64, T=64, kv="bf16"), [(64, 64, 8, 3, s, True, False, 128) for s in (1, 2)]),
]
# 2026-11-30, second pass: small batches at 4 warps (the tuned H <= 32 rows) and fp8 at H <= 32.
PLAN_SMALL = [
    (dict(H=16, T=2, kv="bf16"), [(16, 64, 4, 2, s, True, False, 128) for s in (8, 16, 32)]),
    (dict(H=32, T=2, kv="bf16"), [(32, 64, 4, 2, s, True, False, 128) for s in (8, 16, 32)]),
    (dict(H=32, T=64, kv="bf16"), [(32, 64, 4, 2, s, True, False, 128) for s in (1, 2, 4)]),
    (dict(H=16, T=64, kv="bf16"), [(16, 64, 4, 2, s, True, False, 128) for s in (1, 2, 4)]),
    (dict(H=16, T=2, kv="fp8"), [(16, 64, 4, 2, s, True, False, 128) for s in (8, 16)]),
]
PLAN = [
    (dict(H=128, T=2, kv="bf16", flush="write"), [(64, 64, 8, 2, 8), (64, 64, 8, 3, 8)]),
    (dict(H=128, T=2, kv="bf16"), [(64, 64, 8, 2, s) for s in (4, 8, 16, 32)] + [(64, 64, 8, 3, s) for s in (8, 16)]),
    (dict(H=16, T=2, kv="bf16"), [(16, 64, 4, 2, s) for s in (8, 16, 32)] + [(16, 64, 8, 2, 16)]),
    (dict(H=128, T=256, kv="bf16"), [(64, 64, 8, 3, 1), (128, 32, 16, 2, 1), (128, 64, 16, 2, 1), (128, 32, 16, 3, 1),
                                     (64, 64, 8, 4, 1), (64, 64, 8, 3, 2), (64, 64, 16, 3, 1)]),
    (dict(H=64, T=256, kv="bf16"), [(64, 64, 8, 3, 1), (64, 64, 8, 3, 2), (32, 64, 4, 3, 1), (32, 64, 8, 2, 1),
                                    (64, 64, 16, 3, 1), (32, 64, 8, 3, 1)]),
    (dict(H=32, T=256, kv="bf16"), [(32, 64, 4, 2, 1), (32, 64, 8, 2, 1), (32, 64, 8, 3, 1), (32, 64, 4, 3, 1),
                                    (16, 64, 8, 2, 1), (32, 64, 4, 2, 2)]),
    (dict(H=16, T=256, kv="bf16"), [(16, 64, 8, 2, 1), (16, 64, 8, 3, 1), (16, 128, 8, 2, 1), (16, 64, 8, 2, 2)]),
    (dict(H=16, T=256, kv="bf16", sinks=False), [(16, 64, 8, 2, 1)]),
    (dict(H=16, T=256, kv="fp8"), [(16, 64, 4, 2, 1, False), (16, 64, 4, 2, 1), (16, 64, 8, 2, 1), (16, 32, 4, 3, 1),
                                   (16, 128, 4, 2, 1), (16, 64, 4, 3, 1), (16, 128, 8, 2, 1), (16, 64, 4, 2, 2)]),
    (dict(H=128, T=256, kv="fp8"), [(64, 64, 8, 3, 1), (64, 64, 8, 3, 1, False)]),
    (dict(H=64, T=64, kv="bf16"), [(64, 64, 8, 3, s) for s in (1, 2, 4)]),
    (dict(H=32, T=64, kv="bf16"), [(32, 64, 4, 2, s) for s in (1, 2, 4)] + [(32, 64, 8, 2, 2)]),
]


def main():
    out_path = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 300
    plan = {"main": PLAN, "fp8": PLAN_FP8, "even": PLAN_EVEN, "small": PLAN_SMALL}[sys.argv[3] if len(sys.argv) > 3 else "main"]
    t_start = time.time()
    torch.manual_seed(0)
    pool = torch.randn(POOL, D_QK, device="cuda", dtype=torch.bfloat16)
    pool8 = pool.to(torch.float8_e4m3fn)
    timers = {"read": GraphTimer(reps=6, replays=3), "write": GraphTimer(reps=6, replays=3, flush="write")}
    rows = []
    for case, cfgs in plan:
        H, T = case["H"], case["T"]
        kv = pool8 if case["kv"] == "fp8" else pool
        kv_scale = torch.tensor([1.0], device="cuda") if case["kv"] == "fp8" else None
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, POOL, (T, 2048), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") if case.get("sinks", True) else None
        ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, kv_scale=kv_scale)
        out = torch.empty(T, H, 512, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        timer = timers[case.get("flush", "read")]
        for bh, bn, w, st, sp, *flags in cfgs:
            if time.time() - t_start > budget:
                break
            f16 = flags[0] if flags else True
            bits = flags[1] if len(flags) > 1 else False
            cbd = flags[2] if len(flags) > 2 else 512
            if bits:  # the bit-placement fp8 decode (FP8_BITS) was removed; its timings stay in the sweep JSON
                continue
            cfg = TritonConfig(block_h=bh, block_n=bn, num_warps=w, num_stages=st, fp8_f16=f16, combine_block_d=cbd,
                               combine_block_h=16, min_combine_block_d=32, max_kv_splits=32, min_ids_per_split=64,
                               split_waves=1.0, split_min_fill=0.5)  # split policy unused: every entry forces its split count
            rec = dict(case=case, block_h=bh, block_n=bn, num_warps=w, num_stages=st, splits=sp, fp8_f16=f16,
                       fp8_bits=bits, combine_block_d=cbd)
            try:
                fn = lambda: sparse_mla_decode_triton(q, kv, idx, sinks, kv_scale=kv_scale, out=out, lse=lse,
                                                      config=cfg, num_kv_splits=sp)
                fn()
                torch.cuda.synchronize()
                err = (out.double() - ro).abs().max().item()
                lerr = (lse - rl).abs().max().item()
                rec.update(max_err=err, lse_err=lerr, us=timer.time_us(fn))
            except Exception as e:
                rec["error"] = repr(e)[:300]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=0)
    print(f"sweep done in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
