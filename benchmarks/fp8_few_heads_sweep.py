"""The few-heads fp8 kernel with split-KV and 32-head blocks (ninth session, 2026-12-01): for H in {16, 32} and
T in {2, 64, 128, 256}, on the same data (3.5 M-row pool, topk 2048, sinks on, bf16 q), CUDA-graph replay with
the L2 flushed, times

* ``bf16``: the library on a bf16 cache (the bar of issue #12: fp8 faster than bf16 at H <= 32);
* ``e4m3_lib``: the library on the e4m3 cache (its route at the time of the run);
* ``gluon_fp8/s<splits>``: :func:`mla_sink.kernels.gluon.gluon_fp8.sparse_mla_decode_fp8_gluon` with that many
  splits (the ninth session's runs also timed other register splits of the 32-head alternate blocks, ``/r<regs>``;
  those variants left the script with the alternate blocks, seventy-sixth session),

and checks each ``gluon_fp8`` configuration against the float64 reference (max abs error of ``out`` and
``lse``) on the same inputs.

Runs of 2026-12-01 (BENCHMARKS.md, ninth session): ``fp8_few_heads_sweep_2026-12-01.json``, the kernel with
its producer loading rows into registers and 32-head blocks offered (their register splits, ``/r<regs>``;
they lost, and the kernel now takes 16-head blocks only); ``fp8_few_heads_staged_2026-12-01.json``, heads
16 only, the producer copying rows into a staging block by cp.async; ``fp8_few_heads_prefetch_2026-12-01.json``,
heads 16 only, the producer loading rows into registers again and prefetching block i + 2 into L2;
``fp8_few_heads_two_producers_2026-12-01.json``, heads 16 only, two producer warpgroups, one per ring stage.
None of the three was kept.

    PYTHONPATH=. python3 -u benchmarks/fp8_few_heads_sweep.py OUT.json [HEADS, e.g. 16,32]
"""

from __future__ import annotations

import json
import sys

import torch

D_QK, TOPK, N = 576, 2048, 3_500_000
SHAPES = [(h, t) for h in (16, 32) for t in (2, 64, 128, 256)]
SPLITS = {2: (8, 16, 32), 64: (1, 2, 3), 128: (1, 2), 256: (1,)}


def main(path: str, heads: str = "16,32") -> None:
    import mla_sink
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink.kernels.gluon import gluon_fp8 as gf
    from mla_sink.tools.bench import GraphTimer

    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    kv8 = kv.to(torch.float8_e4m3fn)
    kv_scale = torch.tensor([1.25], device="cuda")
    report: dict = {"us": {}, "err": {}}
    for H, T in [(h, t) for h, t in SHAPES if str(h) in heads.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
        q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
        idx[:, ::7] = -1
        sinks = torch.randn(H, device="cuda", generator=g) + 2.0
        key = f"h{H}-T{T}"
        row: dict = {}
        row["bf16"] = timer.time_us(lambda: mla_sink.sparse_mla_decode(q, kv, idx, sinks, return_lse=True))
        row["e4m3_lib"] = timer.time_us(
            lambda: mla_sink.sparse_mla_decode(q, kv8, idx, sinks, kv_scale=kv_scale, return_lse=True))
        ro, rl = sparse_mla_decode_reference(q, kv8, idx, sinks, kv_scale=kv_scale)
        errs: dict = {}
        for splits in SPLITS[T]:
            name = f"gluon_fp8/s{splits}"
            fn = lambda: gf.sparse_mla_decode_fp8_gluon(q, kv8, idx, sinks, kv_scale=kv_scale,  # noqa: E731
                                                        num_kv_splits=splits)
            try:
                o, lse = fn()
                torch.cuda.synchronize()
                errs[name] = [float((o.double() - ro.double()).abs().max()),
                              float((lse.double() - rl.double()).abs().nan_to_num(0.0).max()),
                              bool(torch.isnan(o).any())]
                row[name] = timer.time_us(fn)
            except Exception as e:  # noqa: BLE001 - a configuration that fails is reported, not fatal
                row[name] = None
                errs[name] = repr(e)[:300]
        report["us"][key] = {k: (round(v, 2) if v is not None else None) for k, v in row.items()}
        report["err"][key] = errs
        print(key, json.dumps(report["us"][key]), json.dumps(errs), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
