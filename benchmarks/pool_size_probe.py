"""Probe of what bounds the few-heads fp8 kernel (thirteenth session, 2026-12-01): the same H=16 calls at
several pool sizes and with each token's ids sorted, through the library (``mla_sink.sparse_mla_decode``, the
plan's own route and splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q. If the fp8 kernels'
time grows with the pool (address translation and DRAM page misses lengthen each gather's latency) and falls with
sorted ids while bf16's does not, the fp8 producer is bound by the latency of the rows it keeps in flight.

    PYTHONPATH=. python3 -u benchmarks/pool_size_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

D_QK, TOPK, H = 576, 2048, 16
POOLS = (1 << 18, 1 << 20, 3_500_000, 12_000_000)
CHUNK = 1 << 20  # rows quantised at a time
CASES = [(kv, t) for t in (256, 64) for kv in ("bf16", "fp8_e4m3", "fp8_ds_mla")]


def _caches(n: int) -> dict:
    """``{kv_dtype: (cache, kv_scale)}`` of ``n`` random rows (quantised in chunks: a whole float copy of the
    largest pool would not fit)."""
    from mla_sink import quantize_kv_cache
    kv = torch.empty(n, D_QK, dtype=torch.bfloat16, device="cuda")
    ds = torch.empty(n, 656, dtype=torch.uint8, device="cuda")
    for a in range(0, n, CHUNK):
        rows = slice(a, min(a + CHUNK, n))
        kv[rows] = (torch.randn(rows.stop - a, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
        ds[rows] = quantize_kv_cache(kv[rows], scale="pow2")
    return {"bf16": (kv, None), "fp8_e4m3": (kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")),
            "fp8_ds_mla": (ds, None)}


def main(path: str) -> None:
    """Time every case at every pool size, with random and with sorted ids; write the table to ``path``."""
    import mla_sink
    from mla_sink.tools.bench import GraphTimer
    timer = GraphTimer(reps=10, replays=7)
    res = {}
    for n in POOLS:
        caches = _caches(n)
        for kv_dtype, T in CASES:
            g = torch.Generator(device="cuda").manual_seed(T)
            q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
            idx = torch.randint(0, n, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
            sinks = torch.randn(H, device="cuda", generator=g) + 2.0
            cache, sc = caches[kv_dtype]
            for order, ids in (("random", idx), ("sorted", idx.sort(dim=1).values.contiguous())):
                fn = lambda: mla_sink.sparse_mla_decode(q, cache, ids, sinks, kv_scale=sc, return_lse=True)  # noqa: E731
                fn()
                key = f"{kv_dtype}-h{H}-T{T}-N{n}-{order}"
                res[key] = round(timer.time_us(fn), 2)
                print(key, res[key], flush=True)
        del caches
        torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump({"pools": POOLS, "us": res}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
