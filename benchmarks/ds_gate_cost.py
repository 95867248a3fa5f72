"""What the gated exact recompute costs V3.2 calls that never need it (power-of-two scales, so no program is flagged):
the library call (the flagging seesaw, then the gated exact launch of the same grid, then the combine when split)
against the flagging seesaw launch alone (its flags written, nothing after it) on the same bytes, one H200 run
(BENCHMARKS.md, thirty-eighth session, section 5).

Usage (repo root, a CUDA GPU): ``PYTHONPATH=. python3 -u benchmarks/ds_gate_cost.py OUT.json``

bf16 q, sinks on, topk 2048, a 1 M-row pool quantised with ``scale="pow2"``, CUDA-graph replay with the L2 flushed
(``GraphTimer`` of ``mla-sink bench``). Only unsplit launches are timed alone (a split one needs its combine).
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache, sparse_mla_decode
from mla_sink.kernels.gluon.gluon_seesaw import seesaw_launch_args, sparse_mla_decode_seesaw_kernel
from mla_sink.paths.triton.launch import triton_plan_for
from mla_sink.tools.bench import GraphTimer

D_QK, D_V, TOPK, N = 576, 512, 2048, 1 << 20
CASES = ((128, 64), (64, 256), (128, 256), (64, 64))  # (H, T)


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    cache = quantize_kv_cache(torch.randn(N, D_QK, device="cuda") * 0.5, scale="pow2")
    report: dict = {"cases": []}
    for H, T in CASES:
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        plan = triton_plan_for(q, cache, idx, sinks=sinks)
        launch = plan.launch
        entry = dict(H=H, T=T, kernel=launch.kernel, num_kv_splits=launch.num_kv_splits)
        entry["library_us"] = timer.time_us(lambda: sparse_mla_decode(q, cache, idx, sinks))
        if launch.kernel == "gluon_seesaw" and launch.num_kv_splits == 1:
            out = torch.empty(T, H, D_V, dtype=torch.bfloat16, device="cuda")
            lse = torch.empty(T, H, dtype=torch.float32, device="cuda")
            grid, scalars, constexprs, options = seesaw_launch_args(
                q, cache, idx, num_kv_splits=1, ids_per_split=launch.ids_per_split,
                out_strides=(out.stride(0), out.stride(1)), kv_dtype="fp8_ds_mla")
            constexprs.update(HAS_SINKS=True, HAS_TOPK_LEN=False)
            redo = torch.zeros((T, grid[0] * grid[1]), dtype=torch.int32, device="cuda")

            def flagging_alone():
                sparse_mla_decode_seesaw_kernel[grid](q, cache, idx, sinks, idx, out, lse, lse, lse, lse, redo,
                                                      float(D_QK ** -0.5), **scalars, **constexprs, **options)

            entry["flagging_alone_us"] = timer.time_us(flagging_alone)
            entry["programs_flagged"] = int((redo != 0).sum().item())
            ref_out, _ = sparse_mla_decode(q, cache, idx, sinks)
            entry["max_abs_diff_out"] = (out.float() - ref_out.float()).abs().max().item()
            entry["gate_us"] = entry["library_us"] - entry["flagging_alone_us"]
        report["cases"].append(entry)
        print(json.dumps(entry), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
