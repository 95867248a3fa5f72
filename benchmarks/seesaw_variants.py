"""Seesaw kernel variants (gather batch rows, T=2 split counts) against gluon_ws and FlashMLA's sparse_fwd on the
same data, one H200 run: PYTHONPATH=.peers/FlashMLA:. python3 benchmarks/seesaw_variants.py OUT.json

bf16, sinks on, topk 2048, 1M-row pool, CUDA-graph replay with the L2 flushed (GraphTimer of mla-sink bench).
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink.kernels.gluon import gluon_seesaw as gs
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent))
from baselines.gluon_ws import sparse_mla_decode_gluon  # noqa: E402  (the replaced kernel, for A/B)
from mla_sink.paths.triton.launch import triton_plan_for
from mla_sink.tools import peers
from mla_sink.tools.bench import GraphTimer

D_QK, D_V, TOPK, N = 576, 512, 2048, 1 << 20
VARIANTS = {"rows16": (16, 216, 72), "rows32": (32, 216, 72), "rows64": (64, 216, 72)}
T2_SPLITS = (8, 16, 32)


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=5)
    fm, _ = peers.import_flash_mla()
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    rows = []
    for H, T in ((128, 256), (64, 256), (128, 64), (64, 64), (128, 2), (64, 2)):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N - 64, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda")
        splits = triton_plan_for(q, kv, idx, sinks=sinks).launch.num_kv_splits
        out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        row = {"H": H, "T": T, "splits": splits, "us": {}}
        for name, (r, cr, pr) in VARIANTS.items():
            gs.GATHER_ROWS, gs.CONSUMER_REGS = r, cr
            gs.seesaw_producer_regs = lambda kv_dtype, pr=pr: pr  # the producer's registers (tables/gluon_seesaw.yaml)
            try:
                row["us"][name] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
                    q, kv, idx, sinks, out=out, lse=lse, num_kv_splits=splits)), 2)
            except Exception as e:  # noqa: BLE001 - recorded
                row["us"][name] = f"{type(e).__name__}: {str(e)[:200]}"
        gs.GATHER_ROWS, gs.CONSUMER_REGS, pr = VARIANTS["rows16"]
        gs.seesaw_producer_regs = lambda kv_dtype, pr=pr: pr
        for s in T2_SPLITS if T <= 2 else ():
            row["us"][f"rows16_s{s}"] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
                q, kv, idx, sinks, out=out, lse=lse, num_kv_splits=s)), 2)
        if splits == 1:
            row["us"]["gluon_ws"] = round(timer.time_us(lambda: sparse_mla_decode_gluon(q, kv, idx, sinks, out=out,
                                                                                        lse=lse)), 2)
        if fm is not None and T <= 2:
            cache = peers.ds_mla_cache(kv[: 1 << 16])[0]
            idx_small = idx % (1 << 16)
            row["us"]["flash_mla_decode_64k_pool"] = round(timer.time_us(
                peers.decode_call(fm, q, cache, idx_small, sinks, D_QK ** -0.5).run), 2)
            row["us"]["rows16_64k_pool"] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
                q, kv, idx_small, sinks, out=out, lse=lse, num_kv_splits=splits)), 2)
        if fm is not None:
            row["us"]["flash_mla_sparse_fwd"] = round(timer.time_us(
                peers.sparse_fwd_call(fm, q, kv, idx, sinks, D_QK ** -0.5).run), 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
