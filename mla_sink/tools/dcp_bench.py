"""``mla-sink bench --dcp N``: time decode context parallel on N GPUs against DCP 1 on the same pool.

One process per GPU (``torch.multiprocessing`` spawn, NCCL). Rank 0 builds the whole bf16 pool
``[pool_rows, 576]`` and sends every other rank its ``interleaved`` shard, so the DCP result can be
checked against the DCP 1 result of the same call. Every rank times, with CUDA events (warm-up, then
the median of the repeats, each repeat started after a barrier):

* ``dcp_total``: the whole :func:`mla_sink.core.dcp.dcp_sparse_mla_decode` call (local ids, local decode,
  the packed all-gather, the merge and the sink);
* ``dcp_comm``: :func:`mla_sink.core.dcp.exchange_states` alone (pack, the one all-gather, unpack) on
  the same partial state, in fp32 as the DCP call sends it: the communication part of ``dcp_total``;
* ``dcp_local``: the sink-free local decode on the shard alone;

and rank 0 times ``dcp1``: the same call on the whole pool on one GPU (sinks fused). A step is as
slow as its slowest rank, so the table reports the maximum over ranks of each median.

The local decode is :func:`mla_sink.paths.triton.launch.sparse_mla_decode_triton` when it imports,
else the PyTorch reference in fp32 (named in the output as ``local_path``).

NVLink multicast (NVLS / symmetric-memory multicast) stays off: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` are set in the parent and in
every child before the process group is created.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Optional

import torch

from mla_sink.tools.flags import check_int_count, check_output_path
from mla_sink.tools.report import report_header

#: Environment that keeps NVLink multicast off (set in the parent and in every child before init).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

DEFAULTS = dict(dcp=2, heads=128, tokens=64, topk=2048, pool_rows=1 << 22, json=None)
WARMUP = 5
REPEATS = 30
LAYOUT = "interleaved"
CHILD_TIMEOUT_S = 540


def _set_no_multicast_env() -> None:
    os.environ.update(NO_MULTICAST_ENV)


def _local_decode_fn() -> tuple[str, Callable]:
    """(path name, ``(DecodeInputs, out_dtype) -> (out, lse)``): the decode of a DCP rank's shard (called
    with ``out_dtype=float32``: partials are written and exchanged in fp32, as ``run()`` does) and of
    the DCP 1 baseline (``out_dtype=None``: q's dtype)."""
    try:
        from mla_sink.paths.triton.launch import sparse_mla_decode_triton
    except Exception:  # noqa: BLE001 - any import failure falls back to the reference
        sparse_mla_decode_triton = None
    if sparse_mla_decode_triton is not None:

        def triton_local(x, out_dtype=None):
            out = None if out_dtype is None else torch.empty(
                (x.q.shape[0], x.q.shape[1], 512), dtype=out_dtype, device=x.q.device)
            return sparse_mla_decode_triton(x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, topk_length=x.topk_length,
                                            out=out)

        return "triton", triton_local
    from mla_sink.core.reference import sparse_mla_decode_reference

    def reference_local(x, out_dtype=None):
        return sparse_mla_decode_reference(
            x.q, x.kv_cache, x.indices, x.sinks, x.sm_scale, topk_length=x.topk_length,
            compute_dtype=torch.float32, out_dtype=out_dtype or x.q.dtype,
        )

    return "reference_fp32", reference_local


def _time_ms(fn: Callable[[], Any], barrier: Optional[Callable[[], None]] = None) -> tuple[float, float]:
    """(GPU ms, CPU ms): medians over :data:`REPEATS` after :data:`WARMUP` calls.

    GPU ms: CUDA events around one call (after a barrier and a device sync). CPU ms: host time to
    issue the call (no sync): when it approaches the GPU time the eager call is launch-bound.
    """
    for _ in range(WARMUP):
        fn()
    gpu, cpu = [], []
    for _ in range(REPEATS):
        if barrier is not None:
            barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        cpu.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(gpu), statistics.median(cpu)


def _graph_ms(fn: Callable[[], Any], barrier: Optional[Callable[[], None]] = None) -> Optional[float]:
    """GPU ms of ``fn`` captured in a CUDA graph and replayed (how engines run decode), or ``None``."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - report, keep the eager numbers
        print(f"CUDA graph capture failed: {type(e).__name__}: {e}", flush=True)
        return None
    return _time_ms(graph.replay, barrier)[0]


def _child(rank: int, cfg: dict, store_path: str, result_path: str) -> None:
    _set_no_multicast_env()
    try:
        _child_body(rank, cfg, store_path, result_path)
    except BaseException:
        with open(f"{result_path}.rank{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


def _child_body(rank: int, cfg: dict, store_path: str, result_path: str) -> None:
    import torch.distributed as dist

    from mla_sink.core.dcp import (compact_local_indices, dcp_sparse_mla_decode, exchange_states, local_indices,
                                   shard_kv_cache, shard_num_rows)
    from mla_sink.core.inputs import DecodeInputs

    w, h, t, topk, n = cfg["dcp"], cfg["heads"], cfg["tokens"], cfg["topk"], cfg["pool_rows"]
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl", store=dist.FileStore(store_path, w), rank=rank, world_size=w,
        timeout=timedelta(seconds=300), device_id=dev,
    )
    barrier = lambda: dist.barrier(device_ids=[rank])  # noqa: E731
    gen = torch.Generator().manual_seed(0)  # same q / ids / sinks on every rank
    q = torch.randn(t, h, 576, generator=gen).to(dev, torch.bfloat16)
    indices = torch.randint(0, n, (t, topk), generator=gen, dtype=torch.int32).to(dev)
    sinks = (torch.randn(h, generator=gen) * 2).to(dev)
    sm_scale = 576**-0.5
    path, decode = _local_decode_fn()
    local = lambda x: decode(x, torch.float32)  # noqa: E731 - a rank's fp32 partial, as run() computes it
    baseline = lambda x: decode(x, None)  # noqa: E731 - DCP 1: the whole call, output in q's dtype

    # Rank 0 holds the whole pool (for DCP 1) and sends each rank its shard.
    full = None
    if rank == 0:
        full = torch.empty(n, 576, dtype=torch.bfloat16, device=dev)
        full.normal_(generator=torch.Generator(device=dev).manual_seed(1))
        shard = shard_kv_cache(full, w, 0, LAYOUT, copy=True)
        for r in range(1, w):
            dist.send(shard_kv_cache(full, w, r, LAYOUT, copy=True), dst=r)
    else:
        shard = torch.empty(shard_num_rows(n, w, rank, LAYOUT), 576, dtype=torch.bfloat16, device=dev)
        dist.recv(shard, src=0)
    barrier()

    inputs = DecodeInputs(q, shard, indices, sm_scale, sinks=sinks)
    dcp_call = lambda: dcp_sparse_mla_decode(  # noqa: E731
        inputs, group=None, layout=LAYOUT, num_kv_rows=n, local_decode=local, dcp_world_size=w
    )
    loc, loc_len = compact_local_indices(local_indices(indices, world_size=w, rank=rank, layout=LAYOUT, num_kv_rows=n))
    local_inputs = DecodeInputs(q, shard, loc, sm_scale, topk_length=loc_len)  # what the DCP call runs locally
    out_r, lse_r = local(local_inputs)
    comm_call = lambda: exchange_states(out_r, lse_r, group=None, wire_dtype=torch.float32)  # noqa: E731

    total, total_cpu = _time_ms(dcp_call, barrier)
    mine = dict(
        dcp_total_ms=total,
        dcp_total_cpu_ms=total_cpu,
        dcp_comm_ms=_time_ms(comm_call, barrier)[0],
        dcp_local_ms=_time_ms(lambda: local(local_inputs), barrier)[0],
        dcp_total_graph_ms=_graph_ms(dcp_call, barrier),
        dcp_comm_graph_ms=_graph_ms(comm_call, barrier),
        dcp_local_graph_ms=_graph_ms(lambda: local(local_inputs), barrier),
    )
    out_dcp, lse_dcp = dcp_call()
    per_rank: list = [None] * w
    dist.all_gather_object(per_rank, mine)

    if rank == 0:
        full_inputs = DecodeInputs(q, full, indices, sm_scale, sinks=sinks)
        dcp1_ms, dcp1_cpu_ms = _time_ms(lambda: baseline(full_inputs))
        dcp1_graph_ms = _graph_ms(lambda: baseline(full_inputs))
        out1, lse1 = baseline(full_inputs)
        both = torch.isfinite(lse1) & torch.isfinite(lse_dcp)
        pad = -(-t * h * (512 * 4 + 4) // 16) * 16  # fp32 partial output + fp32 LSE per rank
        comm_bytes = (w - 1) * pad
        worst = {k: (None if any(r[k] is None for r in per_rank) else max(r[k] for r in per_rank)) for k in mine}
        comm_ms = worst["dcp_comm_graph_ms"] or worst["dcp_comm_ms"]
        result = dict(
            **report_header("dcp", torch.cuda.get_device_name(dev)),
            dcp=w, heads=h, tokens=t, topk=topk, pool_rows=n, layout=LAYOUT, local_path=path,
            dtype="bf16", warmup=WARMUP, repeats=REPEATS,
            dcp1_ms=dcp1_ms, dcp1_cpu_ms=dcp1_cpu_ms, dcp1_graph_ms=dcp1_graph_ms, **worst,
            speedup_vs_dcp1=dcp1_ms / worst["dcp_total_ms"],
            speedup_vs_dcp1_graph=(
                dcp1_graph_ms / worst["dcp_total_graph_ms"] if dcp1_graph_ms and worst["dcp_total_graph_ms"] else None
            ),
            comm_bytes_in_per_rank=comm_bytes,
            comm_GBps_in_per_rank=comm_bytes / (comm_ms * 1e6),
            max_abs_out_diff_vs_dcp1=(out_dcp.float() - out1.float()).abs().max().item(),
            max_abs_lse_diff_vs_dcp1=(lse_dcp[both] - lse1[both]).abs().max().item() if both.any() else 0.0,
            per_rank=per_rank,
            env={k: os.environ.get(k) for k in NO_MULTICAST_ENV},
        )
        with open(result_path, "w") as f:
            json.dump(result, f, indent=2)
    barrier()
    dist.destroy_process_group()


def format_table(r: dict) -> str:
    """A small text table of one :func:`run_dcp_bench` result (eager and CUDA-graph medians, ms)."""
    w = r["dcp"]

    def ms(x: Optional[float]) -> str:
        return f"{x:.4f}" if x is not None else "n/a"

    def vs(base: Optional[float], x: Optional[float]) -> str:
        return f"{base / x:.2f}x" if base and x else ""

    rows = [
        ("DCP 1 (whole pool, 1 GPU)", r["dcp1_ms"], r["dcp1_graph_ms"], True),
        (f"DCP {w} whole call", r["dcp_total_ms"], r["dcp_total_graph_ms"], True),
        (f"DCP {w} local decode", r["dcp_local_ms"], r["dcp_local_graph_ms"], True),
        (f"DCP {w} communication", r["dcp_comm_ms"], r["dcp_comm_graph_ms"], False),
    ]
    head = (
        f"sparse MLA decode, bf16, T={r['tokens']} H={r['heads']} topk={r['topk']} pool={r['pool_rows']} rows, "
        f"layout={r['layout']}, local={r['local_path']}, {r['device']}"
    )
    lines = [head, f"{'what':<30}{'eager ms':>10}{'vs DCP 1':>10}{'graph ms':>10}{'vs DCP 1':>10}", "-" * 70]
    for name, eager, graph, cmp in rows:
        lines.append(
            f"{name:<30}{eager:>10.4f}{(vs(r['dcp1_ms'], eager) if cmp else ''):>10}"
            f"{ms(graph):>10}{(vs(r['dcp1_graph_ms'], graph) if cmp else ''):>10}"
        )
    lines.append(
        f"communication: {r['comm_bytes_in_per_rank'] / 2**20:.2f} MiB in per rank, "
        f"{r['comm_GBps_in_per_rank']:.1f} GB/s; "
        f"host time to issue the eager DCP call {r['dcp_total_cpu_ms']:.3f} ms; "
        f"max |out - DCP 1| = {r['max_abs_out_diff_vs_dcp1']:.3g}, "
        f"max |lse - DCP 1| = {r['max_abs_lse_diff_vs_dcp1']:.3g}"
    )
    return "\n".join(lines)


def run_dcp_bench(args: Any) -> dict:
    """Benchmark DCP over ``args.dcp`` GPUs against DCP 1 on the same total pool.

    Reads (``getattr`` with defaults): ``args.dcp`` (N ranks = GPUs, default 2), ``args.heads`` (H,
    128), ``args.tokens`` (T, 64), ``args.topk`` (2048), ``args.pool_rows`` (global pool rows N_kv,
    4M), ``args.json`` (path to write the result as JSON, or ``None``). bf16 q and KV, random ids
    over the whole pool, random sinks, ``interleaved`` layout, :data:`WARMUP` warm-up calls then the
    median of :data:`REPEATS`.

    Returns:
        The result dict (also printed as a table and written to ``args.json`` when set): times in
        ms (``dcp1_ms``, ``dcp_total_ms``, ``dcp_comm_ms``, ``dcp_local_ms``: max over ranks of each
        rank's median), ``speedup_vs_dcp1``, ``comm_bytes_in_per_rank``, ``comm_GBps_in_per_rank``,
        the max difference to the DCP 1 result, and ``per_rank`` medians.

    Raises:
        ValueError: ``args.dcp`` < 2, an int argument outside ``[1, 2^31 - 1]`` (named as its flag), ``args.json`` a
            path that cannot be written (:func:`mla_sink.tools.flags.check_output_path`), or fewer than ``args.dcp``
            CUDA devices.
        RuntimeError: a child failed or hung (its traceback
            is in the message).

    Source: NCCL environment variables (``NCCL_NVLS_ENABLE``); PyTorch symmetric memory
    (``TORCH_SYMM_MEM_DISABLE_MULTICAST``); NVSHMEM (``NVSHMEM_DISABLE_NVLS``).
    """
    cfg = {k: getattr(args, k, v) for k, v in DEFAULTS.items()}
    cfg = {k: (v if v is not None or k == "json" else DEFAULTS[k]) for k, v in cfg.items()}
    for k in ("dcp", "heads", "tokens", "topk", "pool_rows"):  # named as the flags that give them
        check_int_count(f"--{k.replace('_', '-')}", cfg[k])
    if cfg["dcp"] < 2:
        raise ValueError(f"'--dcp' must be >= 2 for the DCP benchmark (got {cfg['dcp']})")
    check_output_path("--json", cfg["json"])  # written after the ranks finish: fail before they start
    _set_no_multicast_env()
    if not torch.cuda.is_available() or torch.cuda.device_count() < cfg["dcp"]:
        n_dev = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"'--dcp' is {cfg['dcp']} but this machine has {n_dev} CUDA devices (needs {cfg['dcp']})")

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="mla_sink_dcp_bench_") as tmp:
        store, result_path = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_child, args=(r, cfg, store, result_path)) for r in range(cfg["dcp"])]
        for p in procs:
            p.start()
        for p in procs:
            p.join(CHILD_TIMEOUT_S)
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join(10)
        errs = []
        for r in range(cfg["dcp"]):
            ep = f"{result_path}.rank{r}.err"
            if os.path.exists(ep):
                with open(ep) as f:
                    errs.append(f"rank {r}:\n{f.read()}")
        if hung or errs or any(p.exitcode != 0 for p in procs) or not os.path.exists(result_path):
            raise RuntimeError(
                f"DCP benchmark failed (hung ranks: {len(hung)}, exit codes {[p.exitcode for p in procs]})\n"
                + "\n".join(errs)
            )
        with open(result_path) as f:
            result = json.load(f)
    print(format_table(result))
    if cfg["json"]:
        with open(cfg["json"], "w") as f:
            json.dump(result, f, indent=2)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m mla_sink.tools.dcp_bench --dcp 2 [--heads H --tokens T --topk K --pool-rows N --json PATH]``.
    Bad input (a ``ValueError``: too few GPUs, a flag out of range) prints one ``error:`` line and returns 2, as
    ``mla-sink bench --dcp`` does."""
    p = argparse.ArgumentParser(prog="python -m mla_sink.tools.dcp_bench",
                                description="Time decode context parallel (DCP) on N GPUs of this host against DCP 1 "
                                            "on the same pool (what mla-sink bench --dcp N runs); see docs/DCP.md.")
    p.add_argument("--dcp", type=int, default=DEFAULTS["dcp"],
                   help="ranks (GPUs of this host, one process each; default %(default)s)")
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"], help="H, query heads (default %(default)s)")
    p.add_argument("--tokens", type=int, default=DEFAULTS["tokens"], help="T, query tokens (default %(default)s)")
    p.add_argument("--topk", type=int, default=DEFAULTS["topk"], help="topk, ids per token (default %(default)s)")
    p.add_argument("--pool-rows", dest="pool_rows", type=int, default=DEFAULTS["pool_rows"],
                   help="N, rows of the global KV pool, sharded over the ranks (default %(default)s)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file (default: none)")
    args = p.parse_args(argv)
    try:
        run_dcp_bench(args)
    except ValueError as e:  # one line naming the argument, exit 2 (a fresh user's break test: it was a traceback)
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
