"""What a V3.2 cache's scale convention costs (twentieth session, 2026-12-02): the same bf16 KV quantised by
:func:`mla_sink.quantize_kv_cache` with power-of-two scales (FlashMLA's quantiser) and with ``amax / 448`` scales
(vLLM's writer), through the library (``mla_sink.sparse_mla_decode``, the plan's own route and splits), CUDA-graph
replay, L2 flushed, sinks on, topk 2048, bf16 q, flat ``[N, 656]`` cache. At 64 and 128 heads the seesaw serves
power-of-two scales exactly and flags every program that meets another scale, which a gated launch of the seesaw's
exact reading recomputes (since the twenty-first session; before it, a gated launch of the portable kernel); at 16
and 32 heads the few-heads kernel reads every scale in fp32. Prints and writes ``{case: us}`` per convention, and the max abs difference of
the outputs against the float64 reference on the first two tokens.

    PYTHONPATH=. python3 -u benchmarks/ds_scales_cost.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

N, D_QK, TOPK = 200_000, 576, 2048
CASES = [(h, t) for h in (128, 64, 32, 16) for t in (256, 64, 2)]


def main(path: str) -> None:
    """Time every case with both scale conventions and write the report to ``path``."""
    import mla_sink
    from mla_sink import quantize_kv_cache
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink.tools.bench import GraphTimer

    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    report = {"us": {"pow2": {}, "amax": {}}, "max_abs_vs_float64": {"pow2": {}, "amax": {}}}
    caches = {scale: quantize_kv_cache(kv, scale=scale) for scale in ("pow2", "amax")}
    for H, T in CASES:
        g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
        q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
        sinks = torch.randn(H, device="cuda", generator=g) + 2.0
        key = f"h{H}-T{T}"
        for scale, cache in caches.items():
            fn = lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, return_lse=True)  # noqa: E731
            o, _ = fn()
            ro, _ = sparse_mla_decode_reference(q[:2], cache, idx[:2], sinks)
            report["max_abs_vs_float64"][scale][key] = float((o[:2].double() - ro.double()).abs().max())
            report["us"][scale][key] = round(timer.time_us(fn), 2)
            print(scale, key, report["us"][scale][key], f"{report['max_abs_vs_float64'][scale][key]:.2e}", flush=True)
            with open(path, "w") as f:  # after every case: a run cut short keeps what it measured
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
