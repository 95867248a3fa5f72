"""The 656-byte V3.2 rows in the few-heads fp8 kernel (tenth session, 2026-12-01): for H in {16} (and any
given) and T in {2, 64, 128, 256}, on the same data (a 3.5 M-row pool quantised twice, ``scale="pow2"`` and
``scale="amax"``; topk 2048, every 7th id ``-1``, sinks on, bf16 q), CUDA-graph replay with the L2 flushed,
times

* ``bf16``: the library on a bf16 cache of the same values (the bar of issue #12: fp8 faster than bf16 at
  H <= 32);
* ``lib_pow2`` / ``lib_amax``: the library on each V3.2 cache (its route at the time of the run);
* ``seesaw/s<splits>``: the seesaw kernel alone on the pow2 cache (its route before this session: the seesaw
  plus the gated recompute, which has nothing to recompute for power-of-two scales);
* ``gluon_fp8/<scale>/s<splits>``: :func:`mla_sink.kernels.gluon.gluon_fp8.sparse_mla_decode_fp8_gluon` on the
  V3.2 rows with that many splits,

and checks every ``gluon_fp8`` configuration against the float64 reference (worst abs error of ``out`` and
``lse`` on the first two tokens).

    PYTHONPATH=. python3 -u benchmarks/ds_few_heads_sweep.py OUT.json [HEADS, e.g. 16]
"""

from __future__ import annotations

import json
import sys

import torch

D_QK, TOPK, N = 576, 2048, 3_500_000
TOKENS = (2, 64, 128, 256)
SPLITS = {2: (8, 16), 64: (1, 2, 3), 128: (1, 2), 256: (1,)}
SEESAW_SPLITS = {2: 16, 64: 4, 128: 2, 256: 1}  # the seesaw's split counts before this session (split_waves 1.5)


def main(path: str, heads: str = "16") -> None:
    import mla_sink
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_gluon
    from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw
    from mla_sink.tools.bench import GraphTimer

    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    caches = {scale: mla_sink.quantize_kv_cache(kv, scale=scale) for scale in ("pow2", "amax")}
    report: dict = {"us": {}, "err": {}}
    for H in (int(h) for h in heads.split(",")):
        for T in TOKENS:
            g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
            q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
            idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
            idx[:, ::7] = -1
            sinks = torch.randn(H, device="cuda", generator=g) + 2.0
            key = f"h{H}-T{T}"
            row: dict = {"bf16": timer.time_us(lambda: mla_sink.sparse_mla_decode(q, kv, idx, sinks))}
            for scale, cache in caches.items():
                row[f"lib_{scale}"] = timer.time_us(lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks))
            s_old = SEESAW_SPLITS[T]
            row[f"seesaw/s{s_old}"] = timer.time_us(lambda: sparse_mla_decode_seesaw(
                q, caches["pow2"], idx, sinks, num_kv_splits=s_old, kv_dtype="fp8_ds_mla"))
            errs: dict = {}
            for scale, cache in caches.items():
                ro, rl = sparse_mla_decode_reference(q[:2], cache, idx[:2], sinks)
                for splits in SPLITS[T]:
                    name = f"gluon_fp8/{scale}/s{splits}"
                    fn = lambda: sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, num_kv_splits=splits,  # noqa: E731
                                                             kv_dtype="fp8_ds_mla")
                    try:
                        o, lse = fn()
                        torch.cuda.synchronize()
                        errs[name] = [float((o[:2].double() - ro.double()).abs().max()),
                                      float((lse[:2].double() - rl.double()).abs().nan_to_num(0.0).max()),
                                      bool(torch.isnan(o).any())]
                        row[name] = timer.time_us(fn)
                    except Exception as e:  # noqa: BLE001 - a configuration that fails is reported, not fatal
                        row[name] = None
                        errs[name] = repr(e)[:300]
            report["us"][key] = row
            report["err"][key] = errs
            print(key, json.dumps(row), json.dumps(errs), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
