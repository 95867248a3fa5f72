"""Host cost of the function at H=128, T = 2 and 8 (bf16, sinks, topk 2048, a 1 M-row pool): 200 back-to-back eager
calls timed, then 200 more under cProfile (BENCHMARKS.md, thirty-eighth session, section 4).

Usage (repo root, a CUDA GPU): ``PYTHONPATH=. python3 benchmarks/host_profile_t2_t8.py``
"""

import cProfile
import io
import pstats
import time

import torch

from mla_sink import sparse_mla_decode


def main() -> None:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    kv = torch.randn(1 << 20, 576, device=dev, generator=g).bfloat16()
    sinks = torch.randn(128, device=dev, generator=g)
    for T in (2, 8):
        q = torch.randn(T, 128, 576, device=dev, generator=g).bfloat16()
        idx = torch.randint(0, 1 << 20, (T, 2048), device=dev, generator=g, dtype=torch.int32)
        for _ in range(20):
            sparse_mla_decode(q, kv, idx, sinks)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            sparse_mla_decode(q, kv, idx, sinks)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"T={T}: host {(t1-t0)/200*1e6:.1f} us, wall {(t2-t0)/200*1e6:.1f} us", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            sparse_mla_decode(q, kv, idx, sinks)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        print(s.getvalue()[-3500:])


if __name__ == "__main__":
    main()
