"""Per-kernel GPU time of one library call on the 656-byte V3.2 rows (seesaw, its combine, the gated
portable recompute and its combine), by torch.profiler, warm L2, one H200 run.

Usage (repo root): ``PYTHONPATH=. python3 benchmarks/ds_redo_profile.py``
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from mla_sink import quantize_kv_cache, sparse_mla_decode

D_QK, TOPK, N = 576, 2048, 1 << 20


def main() -> None:
    torch.manual_seed(0)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {scale: quantize_kv_cache(kv, scale=scale) for scale in ("pow2", "amax")}
    for H, T in ((64, 2), (128, 2), (128, 256)):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        for scale, cache in caches.items():
            for _ in range(3):
                sparse_mla_decode(q, cache, idx, sinks)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    sparse_mla_decode(q, cache, idx, sinks)
                torch.cuda.synchronize()
            rows = [(e.key, e.device_time_total / e.count, e.count) for e in prof.key_averages()]
            print(f"H={H} T={T} {scale}: " + "; ".join(f"{k[:40]} {us:.1f}us x{n}" for k, us, n in rows), flush=True)


if __name__ == "__main__":
    main()
