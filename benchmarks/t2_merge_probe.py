"""Where a few-heads fp8 call's time goes at small T (twenty-fourth session, 2026-12-02): the split launch
of ``gluon_fp8`` (and the bf16 seesaw) alone, with its combine (the library's chain), and alone under a
cooperative launch (``launch_cooperative_grid``), against an empty kernel. It bounds what merging a token's
splits inside the kernel (no combine launch) could gain. CUDA-graph replay, L2 flushed. One H200 call.

    PYTHONPATH=. python3 -u benchmarks/t2_merge_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

import mla_sink
from mla_sink import quantize_kv_cache
from mla_sink.kernels.gluon import launch_buffers
from mla_sink.kernels.gluon.gluon_fp8 import fp8_launch_args, sparse_mla_decode_fp8_ws_kernel
from mla_sink.kernels.gluon.gluon_seesaw import seesaw_launch_args, sparse_mla_decode_seesaw_kernel
from mla_sink.kernels.triton.combine import combine_jit, combine_launch_args
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


@triton.jit
def _empty(X):
    tl.store(X + tl.program_id(0), 0)


def chain(q, kv, idx, sinks, splits, kv_dtype, with_combine, coop):
    T, H, _ = q.shape
    out, lse, sm_scale = launch_buffers(q, None, None, None)
    ids = -(-(-(-TOPK // splits)) // 64) * 64
    seesaw = kv_dtype == "bf16"
    if seesaw:
        ids = -(-ids // 128) * 128
        grid, sc, ce, opt = seesaw_launch_args(q, kv, idx, num_kv_splits=splits, ids_per_split=ids,
                                               out_strides=(out.stride(0), out.stride(1)), kv_dtype=kv_dtype)
        kern, kvb, scale = sparse_mla_decode_seesaw_kernel, kv, lse
    else:
        grid, sc, ce, opt = fp8_launch_args(q, kv, idx, num_kv_splits=splits, ids_per_split=ids,
                                            out_strides=(out.stride(0), out.stride(1)), kv_dtype=kv_dtype)
        kern, kvb, scale = sparse_mla_decode_fp8_ws_kernel, kv, torch.ones(1, device="cuda")
    ce.update(HAS_SINKS=True, HAS_TOPK_LEN=False)
    if coop:
        opt = dict(opt, launch_cooperative_grid=True)
    part_out = torch.empty((T, splits, H, 512), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((T, splits, H), dtype=torch.float32, device=q.device)
    cg, cc, cs = combine_launch_args(T, H, splits, (out.stride(0), out.stride(1)), True, 16, 128, wait_primary=True)

    def run():
        if seesaw:
            kern[grid](q, kvb, idx, sinks, idx, out, lse, part_out, part_lse, scale, lse, float(sm_scale), **sc, **ce,
                       **opt)
        else:
            kern[grid](q, kvb, idx, sinks, idx, scale, out, lse, part_out, part_lse, float(sm_scale), **sc, **ce,
                       **opt)
        if with_combine:
            combine_jit[cg](part_out, part_lse, sinks, out, lse, **cs, **cc, num_warps=4, num_stages=1,
                            launch_pdl=True)
        return out, lse
    return run


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {"bf16": kv.to(torch.bfloat16), "fp8_e4m3": kv.to(torch.float8_e4m3fn),
              "fp8_ds_mla": quantize_kv_cache(kv, scale="pow2")}
    del kv
    x = torch.zeros(1024, dtype=torch.int32, device="cuda")
    rows = [dict(case="empty kernel, 64 programs", us=round(timer.time_us(lambda: _empty[(64,)](x)), 2)),
            dict(case="flush only", us=round(timer.time_us(lambda: None), 2))]
    print(rows, flush=True)
    for kv_dtype, H, T, splits_list in (("bf16", 32, 2, (8, 16, 32)), ("fp8_e4m3", 32, 2, (16, 32)),
                                        ("fp8_ds_mla", 32, 2, (16, 32)), ("fp8_ds_mla", 16, 2, (32,)),
                                        ("fp8_ds_mla", 32, 64, (2,)), ("fp8_e4m3", 32, 64, (2,))):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        cache = caches[kv_dtype]
        sc = torch.ones(1, device="cuda") if kv_dtype == "fp8_e4m3" else None
        e = dict(kv=kv_dtype, H=H, T=T, us={})
        e["us"]["library"] = round(timer.time_us(
            lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc, return_lse=True)), 2)
        for s in splits_list:
            for name, comb, coop in (("chain", True, False), ("alone", False, False), ("alone_coop", False, True)):
                try:
                    e["us"][f"{name}_{s}"] = round(timer.time_us(chain(q, cache, idx, sinks, s, kv_dtype, comb, coop)), 2)
                except Exception as ex:  # noqa: BLE001 - a probe: record what failed
                    e["us"][f"{name}_{s}"] = f"{type(ex).__name__}: {ex}"[:200]
        rows.append(e)
        print(e, flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
