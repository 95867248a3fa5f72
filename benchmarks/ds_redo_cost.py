"""What the 656-byte V3.2 rows cost on sm90 by scale convention: the library's route (the seesaw kernel,
then the gated portable kernel that recomputes the tokens it flags) against the portable kernel alone,
and the seesaw alone, on the same bytes, one H200 run.

Usage (repo root): ``PYTHONPATH=. python3 benchmarks/ds_redo_cost.py OUT.json``

bf16 q, sinks on, topk 2048, a 1M-row pool quantised twice (``scale="pow2"``: FlashMLA's convention, every
token served by the seesaw; ``scale="amax"``: vLLM's, every token flagged after its first block pair and
recomputed), CUDA-graph replay with the L2 flushed (GraphTimer of ``mla-sink bench``). Per case: the
library call, the portable kernel alone (``kernel="portable"``, the tuning row's split count), the
seesaw alone (its flags written, nothing recomputed), and the library call's worst error against the
float64 reference on its first two tokens.
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference
from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {scale: quantize_kv_cache(kv, scale=scale) for scale in ("pow2", "amax")}
    del kv
    report: dict = {"cases": []}
    for H in (16, 32, 64, 128):
        for T in (2, 64, 256):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda") + 8.0
            for scale, cache in caches.items():
                plan = triton_plan_for(q, cache, idx, sinks=sinks)
                splits = plan.launch.num_kv_splits
                redo = torch.empty((T, -(-H // 64) * splits), dtype=torch.int32, device="cuda")
                entry = dict(H=H, T=T, scale=scale, kernel=plan.launch.kernel, num_kv_splits=splits)
                entry["library_us"] = timer.time_us(lambda: sparse_mla_decode(q, cache, idx, sinks))
                entry["portable_us"] = timer.time_us(
                    lambda: sparse_mla_decode_triton(q, cache, idx, sinks, kernel="portable"))
                entry["seesaw_alone_us"] = timer.time_us(
                    lambda: sparse_mla_decode_seesaw(q, cache, idx, sinks, num_kv_splits=splits,
                                                     kv_dtype="fp8_ds_mla", redo=redo))
                entry["tokens_flagged"] = int((redo != 0).any(dim=1).sum().item())
                o, lse = sparse_mla_decode(q[:2], cache, idx[:2], sinks, return_lse=True)
                ro, rl = sparse_mla_decode_reference(q[:2], cache, idx[:2], sinks)
                entry["max_abs_err_out"] = (o.double() - ro).abs().max().item()
                entry["max_abs_err_lse"] = (lse.double() - rl.double()).abs().max().item()
                report["cases"].append(entry)
                print(json.dumps(entry), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
