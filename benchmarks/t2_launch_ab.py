"""A/B of the small-T launch chain of the seesaw kernel (fifth session, 2026-12-01): the split-KV combine
that issues the loads of four splits at a time against the one-split-per-step loop it replaced
(``baselines/combine_loop.py``), its tile, and the programmatic dependent launch (PDL) of the combine
(the seesaw lets it launch as soon as every seesaw CTA runs). Same data per row; CUDA-graph replay,
L2 flushed. Then the library's V3.2 / e4m3 / bf16 calls at T = 2 and 64 (the new chain only), for the
record. One H200 call, about 2 minutes.

    PYTHONPATH=. python3 -u benchmarks/t2_launch_ab.py benchmarks/t2_launch_ab_<date>.json
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from baselines import combine_loop  # noqa: E402  (the replaced combine, for A/B)

import mla_sink  # noqa: E402
from mla_sink import quantize_kv_cache  # noqa: E402
from mla_sink.kernels.gluon import launch_buffers  # noqa: E402
from mla_sink.kernels.gluon.gluon_seesaw import seesaw_launch_args, sparse_mla_decode_seesaw_kernel  # noqa: E402
from mla_sink.kernels.triton import combine  # noqa: E402
from mla_sink.tools.bench import GraphTimer  # noqa: E402

D_QK, TOPK, N = 576, 2048, 1 << 20


def chain(q, kv, idx, sinks, splits, kv_dtype, kv_scale, variant):
    """The seesaw split ``splits`` ways, then a combine: ``variant`` = (combine module, tile, pdl) or None
    (the seesaw alone)."""
    T, H, _ = q.shape
    out, lse, sm_scale = launch_buffers(q, None, None, None)
    ids_per_split = -(-(-(-TOPK // splits)) // 128) * 128
    kvb = kv if kv_dtype == "bf16" else kv.view(torch.uint8)
    grid, scalars, constexprs, options = seesaw_launch_args(q, kvb, idx, num_kv_splits=splits,
                                                            ids_per_split=ids_per_split,
                                                            out_strides=(out.stride(0), out.stride(1)),
                                                            kv_dtype=kv_dtype)
    pdl = variant is not None and variant[2]
    constexprs.update(HAS_SINKS=True, HAS_TOPK_LEN=False, LAUNCH_DEPENDENTS=pdl)
    part_out = torch.empty((T, splits, H, 512), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((T, splits, H), dtype=torch.float32, device=q.device)
    scale = kv_scale if kv_scale is not None else lse

    def run():
        sparse_mla_decode_seesaw_kernel[grid](q, kvb, idx, sinks, idx, out, lse, part_out, part_lse, scale, lse,
                                              float(sm_scale), **scalars, **constexprs, **options)
        if variant is not None:
            mod, tile, pdl_c = variant
            extra = dict(wait_primary=True) if pdl_c else {}
            cgrid, cconst, cstatic = mod.combine_launch_args(T, H, splits, (out.stride(0), out.stride(1)), True,
                                                             *tile, **extra)
            mod.combine_jit[cgrid](part_out, part_lse, sinks, out, lse, **cstatic, **cconst, num_warps=4,
                                   num_stages=1, **(dict(launch_pdl=True) if pdl_c else {}))
        return out, lse
    return run


VARIANTS = {
    "loop_16x128": (combine_loop, (16, 128), False),
    "group_16x128": (combine, (16, 128), False),
    "group_16x128_pdl": (combine, (16, 128), True),
    "group_16x64_pdl": (combine, (16, 64), True),
    "group_16x32_pdl": (combine, (16, 32), True),
    "seesaw_alone": None,
}


def main(path: str) -> None:
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    caches = {"bf16": kv.to(torch.bfloat16), "fp8_e4m3": kv.to(torch.float8_e4m3fn)}
    kv_scale = torch.ones(1, device="cuda")
    ds_pow2 = quantize_kv_cache(kv, scale="pow2")
    ds_amax = quantize_kv_cache(kv, scale="amax")
    del kv
    rep: dict = {"chain": [], "library": []}
    for kv_dtype, H, T, splits in (("bf16", 64, 2, 16), ("bf16", 128, 2, 16), ("bf16", 64, 64, 2),
                                   ("fp8_e4m3", 64, 2, 16), ("fp8_e4m3", 128, 2, 16), ("fp8_e4m3", 64, 64, 2),
                                   ("fp8_e4m3", 64, 64, 3)):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        sc = kv_scale if kv_dtype != "bf16" else None
        e = dict(kv=kv_dtype, H=H, T=T, splits=splits, us={}, max_diff_vs_loop={})
        ref = chain(q, caches[kv_dtype], idx, sinks, splits, kv_dtype, sc, VARIANTS["loop_16x128"])()
        ref = (ref[0].float().clone(), ref[1].clone())
        for name, var in VARIANTS.items():
            fn = chain(q, caches[kv_dtype], idx, sinks, splits, kv_dtype, sc, var)
            if var is not None:
                o, l = fn()
                torch.cuda.synchronize()
                e["max_diff_vs_loop"][name] = max((o.float() - ref[0]).abs().max().item(),
                                                  (l - ref[1]).abs().max().item())
            e["us"][name] = round(timer.time_us(fn), 2)
        rep["chain"].append(e)
        print("chain", e, flush=True)
    for label, cache in (("fp8_ds_mla_pow2", ds_pow2), ("fp8_ds_mla_amax", ds_amax), ("fp8_e4m3", caches["fp8_e4m3"]),
                         ("bf16", caches["bf16"])):
        for H, T in ((64, 2), (128, 2), (64, 64), (128, 64)):
            q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
            sinks = torch.randn(H, device="cuda") + 8.0
            sc = kv_scale if label == "fp8_e4m3" else None
            fn = lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc, return_lse=True)  # noqa: E731
            e = dict(kv=label, H=H, T=T, us=round(timer.time_us(fn), 2))
            rep["library"].append(e)
            print("library", e, flush=True)
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
