"""``mla-sink bench --host``: the host cost of one eager call, beside the GPU time of the same call.

Method: for each case, ``calls`` back-to-back eager calls with one ``torch.cuda.synchronize()`` at the
end, timed with ``time.perf_counter``; the median of ``repeats`` such runs (the entry points take turns
within each repeat; warm-up calls compile and plan first), per call: ``host_us``, the time until the
last call returns (the CPU's cost of a call; 300 calls of two launches stay within the launch queue),
and ``wall_us``, until the synchronize returns (the host cost or the GPU time, whichever bounds the
calls, so it also moves with the GPU's clocks). The GPU time of the same call (CUDA-graph replay, L2
flushed, :class:`mla_sink.tools.bench.GraphTimer`) is printed beside them. Entry points timed:
``sparse_mla_decode`` (the function), ``SparseMLADecode`` (the layer, built once), the operator
``torch.ops.mla_sink.sparse_mla_decode``, and FlashMLA's decode call ``flash_mla_with_kvcache`` on
the same q, ids and sinks over a 656-byte FP8 cache when ``flash_mla`` is importable (a benchmark
peer, never a dependency: see ``../shared/peers/README.md`` for how to build it; the adapter is
:func:`mla_sink.tools.peers.decode_call`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

from mla_sink.tools.report import report_header

#: the grid of the issue: T in {1, 2, 8} and H in {16, 128}, topk 2048, sinks on
HOST_TOKENS = (1, 2, 8)
HOST_HEADS = (16, 128)
HOST_TOPK = 2048


def host_us(fns: dict, *, calls: int, repeats: int, warmup: int = 3) -> tuple[dict, dict]:
    """Per entry point, two medians over ``repeats`` of ``calls`` back-to-back calls, in microseconds per
    call: ``issue`` (the CPU time until the last call returns, before the synchronize: the host cost
    proper, as long as the launch queue does not fill) and ``wall`` (until the synchronize returns: the
    host cost or the GPU time, whichever bounds the calls). The entry points take turns within each
    repeat, so that a drift of the machine (clocks, other load) reaches them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    issue: dict = {name: [] for name in fns}
    wall: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            issue[name].append((t1 - t0) / calls * 1e6)
            wall[name].append((t2 - t0) / calls * 1e6)
    med = lambda runs: {name: round(statistics.median(r), 2) for name, r in runs.items()}  # noqa: E731
    return med(issue), med(wall)


def run_host_bench(args: argparse.Namespace) -> dict:
    """Time the host cost of every entry point on the grid (see the module docstring).

    Returns:
        ``{"mode": "host", "device", "torch", "triton", "date"`` (:func:`mla_sink.tools.report.report_header`),
        ``"machine"`` (the device's name again, as before the common keys), ``"platform", "calls", "repeats",
        "method", "cases": [{"name", "num_heads", "num_tokens", "topk",
        "gpu_us", "kernel", "num_kv_splits", "host_us": {impl: us}}]}``.

    Raises:
        ValueError: ``--calls`` or ``--repeats`` < 1. RuntimeError: no CUDA GPU.
    """
    from mla_sink import SparseMLADecode, sparse_mla_decode
    from mla_sink.core.plan import build_plan
    from mla_sink.core.platform import detect_platform
    from mla_sink.core.records import CallSpec
    from mla_sink.tools import peers
    from mla_sink.tools.bench import GraphTimer

    for flag in ("calls", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"'--{flag}' must be >= 1 (got {getattr(args, flag)})")
    if not torch.cuda.is_available():
        raise RuntimeError("mla-sink bench --host needs a CUDA GPU")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    pool = args.pool_rows
    kv = (torch.randn(pool, 576, device=dev, generator=gen) * 0.5).to(torch.bfloat16)
    platform = detect_platform(dev)
    timer = GraphTimer(reps=10, replays=5)
    flash_mla, _ = peers.flash_mla_unless_off(getattr(args, "peers", None))
    fp8_cache = None  # the 656-byte cache of the pool, built at the first FlashMLA case
    cases = []
    for H in HOST_HEADS:
        sinks = torch.randn(H, device=dev, generator=gen).float()
        layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=HOST_TOPK, sinks=sinks)
        for T in HOST_TOKENS:
            q = torch.randn(T, H, 576, device=dev, generator=gen).to(torch.bfloat16)
            idx = torch.randint(0, pool, (T, HOST_TOPK), device=dev, generator=gen, dtype=torch.int32)
            scale = 576 ** -0.5
            impls: dict[str, Callable[[], Any]] = {
                "sparse_mla_decode": lambda: sparse_mla_decode(q, kv, idx, sinks),
                "SparseMLADecode": lambda: layer(q, kv, idx),
                "torch.ops.mla_sink.sparse_mla_decode": lambda: torch.ops.mla_sink.sparse_mla_decode(
                    q, kv, idx, sinks, scale, None, None, None, False, 0.0, ""),
            }
            peer = None
            if flash_mla is not None and peers.skip_reason(peers.DECODE, H) is None:
                if fp8_cache is None:
                    fp8_cache, _ = peers.ds_mla_cache(kv)
                peer = peers.decode_call(flash_mla, q, fp8_cache, idx, sinks, scale).run
            if peer is not None:
                impls["flash_mla_with_kvcache"] = peer
            host, wall = host_us(impls, calls=args.calls, repeats=args.repeats)
            plan = build_plan(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=H, topk=HOST_TOPK, sinks=True),
                              platform, num_tokens=T)
            gpu = {"sparse_mla_decode": round(timer.time_us(impls["sparse_mla_decode"]), 2)}
            if peer is not None:
                gpu["flash_mla_with_kvcache"] = round(timer.time_us(peer), 2)
            print(f"h{H} t{T}: host {host} wall {wall} gpu {gpu}", file=sys.stderr, flush=True)
            cases.append(dict(name=f"bf16-h{H}-t{T}-topk{HOST_TOPK}-sinks", num_heads=H, num_tokens=T, topk=HOST_TOPK,
                              kernel=plan.launch.kernel, num_kv_splits=plan.launch.num_kv_splits,
                              host_us=host, wall_us=wall, gpu_us=gpu))
    device = torch.cuda.get_device_name(0)
    return dict(**report_header("host", device), machine=device, platform=str(platform), calls=args.calls,
                repeats=args.repeats, method=__doc__.split("Method: ")[1].split("\n\n")[0].replace("\n", " "),
                cases=cases)


def print_host_table(report: dict) -> None:
    """One row per case: host us per eager call of each entry point, and the GPU time of the call."""
    impls = sorted({k for c in report["cases"] for k in c["host_us"]}, key=lambda k: (k.startswith("flash"), k))
    short = {"sparse_mla_decode": "function", "SparseMLADecode": "layer",
             "torch.ops.mla_sink.sparse_mla_decode": "operator", "flash_mla_with_kvcache": "FlashMLA"}
    print(f"{'case':<34}{'kernel':>10}{'splits':>7}" + "".join(f"{short.get(i, i):>11}" for i in impls)
          + f"{'GPU us':>9}{'FlashMLA GPU':>14}")
    for c in report["cases"]:
        cells = "".join(f"{c['host_us'].get(i, float('nan')):>5.1f}/{c['wall_us'].get(i, float('nan')):<5.1f}"
                        for i in impls)
        print(f"{c['name']:<34}{c['kernel']:>10}{c['num_kv_splits']:>7}{cells}{c['gpu_us']['sparse_mla_decode']:>9.1f}"
              f"{c['gpu_us'].get('flash_mla_with_kvcache', float('nan')):>14.1f}")
    print("host/wall us per eager call (back-to-back calls, one synchronize at the end, median of repeats: host "
          "until the last call returns, wall until the synchronize); GPU us: CUDA-graph replay, L2 flushed")


def cmd_host_bench(args: argparse.Namespace) -> int:
    """``mla-sink bench --host``: run, print the table, write ``--json`` when given."""
    report = run_host_bench(args)
    print_host_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
