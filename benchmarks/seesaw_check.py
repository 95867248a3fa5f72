"""The seesaw kernel against gluon_ws, the portable kernel and FlashMLA, same data, one H200 run.

Usage (repo root, FlashMLA built in place: benchmarks/h200_run.sh):
    PYTHONPATH=.peers/FlashMLA:. python3 benchmarks/seesaw_check.py OUT.json

bf16 q/KV, sinks on, topk 2048, a 1M-row pool, CUDA-graph replay with the L2 flushed (GraphTimer of
``mla-sink bench``). Per (H, T): the seesaw kernel at the planned split count and at other split counts,
without sinks, gluon_ws (unsplit) and the portable kernel at the planned split count, FlashMLA's
``flash_mla_sparse_fwd`` (bf16) and fp8 decode (656-byte cache of the same pool), and the seesaw's
error against the float64 reference on the first tokens.
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink.core.reference import sparse_mla_decode_reference
from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent))
from baselines.gluon_ws import sparse_mla_decode_gluon  # noqa: E402  (the replaced kernel, for A/B)
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for
from mla_sink.tools import peers
from mla_sink.tools.bench import GraphTimer

D_QK, D_V, TOPK, N = 576, 512, 2048, 1 << 20


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    fm, why = peers.import_flash_mla()
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    cache = peers.ds_mla_cache(kv)[0] if fm is not None else None
    report: dict = {"flash_mla": why, "cases": []}
    for H in (64, 128):
        for T in (2, 64, 128, 256):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N - 64, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda")
            scale = D_QK ** -0.5
            launch = triton_plan_for(q, kv, idx, sinks=sinks).launch
            splits = launch.num_kv_splits
            row: dict = {"H": H, "T": T, "kernel": launch.kernel, "splits": splits, "us": {}}
            out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(T, H, device="cuda")

            def seesaw(s, sk=sinks):
                return lambda: sparse_mla_decode_seesaw(q, kv, idx, sk, scale, out=out, lse=lse, num_kv_splits=s)

            for s in sorted({splits, 1, 2, 4, 8, 16, 32} if T <= 2 else {splits, 1, 2, 4} if T <= 64 else {splits, 1, 2}):
                try:
                    row["us"][f"seesaw_s{s}"] = round(timer.time_us(seesaw(s)), 2)
                except Exception as e:  # noqa: BLE001 - recorded
                    row["us"][f"seesaw_s{s}"] = f"{type(e).__name__}: {str(e)[:200]}"
            row["us"]["seesaw_planned_nosinks"] = round(timer.time_us(seesaw(splits, None)), 2)
            row["us"]["public_triton"] = round(timer.time_us(
                lambda: sparse_mla_decode_triton(q, kv, idx, sinks, scale, out=out, lse=lse)), 2)
            if T >= 64:
                row["us"]["gluon_ws"] = round(timer.time_us(
                    lambda: sparse_mla_decode_gluon(q, kv, idx, sinks, scale, out=out, lse=lse)), 2)
            row["us"]["portable"] = round(timer.time_us(
                lambda: sparse_mla_decode_triton(q, kv, idx, sinks, scale, out=out, lse=lse, kernel="portable")), 2)
            if fm is not None:
                sf = peers.sparse_fwd_call(fm, q, kv, idx, sinks, scale)
                row["us"]["flash_mla_sparse_fwd"] = round(timer.time_us(sf.run), 2)
                dc = peers.decode_call(fm, q, cache, idx, sinks, scale)
                row["us"]["flash_mla_decode"] = round(timer.time_us(dc.run), 2)
            o, l = sparse_mla_decode_seesaw(q, kv, idx, sinks, scale, num_kv_splits=splits)
            n = min(T, 4)
            ro, rl = sparse_mla_decode_reference(q[:n], kv, idx[:n], sinks, sm_scale=scale)
            row["max_abs_err_out"] = float((o[:n].double() - ro).abs().max())
            row["max_abs_err_lse"] = float((l[:n].double() - rl).abs().max())
            ff = 2 * H * T * TOPK * (D_QK + D_V)
            best = min(v for k, v in row["us"].items() if k.startswith("seesaw_s") and isinstance(v, float))
            row["seesaw_best_tflops"] = round(ff / best / 1e6, 1)
            print(json.dumps(row), flush=True)
            report["cases"].append(row)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
