"""Probe (fifty-seventh session, 2026-12-06): what the fp8 rows' alignment to 128-byte lines costs the few-heads
fp8 kernel. A V3.2 row is 656 bytes, so row ``id`` starts ``16 * (id % 8)`` bytes into a line and its 512 latent
codes touch five lines (four when ``id % 8 == 0``); the producer's loads read 128 bytes of a row an instruction
(``lines`` in tables/gluon_fp8.yaml), so all but one row in eight straddle two lines in every load. The probe times
the same launch (same pool, same number of ids, same spread) with every id of the form ``8 * r + OFFSET``, for each
``OFFSET`` in 0..7: only the rows' offset in their lines differs. Through the library (``mla_sink.sparse_mla_decode``,
the plan's own route), CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q, power-of-two V3.2 scales;
e4m3 (576-byte rows: offset ``64 * (id % 2)``) as the control.

Compare the offsets with each other only (fifty-ninth session, BENCHMARKS.md): ``r`` is drawn from ``N / 8`` rows, so
a T=256 launch repeats about 40% of its rows (random ids over ``N``: about 7%), and those repeats hit the L2; every
offset shares the same ``r``, so the offsets differ in where rows start and nothing else.

    PYTHONPATH=. python3 -u benchmarks/row_alignment_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

from seesaw_wgmma_ab import D_QK, N, TOPK  # the A/Bs' pool and ids, so that "random ids" is their case
CASES = [("fp8_ds_mla", 32, 256), ("fp8_ds_mla", 16, 256), ("fp8_e4m3", 32, 256), ("fp8_ds_mla", 32, 64)]
OFFSETS = (0, 1, 2, 4, 0)


def main(path: str = "row_alignment_probe.json") -> None:
    """Time every case at every id offset of :data:`OFFSETS` (the first repeated last, as a control) and write
    ``{case: {offset: us}}`` to ``path``."""
    import mla_sink
    from mla_sink import quantize_kv_cache
    from mla_sink.tools.bench import GraphTimer
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    caches = {"fp8_e4m3": (kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")),
              "fp8_ds_mla": (quantize_kv_cache(kv, scale="pow2"), None)}
    report: dict = {}
    warm = True
    for kv_dtype, H, T in CASES:
        g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
        q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
        base = torch.randint(0, N // 8, (T, TOPK), device="cuda", dtype=torch.int32, generator=g) * 8
        sinks = torch.randn(H, device="cuda", generator=g) + 2.0
        cache, sc = caches[kv_dtype]
        key = f"{kv_dtype}-h{H}-T{T}"
        report[key] = {}
        for i, off in enumerate(OFFSETS):
            idx = base + off
            fn = lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc)  # noqa: E731
            if warm:  # a fresh process's first timing reads slow
                timer.time_us(fn)
                warm = False
            us = round(timer.time_us(fn), 2)
            report[key][f"{off}" if i < len(OFFSETS) - 1 else f"{off} again"] = us
            print(key, "offset", off, us, flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
