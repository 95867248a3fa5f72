"""Where the host time of one eager call goes: cProfile of back-to-back calls (H200 runs; BENCHMARKS.md).

Usage: PYTHONPATH=. python3 benchmarks/host_profile.py [H] [T] [calls]
"""

import cProfile
import pstats
import sys

import torch

from mla_sink import SparseMLADecode, sparse_mla_decode


def main() -> None:
    H, T, calls = (int(a) for a in (sys.argv[1:] + ["128", "2", "2000"])[:3])
    dev = torch.device("cuda")
    kv = torch.randn(100_000, 576, device=dev).to(torch.bfloat16)
    q = torch.randn(T, H, 576, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, 100_000, (T, 2048), device=dev, dtype=torch.int32)
    sinks = torch.randn(H, device=dev)
    layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=2048, sinks=sinks)
    for fn_name, fn in (("sparse_mla_decode", lambda: sparse_mla_decode(q, kv, idx, sinks)),
                        ("SparseMLADecode", lambda: layer(q, kv, idx))):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        print(f"==== {fn_name} H={H} T={T}: {calls} calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
