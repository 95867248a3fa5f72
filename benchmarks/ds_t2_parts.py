"""Where the time of a V3.2 (656-byte) call at T=2 goes (fifth session, 2026-12-01): the library's chain
(seesaw, gated recompute, combine) against the seesaw and combine alone (no recompute launch), the same
for the per-tensor e4m3 cache, and the chain with the recompute launched plainly (the library's launch
since the seventh session) against the recompute launched as a programmatic dependent (the library's
launch when this script was written, forced here). Same data per row; CUDA-graph replay, L2 flushed;
power-of-two scales (nothing is recomputed). One H200 call, under a minute. It measures the gated portable
recompute, which the twenty-first session replaced (the seesaw's exact reading recomputes the flagged programs):
run it on a tree before that session.

    PYTHONPATH=. python3 -u benchmarks/ds_t2_parts.py benchmarks/ds_t2_parts_<date>.json
"""

from __future__ import annotations

import json
import sys

import torch

import mla_sink
from mla_sink import quantize_kv_cache
from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw
from mla_sink.paths.triton import launch
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    e4m3 = kv.to(torch.float8_e4m3fn)
    kv_scale = torch.ones(1, device="cuda")
    ds = quantize_kv_cache(kv, scale="pow2")
    del kv
    rows = []
    for H in (64, 128):
        T = 2
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        e = dict(H=H, T=T, splits=16, us={})
        e["us"]["ds_library_chain"] = timer.time_us(lambda: mla_sink.sparse_mla_decode(q, ds, idx, sinks))
        e["us"]["ds_seesaw_combine"] = timer.time_us(lambda: sparse_mla_decode_seesaw(
            q, ds, idx, sinks, num_kv_splits=16, kv_dtype="fp8_ds_mla", combine_tile=(16, 32)))
        e["us"]["e4m3_library_chain"] = timer.time_us(lambda: mla_sink.sparse_mla_decode(q, e4m3, idx, sinks,
                                                                                          kv_scale=kv_scale))
        e["us"]["e4m3_seesaw_combine"] = timer.time_us(lambda: sparse_mla_decode_seesaw(
            q, e4m3, idx, sinks, num_kv_splits=16, kv_dtype="fp8_e4m3", kv_scale=kv_scale, combine_tile=(16, 32)))
        e["us"]["ds_chain_plain_recompute"] = timer.time_us(lambda: launch.sparse_mla_decode_triton(
            q, ds, idx, sinks))
        original = launch._portable_runner
        try:  # the recompute as a programmatic dependent (a fresh runner: the triton launcher prepares per call)
            launch._portable_runner = lambda *a, **k: original(*a, **{**k, "pdl": True})
            e["us"]["ds_chain_pdl_recompute"] = timer.time_us(lambda: launch.sparse_mla_decode_triton(
                q, ds, idx, sinks))
        finally:
            launch._portable_runner = original
        e["us"] = {k: round(v, 2) for k, v in e["us"].items()}
        rows.append(e)
        print(e, flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
