"""Device check of the fp8-KV small-head Gluon kernel: correctness against float64, timing against the
portable kernel (fp8 and bf16 KV) with cold L2 and CUDA-graph replay.
Usage: PYTHONPATH=. python benchmarks/gluon_fp8_check.py OUT.json"""

from __future__ import annotations

import json
import sys
import traceback

import torch

from mla_sink.tools.bench import GraphTimer
from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_gluon
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.core.reference import sparse_mla_decode_reference


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    rows = []
    N = 5000
    kv = (torch.randn(N, 576, device=dev) * 0.7).to(torch.float8_e4m3fn)
    kv[7] = float("nan")
    scale = torch.tensor([0.8], device=dev)
    for H, T, topk, bn, qdt in [(16, 3, 2048, 32, torch.bfloat16), (16, 2, 100, 64, torch.bfloat16),
                                (5, 2, 37, 32, torch.bfloat16), (1, 1, 64, 32, torch.float16),
                                (16, 2, 0, 32, torch.bfloat16), (12, 3, 300, 64, torch.float16)]:
        q = (torch.randn(T, H, 576, device=dev) * 3).to(qdt)
        idx = torch.randint(0, N, (T, topk), device=dev, dtype=torch.int32)
        idx[idx == 7] = 8
        if topk > 20:
            idx[0, :16] = -1
            idx[-1, 5] = N
            idx[-1, 9] = 2 ** 31 - 1
        sinks = torch.randn(H, device=dev) * 3
        if H > 3:
            sinks[0] = float("inf"); sinks[1] = float("-inf"); sinks[2] = 100.0
        tl_ = torch.tensor([topk, max(topk - 50, 0), 1][:T], device=dev, dtype=torch.int32) if T > 1 else None
        for s in (sinks, None):
            rec = {"case": f"H{H} T{T} topk{topk} bn{bn} {qdt} sinks={s is not None} topk_length={tl_ is not None}"}
            try:
                o, l = sparse_mla_decode_fp8_gluon(q, kv, idx, s, kv_scale=scale, topk_length=tl_)
                torch.cuda.synchronize()
                ro, rl = sparse_mla_decode_reference(q, kv, idx, s, kv_scale=scale, topk_length=tl_)
                d = (o.double() - ro).abs()
                rec["out_max_abs"] = d.max().item() if d.numel() else 0.0
                rec["out_bad"] = int(((d > 1e-3) & (d > (2 / 128) * ro.abs())).sum().item())
                fin = torch.isfinite(rl)
                rec["lse_max_abs"] = (l.double() - rl)[fin].abs().max().item() if fin.any() else 0.0
                rec["lse_inf_match"] = bool(torch.equal(torch.isneginf(l), torch.isneginf(rl)))
                rec["nan"] = bool(torch.isnan(o).any().item() or torch.isnan(l).any().item())
            except Exception:  # noqa: BLE001
                rec["error"] = traceback.format_exc()[-2000:]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    POOL = 3_500_000
    pool = torch.randn(POOL, 576, device=dev, dtype=torch.bfloat16)
    pool8 = pool.to(torch.float8_e4m3fn)
    one = torch.tensor([1.0], device=dev)
    timer = GraphTimer(reps=6, replays=3)
    for H, T in [(16, 256), (16, 64), (8, 256), (16, 132)]:
        q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, POOL, (T, 2048), device=dev, dtype=torch.int32)
        sinks = torch.randn(H, device=dev)
        o = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
        l = torch.empty(T, H, device=dev)
        rec = {"case": f"time H{H} T{T}"}
        try:
            ro, rl = sparse_mla_decode_reference(q, pool8, idx, sinks, kv_scale=one)
            for st in (2,):
                kw = dict(kv_scale=one, out=o, lse=l)
                sparse_mla_decode_fp8_gluon(q, pool8, idx, sinks, **kw)
                rec[f"gluon_st{st}_err"] = (o.double() - ro).abs().max().item()
                rec[f"gluon_st{st}_us"] = timer.time_us(lambda: sparse_mla_decode_fp8_gluon(q, pool8, idx, sinks, **kw))
            rec["portable_fp8_us"] = timer.time_us(lambda: sparse_mla_decode_triton(q, pool8, idx, sinks, kv_scale=one, out=o, lse=l))
            rec["portable_bf16_us"] = timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=o, lse=l))
        except Exception:  # noqa: BLE001
            rec["error"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
