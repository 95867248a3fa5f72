"""Device check of the Gluon warp-specialised kernel: correctness against float64 and timing against the
portable Triton kernel (cold L2, CUDA-graph replay). Usage: PYTHONPATH=. python benchmarks/gluon_check.py OUT.json"""

from __future__ import annotations

import json
import sys
import traceback

import torch

from mla_sink.tools.bench import GraphTimer
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent))
from baselines.gluon_ws import sparse_mla_decode_gluon  # noqa: E402  (the replaced kernel, for A/B)
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.core.reference import sparse_mla_decode_reference


def check(rows, name, q, kv, idx, sinks, topk_length=None):
    rec = {"case": name}
    try:
        o, l = sparse_mla_decode_gluon(q, kv, idx, sinks, topk_length=topk_length)
        torch.cuda.synchronize()
        ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, topk_length=topk_length)
        d = (o.double() - ro).abs()
        tol = 1e-3 + (2 / 128) * ro.abs()
        rec["out_max_abs"] = d.max().item()
        rec["out_bad"] = int((d > tol).sum().item())
        fin = torch.isfinite(rl)
        rec["lse_max_abs"] = (l.double() - rl)[fin].abs().max().item() if fin.any() else 0.0
        rec["lse_inf_match"] = bool(torch.equal(torch.isneginf(l), torch.isneginf(rl)))
        rec["nan"] = bool(torch.isnan(o).any().item() or torch.isnan(l).any().item())
        cos = torch.nn.functional.cosine_similarity(o.double().flatten(), ro.flatten(), dim=0).item() if ro.abs().sum() > 0 else 1.0
        rec["cos_diff"] = 1 - cos
    except Exception:  # noqa: BLE001
        rec["error"] = traceback.format_exc()[-1500:]
    rows.append(rec)
    print(json.dumps(rec), flush=True)


def main():
    out_path = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    rows = []
    N = 5000
    kv = torch.randn(N, 576, device=dev).to(torch.bfloat16)
    kv[7] = float("nan")  # never referenced
    for H, T, topk in [(128, 3, 2048), (64, 2, 100), (100, 2, 64), (1, 1, 37), (128, 4, 0)]:
        q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, topk), device=dev, dtype=torch.int32)
        idx[idx == 7] = 8
        if topk > 20:
            idx[0, :16] = -1
            idx[-1, 5] = N
            idx[-1, 9] = 2 ** 31 - 1
        sinks = torch.randn(H, device=dev) * 3
        if H > 3:
            sinks[0] = float("inf"); sinks[1] = float("-inf"); sinks[2] = 100.0
        check(rows, f"bf16 H{H} T{T} topk{topk}", q, kv, idx, sinks)
        check(rows, f"bf16 H{H} T{T} topk{topk} nosinks", q, kv, idx, None)
    q = torch.randn(3, 128, 576, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, N, (3, 300), device=dev, dtype=torch.int32)
    idx[1] = -1
    check(rows, "bf16 empty row 1", q, kv, idx, torch.randn(128, device=dev))
    check(rows, "bf16 topk_length", q, kv, idx, torch.randn(128, device=dev),
          topk_length=torch.tensor([300, 5, 129], device=dev, dtype=torch.int32))
    kv16 = kv.to(torch.float16)
    check(rows, "fp16 H64 T2", q[:2, :64].to(torch.float16), kv16, idx[:2], torch.randn(64, device=dev))
    # timing
    POOL = 3_500_000
    pool = torch.randn(POOL, 576, device=dev, dtype=torch.bfloat16)
    timer = GraphTimer(reps=6, replays=3)
    for H, T in [(128, 256), (64, 256), (128, 64), (64, 64)]:
        q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
        idx = torch.randint(0, POOL, (T, 2048), device=dev, dtype=torch.int32)
        sinks = torch.randn(H, device=dev)
        o = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
        l = torch.empty(T, H, device=dev)
        rec = {"case": f"time H{H} T{T}"}
        try:
            ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks)
            sparse_mla_decode_gluon(q, pool, idx, sinks, out=o, lse=l)
            rec["gluon_err"] = (o.double() - ro).abs().max().item()
            rec["gluon_us"] = timer.time_us(lambda: sparse_mla_decode_gluon(q, pool, idx, sinks, out=o, lse=l))
            rec["triton_us"] = timer.time_us(lambda: sparse_mla_decode_triton(q, pool, idx, sinks, out=o, lse=l))
        except Exception:  # noqa: BLE001
            rec["error"] = traceback.format_exc()[-1500:]
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
