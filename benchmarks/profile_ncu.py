"""Run one Triton decode call (topk 2048, bf16 q, sinks; random 3.5M-row pool) for ncu.

Usage: ncu --clock-control none -k regex:sparse_mla_decode --launch-skip 1 --launch-count 1 \
           --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
           --section MemoryWorkloadAnalysis python benchmarks/profile_ncu.py [H] [T] [KV]

``KV``: ``bf16`` (default), ``fp8_ds_mla`` (the 656-byte V3.2 rows, power-of-two scales, written by
:func:`mla_sink.quantize_kv_cache`) or ``fp8_e4m3`` (the pool cast to e4m3fn, ``kv_scale`` 1).
"""

import sys

import torch

from mla_sink import quantize_kv_cache
from mla_sink.paths.triton.launch import sparse_mla_decode_triton


def main() -> None:
    H = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    kv = sys.argv[3] if len(sys.argv) > 3 else "bf16"
    torch.manual_seed(0)
    pool = torch.randn(3_500_000, 576, device="cuda", dtype=torch.bfloat16)
    kv_scale = None
    if kv == "fp8_ds_mla":
        pool = quantize_kv_cache(pool, layout="fp8_ds_mla", scale="pow2")
    elif kv == "fp8_e4m3":
        pool, kv_scale = pool.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")
    q = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, pool.shape[0], (T, 2048), device="cuda", dtype=torch.int32)
    sinks = torch.randn(H, device="cuda")
    for _ in range(2):  # the first launch compiles; ncu profiles the second
        out, lse = sparse_mla_decode_triton(q, pool, idx, sinks, kv_scale=kv_scale)
    torch.cuda.synchronize()
    print("ok", kv, out.shape, float(lse[0, 0]))


if __name__ == "__main__":
    main()
