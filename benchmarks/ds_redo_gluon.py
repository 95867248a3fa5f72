"""What a V3.2 cache with scales the seesaw cannot decode exactly (vLLM's ``amax / 448``) costs at H >= 32 through
the library (the seesaw, then the recompute of the tokens it flags), against a power-of-two cache (nothing
recomputed) and the portable kernel alone on the amax cache, one H200 run.

The run of 2026-12-01 (``ds_redo_gluon_2026-12-01.json``, BENCHMARKS.md tenth session) was on branch
``wip/ds-redo-gluon`` (76c42f8), whose recompute is a gated ``gluon_fp8`` launch in 16-head blocks; it was
no faster than the portable kernel's and was not kept. On main the same script measures the gated portable
recompute.

Usage (repo root): ``PYTHONPATH=. python3 benchmarks/ds_redo_gluon.py OUT.json [HEADS, e.g. 64,128]``

bf16 q, sinks on, topk 2048, a 1M-row pool quantised twice, T in {2, 64, 256}, CUDA-graph replay with the
L2 flushed (GraphTimer of ``mla-sink bench``); each case also records the library call's worst error against
the float64 reference on its first two tokens (amax cache).
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str, heads: str = "32,64,128") -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {scale: quantize_kv_cache(kv, scale=scale) for scale in ("pow2", "amax")}
    del kv
    report: dict = {"cases": []}
    for H in (int(h) for h in heads.split(",")):
        for T in (2, 64, 256):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda") + 8.0
            entry: dict = dict(H=H, T=T)
            for scale, cache in caches.items():
                entry[f"library_{scale}_us"] = timer.time_us(lambda: sparse_mla_decode(q, cache, idx, sinks))
            amax = caches["amax"]
            entry["portable_amax_us"] = timer.time_us(
                lambda: sparse_mla_decode_triton(q, amax, idx, sinks, kernel="portable"))
            o, lse = sparse_mla_decode(q[:2], amax, idx[:2], sinks, return_lse=True)
            ro, rl = sparse_mla_decode_reference(q[:2], amax, idx[:2], sinks)
            entry["max_abs_err_out"] = (o.double() - ro).abs().max().item()
            entry["max_abs_err_lse"] = (lse.double() - rl.double()).abs().max().item()
            report["cases"].append(entry)
            print(json.dumps(entry), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
