"""The in-kernel merge of a token's splits (``gluon_fp8``'s ``MERGE``, twenty-fourth session, 2026-12-02) against
the split launch followed by the combine kernel, on the same data: outputs compared (bitwise: the merge rounds as
the combine does), then timed by CUDA-graph replay with the L2 flushed, at the library's split count and others,
and with the counters zeroed per call (``torch.zeros``) instead of the kept buffer. One H200 call. Run it on a tree
with ``benchmarks/gluon_fp8_in_kernel_merge.patch`` applied (the merge was not kept).

    PYTHONPATH=. python3 -u benchmarks/t2_merge_ab.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

import mla_sink
from mla_sink import quantize_kv_cache
from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_gluon
from mla_sink.paths.triton.launch import triton_plan_for
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str) -> None:
    from mla_sink.kernels.gluon.split_merge import sync_buffer  # the patch's module

    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {"fp8_e4m3": kv.to(torch.float8_e4m3fn), "fp8_ds_mla": quantize_kv_cache(kv, scale="pow2"),
              "bf16": kv.to(torch.bfloat16)}
    del kv
    # the counters of the graphs' capture stream exist before any capture (else the first captured merge would
    # allocate and zero them inside its graph)
    torch.cuda.graph(torch.cuda.CUDAGraph())  # creates the default capture stream
    sync_buffer(torch.device("cuda"), torch.cuda.graph.default_capture_stream.cuda_stream, 256)
    rows = []
    for kv_dtype, H, T, extra in (("fp8_ds_mla", 32, 2, (16,)), ("fp8_e4m3", 32, 2, (32,)), ("fp8_ds_mla", 16, 2, ()),
                                  ("fp8_e4m3", 16, 2, ()), ("fp8_ds_mla", 32, 64, ()), ("fp8_e4m3", 32, 64, ()),
                                  ("fp8_ds_mla", 16, 64, ()), ("fp8_e4m3", 16, 64, ()), ("fp8_ds_mla", 5, 2, ()),
                                  ("bf16", 32, 2, ()), ("bf16", 16, 2, ())):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        cache = caches[kv_dtype]
        sc = torch.ones(1, device="cuda") if kv_dtype == "fp8_e4m3" else None
        e = dict(kv=kv_dtype, H=H, T=T, us={}, diff={})
        e["us"]["library"] = round(timer.time_us(
            lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc, return_lse=True)), 2)
        if kv_dtype != "bf16":
            plan = triton_plan_for(q, cache, idx, sinks=sinks)
            lp = plan.launch
            e["plan"] = dict(kernel=lp.kernel, splits=lp.num_kv_splits, ids=lp.ids_per_split)
            for s in (lp.num_kv_splits,) + tuple(extra):
                if s < 2:
                    continue
                ids = -(-(-(-TOPK // s)) // 64) * 64
                kw = dict(kv_scale=sc, num_kv_splits=s, ids_per_split=ids, kv_dtype=kv_dtype,
                          combine_tile=(min(lp.combine_block_h, 16 if H <= 16 else 32), lp.combine_block_d))
                chain = lambda: sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, **kw)  # noqa: E731
                merge = lambda: sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, merge=True, **kw)  # noqa: E731

                def merge_zeros():
                    torch.zeros(512, dtype=torch.int32, device="cuda")
                    return merge()
                o1, l1 = chain()
                o2, l2 = merge()
                o3, l3 = merge()  # the counters were left at 0
                torch.cuda.synchronize()
                e["diff"][str(s)] = dict(out=(o1.float() - o2.float()).abs().max().item(),
                                         lse=(l1 - l2).abs().max().item(),
                                         again=(o2.float() - o3.float()).abs().max().item())
                for name, fn in (("chain", chain), ("merge", merge), ("merge_zeros", merge_zeros)):
                    e["us"][f"{name}_{s}"] = round(timer.time_us(fn), 2)
        rows.append(e)
        print(e, flush=True)
    # adversarial: rows with no valid id, -1 anywhere, +-inf sinks, topk_length; merge against chain bitwise
    adv = []
    for kv_dtype, H in (("fp8_ds_mla", 32), ("fp8_e4m3", 16), ("fp8_ds_mla", 9)):
        T = 3
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(-2, N + 5, (T, TOPK), device="cuda", dtype=torch.int32)
        idx[0] = -1
        idx[1, 100:900] = -1
        sinks = torch.randn(H, device="cuda")
        sinks[0], sinks[1] = float("inf"), float("-inf")
        tl_ = torch.tensor([2048, 1500, 7], dtype=torch.int32, device="cuda")
        sc = torch.ones(1, device="cuda") if kv_dtype == "fp8_e4m3" else None
        for s in (2, 7, 32):
            kw = dict(kv_scale=sc, num_kv_splits=s, ids_per_split=-(-(-(-TOPK // s)) // 64) * 64, kv_dtype=kv_dtype,
                      topk_length=tl_)
            o1, l1 = sparse_mla_decode_fp8_gluon(q, caches[kv_dtype], idx, sinks, **kw)
            o2, l2 = sparse_mla_decode_fp8_gluon(q, caches[kv_dtype], idx, sinks, merge=True, **kw)
            torch.cuda.synchronize()
            r = dict(kv=kv_dtype, H=H, splits=s, out_equal=bool(torch.equal(o1, o2)),
                     lse_equal=bool(torch.equal(l1.nan_to_num(), l2.nan_to_num())),
                     out_nan=int(o2.isnan().sum()), lse_row0=l2[0, :3].tolist(), out_row0_absmax=o2[0].abs().max().item())
            adv.append(r)
            print(r, flush=True)
    with open(path, "w") as f:
        json.dump(dict(rows=rows, adversarial=adv), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
