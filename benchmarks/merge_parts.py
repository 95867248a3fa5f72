"""Where the in-kernel merge's time goes (twenty-fourth session probe): the merge launch of ``gluon_fp8`` timed on
the tree on ``PYTHONPATH`` (probe trees drop its wait or its loads), against the split launch alone and with its
combine. CUDA-graph replay, L2 flushed. The trees carry ``benchmarks/gluon_fp8_in_kernel_merge.patch`` (not kept);
``nosync`` drops its arrive / wait / depart, ``syncnoop`` its loads and stores.

    PYTHONPATH=TREE python3 -u benchmarks/merge_parts.py OUT.json LABEL
"""

from __future__ import annotations

import json
import sys

import torch

from mla_sink import quantize_kv_cache
from mla_sink.kernels.gluon import gluon_fp8 as gf
from mla_sink.tools.bench import GraphTimer

D_QK, TOPK, N = 576, 2048, 1 << 20


def main(path: str, label: str) -> None:
    from mla_sink.kernels.gluon.split_merge import sync_buffer  # the patch's module

    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = torch.randn(N, D_QK, device="cuda") * 0.5
    cache = quantize_kv_cache(kv, scale="pow2")
    del kv
    torch.cuda.graph(torch.cuda.CUDAGraph())
    sync_buffer(torch.device("cuda"), torch.cuda.graph.default_capture_stream.cuda_stream, 256)
    rows = []
    for H, T, s in ((32, 2, 32), (32, 64, 2), (32, 2, 8)):
        q = torch.randn(T, H, D_QK, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") + 8.0
        kw = dict(num_kv_splits=s, ids_per_split=TOPK // s, kv_dtype="fp8_ds_mla", combine_tile=(32, 128 if s < 8 else 32))
        e = dict(tree=label, H=H, T=T, splits=s)
        e["chain"] = round(timer.time_us(lambda: gf.sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, **kw)), 2)
        e["merge"] = round(timer.time_us(lambda: gf.sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, merge=True, **kw)), 2)
        rows.append(e)
        print(e, flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
