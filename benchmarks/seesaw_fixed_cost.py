"""Fixed cost and cost per block pair of the seesaw kernel at H=128 (bf16), against FlashMLA's
``flash_mla_sparse_fwd`` on the same data (eleventh session, 2026-12-01).

At H=128 the seesaw runs one CTA per (token, 64-head block), one CTA per SM. The time of a grid of one wave
(T=64: 128 CTAs on 132 SMs) over ``topk`` is ``c + pairs * x``; the fit over topk 128..2048 separates the
per-kernel cost ``c`` (launch, prologue, epilogue, fill and drain of the pipeline) from the time of a block
pair ``x``. Each variant is a tree (``mla_sink``, ``dispatch``, ``tables``) run in a child process on the
same data; the seesaw is called directly, unsplit. Also timed: every token with ``topk_length = 0`` (the CTA
loads q and writes zeros: launch, prologue and epilogue only). CUDA-graph replay, L2 flushed, sinks on.

    PYTHONPATH=.peers/FlashMLA:. python3 -u benchmarks/seesaw_fixed_cost.py OUT.json NAME=TREE [NAME=TREE ...]

(the variants run through ``tree_ab.run_variants``; FlashMLA is timed in the first one only)
"""

from __future__ import annotations

import json
import os
import sys

import torch

D_QK, D_V, N, H = 576, 512, 1 << 20, 128
CASES = [(64, k) for k in (128, 256, 512, 1024, 2048)] + [(128, 2048), (256, 2048)]


def _data(T: int, topk: int):
    g = torch.Generator(device="cuda").manual_seed(T * 10000 + topk)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(H, device="cuda", generator=g) + 2.0
    return q, idx, sinks


def run_variant(name: str, dump: str, with_peer: bool) -> dict:
    """Time every case with the ``mla_sink`` on the path; save the outputs to ``dump``."""
    from mla_sink.kernels.gluon import gluon_seesaw as gs
    from mla_sink.tools import peers
    from mla_sink.tools.bench import GraphTimer
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    fm = peers.import_flash_mla()[0] if with_peer else None
    res, outs = {}, {}
    for T, topk in CASES:
        q, idx, sinks = _data(T, topk)
        out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        fn = lambda: gs.sparse_mla_decode_seesaw(q, kv, idx, sinks, out=out, lse=lse)  # noqa: E731
        fn()
        key = f"T{T}-topk{topk}"
        outs[key] = out.float().cpu()
        res[key] = round(timer.time_us(fn), 2)
        if fm is not None:
            res["flash_mla_sparse_fwd/" + key] = round(timer.time_us(
                peers.sparse_fwd_call(fm, q, kv, idx, sinks, D_QK ** -0.5).run), 2)
        print(name, key, {k: v for k, v in res.items() if k.endswith(key)}, flush=True)
    q, idx, sinks = _data(64, 2048)
    zero = torch.zeros(64, dtype=torch.int32, device="cuda")
    out = torch.empty(64, H, D_V, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(64, H, device="cuda")
    res["T64-topk_length0"] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
        q, kv, idx, sinks, topk_length=zero, out=out, lse=lse)), 2)
    print(name, "T64-topk_length0", res["T64-topk_length0"], flush=True)
    torch.save(outs, dump)
    return res


def _fit(us: dict, prefix: str = "") -> dict:
    """Least-squares ``c + pairs * x`` over the T=64 cases (pairs = topk / 128)."""
    pts = [(k / 128, us[f"{prefix}T64-topk{k}"]) for T, k in CASES if T == 64 and f"{prefix}T64-topk{k}" in us]
    n = len(pts)
    if n < 2:
        return {}
    mx = sum(p for p, _ in pts) / n
    my = sum(t for _, t in pts) / n
    x = sum((p - mx) * (t - my) for p, t in pts) / sum((p - mx) ** 2 for p, _ in pts)
    return {"fixed_us": round(my - x * mx, 2), "per_pair_us": round(x, 3)}


def main(path: str, *variants: str) -> None:
    from tree_ab import run_variants
    report: dict = {"H": H, "cases": [f"T{t}-topk{k}" for t, k in CASES], "us": {}, "fit": {}}
    report["us"], report["max_abs_diff_vs_first"] = run_variants("seesaw_fixed_cost", variants,
                                                                 os.path.dirname(os.path.abspath(path)), (True,),
                                                                 (False,))
    for i, (name, us) in enumerate(report["us"].items()):
        report["fit"][name] = _fit(us)
        if i == 0:
            report["fit"]["flash_mla_sparse_fwd"] = _fit(us, "flash_mla_sparse_fwd/")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
