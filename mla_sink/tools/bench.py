"""``mla-sink bench``: time the Triton decode kernel and its peers on one GPU.

Method (see BENCHMARKS.md): every measurement is a CUDA graph replay. One graph holds ``reps``
repetitions of (read a 256 MB buffer, call); a second holds ``reps`` reads of the same buffer
alone. The read evicts the 60 MB L2 and leaves it full of clean lines, so each call starts cold
without paying for the write-back of someone else's dirty lines (a write flush adds that, about
10 us, to every call). A call's time is ``(t(call graph) - t(flush graph)) / reps``; the reported
number is the median over ``replays`` replays. Ceilings are measured in the same run: a bf16 8192^3 matmul (TFLOP/s) and a
device-to-device copy (GB/s, read + write bytes).

FLOPs of a call: ``2 * H * T * topk * (576 + 512)``; bytes: ``T * topk * row_bytes + q bytes + out bytes``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch

from mla_sink.core.records import CallSpec, Platform, call_key

D_QK, D_V = 576, 512
FLUSH_BYTES = 256 << 20


# ---------------------------------------------------------------- timing
class GraphTimer:
    """Times a callable by CUDA-graph replay with the L2 flushed before every call."""

    def __init__(self, reps: int = 10, replays: int = 7, flush: str = "read"):
        self.reps = reps
        self.replays = replays
        self.flush = flush
        self.flush_buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
        self.flush_out = torch.empty((), dtype=torch.float32, device="cuda")
        self._flush_ms: Optional[float] = None

    def _graph(self, fn: Optional[Callable[[], Any]]) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up (compiles Triton kernels) outside capture
                self._flush()
                if fn is not None:
                    fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(self.reps):
                self._flush()
                if fn is not None:
                    fn()
        torch.cuda.synchronize()
        return g

    def _flush(self) -> None:
        if self.flush == "read":
            torch.sum(self.flush_buf, dim=0, out=self.flush_out)
        else:
            self.flush_buf.fill_(1.0)

    def _replay_ms(self, g: torch.cuda.CUDAGraph) -> list[float]:
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return times

    def flush_ms(self) -> float:
        if self._flush_ms is None:
            self._flush_ms = statistics.median(self._replay_ms(self._graph(None)))
        return self._flush_ms

    def time_us(self, fn: Callable[[], Any]) -> float:
        """Median microseconds of one cold-L2 call of ``fn``."""
        g = self._graph(fn)
        total = statistics.median(self._replay_ms(g))
        del g
        return max(0.0, (total - self.flush_ms()) / self.reps * 1e3)


def measure_ceilings(timer: GraphTimer) -> dict:
    """bf16 8192^3 matmul TFLOP/s and device-to-device copy GB/s (read + write), measured now."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10):
        torch.mm(a, b, out=c)
    ev[1].record()
    ev[1].synchronize()
    mm_s = ev[0].elapsed_time(ev[1]) / 10 / 1e3
    del a, b, c
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(10):
        dst.copy_(src)
    ev[1].record()
    ev[1].synchronize()
    cp_s = ev[0].elapsed_time(ev[1]) / 10 / 1e3
    del src, dst
    return {"matmul_tflops": 2 * n**3 / mm_s / 1e12, "copy_gbs": 2 * (1 << 30) / cp_s / 1e9}


# ---------------------------------------------------------------- implementations
def torch_peer(q, kv_cache, indices, sinks, sm_scale):
    """Plain PyTorch: gather, bmm, fp32 softmax (the peer every GPU has)."""
    valid = (indices >= 0) & (indices < kv_cache.shape[0])
    kv = kv_cache[torch.where(valid, indices, 0).long()]  # [T, topk, 576]
    if kv.dtype != q.dtype:
        kv = kv.to(q.dtype)
    s = torch.bmm(q, kv.transpose(1, 2)).float() * sm_scale
    s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).to(q.dtype)
    out = torch.bmm(p, kv[..., :D_V]).float()
    if sinks is not None:
        out = out * torch.sigmoid(lse - sinks).unsqueeze(-1)
    return out.to(q.dtype), lse


def _flash_mla_peer():
    try:
        import flash_mla  # type: ignore
    except Exception:
        return None

    def run(q, kv_cache, indices, sinks, sm_scale):
        return flash_mla.flash_mla_sparse_fwd(q, kv_cache.unsqueeze(1), indices.unsqueeze(1), sm_scale, D_V)

    return run


def _flashinfer_peer():
    try:
        import flashinfer  # type: ignore  # noqa: F401
    except Exception:
        return None
    return None  # importable, but no sparse-MLA-with-sinks entry point is wired here


# ---------------------------------------------------------------- cases
#: the KV dtype of the pool every case starts from (other KV dtypes are cast from it); the peers
#: (PyTorch, FlashMLA's bf16 sparse kernel) take it
BASE_KV = "bf16"


def default_cases() -> list[dict]:
    """The issue's grid: H in {16, 32, 64, 128} x T in {2, 64, 256}, topk 2048, bf16 KV with and
    without sinks, plus fp8_e4m3 KV with sinks at H in {16, 128} x T in {2, 256}."""
    cases = []
    for H in (16, 32, 64, 128):
        for T in (2, 64, 256):
            for sinks in (True, False):
                cases.append(dict(H=H, T=T, topk=2048, kv=BASE_KV, sinks=sinks))
    for H in (16, 128):
        for T in (2, 256):
            cases.append(dict(H=H, T=T, topk=2048, kv="fp8_e4m3", sinks=True))
    return cases


def case_name(c: dict, platform: Platform) -> str:
    """Canonical case name: ``call_key(spec, platform)`` + ``-T{T}-topk{topk}``."""
    spec = CallSpec(q_dtype="bf16", kv_dtype=c["kv"], num_heads=c["H"], topk=c["topk"], sinks=c["sinks"])
    return call_key(spec, platform) + f"-T{c['T']}-topk{c['topk']}"


def run_bench(args: argparse.Namespace) -> dict:
    """Time every case (and each importable peer) on the current CUDA GPU; see BENCHMARKS.md "Method".

    Returns:
        The report: device, ceilings (``matmul_tflops``, ``copy_gbs``), and per case the time (us,
        median of CUDA-graph replays with the L2 flushed before each call), TFLOP/s, gathered GB/s and
        both as % of the ceilings, per implementation.
    """
    from mla_sink.core.dtypes import TORCH_DTYPES
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for
    from mla_sink.core.platform import detect_platform

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **kw):
            return x

    torch.manual_seed(0)
    platform = detect_platform("cuda")
    timer = GraphTimer(reps=args.reps, replays=args.replays, flush=args.flush)
    ceilings = measure_ceilings(timer)
    cases = default_cases()
    if args.cases:
        wanted = args.cases.split(",")
        cases = [c for c in cases if any(w in case_name(c, platform) for w in wanted)]
    impls = {"triton": None, "torch": torch_peer}
    for name, maker in (("flash_mla", _flash_mla_peer), ("flashinfer", _flashinfer_peer)):
        fn = maker()
        if fn is not None:
            impls[name] = fn
    skip_peers_over = args.peer_max_tokens
    pools: dict[str, torch.Tensor] = {}
    results = []
    sm_scale = D_QK ** -0.5
    for c in tqdm(cases, desc="bench", file=sys.stderr):
        if c["kv"] not in pools:
            base = pools.get(BASE_KV)
            if base is None:
                base = torch.randn(args.pool_rows, D_QK, device="cuda", dtype=TORCH_DTYPES[BASE_KV])
                pools[BASE_KV] = base
            if c["kv"] != BASE_KV:
                pools[c["kv"]] = base.to(torch.float8_e4m3fn)
        kv = pools[c["kv"]]
        T, H, topk = c["T"], c["H"], c["topk"]
        q = torch.randn(T, H, D_QK, device="cuda", dtype=torch.bfloat16)
        idx = torch.randint(0, args.pool_rows, (T, topk), device="cuda", dtype=torch.int32)
        sinks = torch.randn(H, device="cuda") if c["sinks"] else None
        kv_scale = torch.tensor([1.0], device="cuda") if c["kv"] != BASE_KV else None
        out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        row_bytes = D_QK * kv.element_size()
        flops = 2 * H * T * topk * (D_QK + D_V)
        nbytes = T * topk * row_bytes + q.numel() * 2 + out.numel() * 2
        name = case_name(c, platform)
        plan = triton_plan_for(q, kv, idx, sinks=sinks).launch
        entry = dict(case=name, **c, flops=flops, bytes=nbytes, impls={},
                     triton_plan=dict(row=plan.tuning_row, kernel=plan.kernel, num_kv_splits=plan.num_kv_splits))
        for impl, fn in impls.items():
            if impl != "triton" and (T > skip_peers_over or c["kv"] != BASE_KV):
                continue
            if impl == "triton":
                def call():
                    sparse_mla_decode_triton(q, kv, idx, sinks, sm_scale, kv_scale=kv_scale, out=out, lse=lse)
            else:
                def call(fn=fn):
                    fn(q, kv, idx, sinks, sm_scale)
            try:
                us = timer.time_us(call)
            except Exception as e:  # a peer that fails is reported, not fatal
                entry["impls"][impl] = {"error": repr(e)[:300]}
                continue
            tflops = flops / (us * 1e-6) / 1e12
            gbs = nbytes / (us * 1e-6) / 1e9
            entry["impls"][impl] = dict(
                us=us, tflops=tflops, gbs=gbs,
                pct_matmul=100 * tflops / ceilings["matmul_tflops"], pct_copy=100 * gbs / ceilings["copy_gbs"],
            )
        results.append(entry)
        del q, idx, out, lse
    props = torch.cuda.get_device_properties(0)
    import triton

    report = dict(
        device=props.name, sms=props.multi_processor_count, platform=str(platform),
        torch=torch.__version__, triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
        pool_rows=args.pool_rows, flush=args.flush, flush_us=timer.flush_ms() * 1e3, method=__doc__.split("Method (see BENCHMARKS.md): ")[1].split("\n\n")[0],
        ceilings=ceilings, results=results,
        peers_missing=[n for n in ("flash_mla", "flashinfer") if n not in impls],
    )
    return report


def print_table(report: dict) -> None:
    """Print the report of :func:`run_bench` as a Markdown table."""
    impls = sorted({i for r in report["results"] for i in r["impls"]}, key=lambda x: (x != "triton", x))
    print(f"ceilings: matmul {report['ceilings']['matmul_tflops']:.0f} TFLOP/s, "
          f"copy {report['ceilings']['copy_gbs']:.0f} GB/s")
    print("| case | " + " | ".join(f"{i} us" for i in impls) + " | triton TFLOP/s (% mm) | triton GB/s (% copy) |")
    print("|---" * (len(impls) + 3) + "|")
    for r in report["results"]:
        cells = []
        for i in impls:
            v = r["impls"].get(i)
            cells.append("-" if v is None else ("error" if "error" in v else f"{v['us']:.1f}"))
        t = r["impls"].get("triton", {})
        extra = (f"{t['tflops']:.0f} ({t['pct_matmul']:.0f}%) | {t['gbs']:.0f} ({t['pct_copy']:.0f}%)"
                 if "us" in t else "- | -")
        print(f"| {r['case']} | " + " | ".join(cells) + f" | {extra} |")


def plot(report: dict, path: str) -> None:
    """Write a PNG bar chart (log scale) of time per case for each implementation to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    impls = sorted({i for r in res for i in r["impls"]}, key=lambda x: (x != "triton", x))
    fig, ax = plt.subplots(figsize=(max(10, 0.45 * len(res)), 6))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        xs, ys = [], []
        for j, r in enumerate(res):
            v = r["impls"].get(impl)
            if v and "us" in v:
                xs.append(j + k * width)
                ys.append(v["us"])
        ax.bar(xs, ys, width=width, label=impl)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(res))])
    ax.set_xticklabels([r["case"].replace("-topk2048", "") for r in res], rotation=75, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (us, cold L2, CUDA-graph replay)")
    ax.set_title(f"sparse MLA decode, topk 2048, pool {report['pool_rows']} rows, {report['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


#: ``mla-sink bench`` flags that must be ints >= 1 (``--peer-max-tokens`` may be 0: no peers).
POSITIVE_FLAGS = ("dcp", "reps", "replays", "pool_rows", "heads", "tokens", "topk", "calls", "repeats")


def check_bench_args(args: argparse.Namespace) -> None:
    """Check the values of the ``mla-sink bench`` flags, before looking for a GPU.

    Raises:
        ValueError: naming the flag, e.g. ``'--reps' must be an int >= 1 (got 0)``.
    """
    for name in POSITIVE_FLAGS:
        value = getattr(args, name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"'--{name.replace('_', '-')}' must be an int >= 1 (got {value!r})")
    value = getattr(args, "peer_max_tokens", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"'--peer-max-tokens' must be an int >= 0 (got {value!r})")


def cmd_bench(args: argparse.Namespace) -> int:
    """``mla-sink bench``: the host-cost benchmark with ``--host``, the DCP benchmark for ``--dcp > 1``,
    else :func:`run_bench` (exit 2 without a GPU).

    Raises:
        ValueError: a flag value out of its domain (:func:`check_bench_args`), checked before the GPU.
    """
    check_bench_args(args)
    if args.host:
        from mla_sink.tools.host_bench import cmd_host_bench

        if not torch.cuda.is_available():
            print("mla-sink bench --host needs a CUDA GPU", file=sys.stderr)
            return 2
        return cmd_host_bench(args)
    if args.dcp > 1:
        from mla_sink.tools import dcp_bench

        return dcp_bench.run_dcp_bench(args) or 0
    if not torch.cuda.is_available():
        print("mla-sink bench needs a CUDA GPU", file=sys.stderr)
        return 2
    report = run_bench(args)
    print_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.png:
        plot(report, args.png)
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to an argparse subparsers object (dispatched via ``args.func``)."""
    p = subparsers.add_parser("bench", help="time the Triton kernel and its peers on this GPU (cold L2, CUDA graphs)")
    p.add_argument("--cases", default="", help="comma-separated substrings of case names to keep (default: all)")
    p.add_argument("--json", default="", help="write the report as JSON here")
    p.add_argument("--png", default="", help="write a bar chart of time per case here")
    p.add_argument("--pool-rows", type=int, default=3_500_000, help="rows of the random KV pool (default 3.5M, ~4 GB bf16)")
    p.add_argument("--reps", type=int, default=10, help="calls per CUDA graph")
    p.add_argument("--replays", type=int, default=7, help="graph replays; the median is reported")
    p.add_argument("--flush", choices=["read", "write"], default="read", help="how the L2 is flushed before each call")
    p.add_argument("--peer-max-tokens", type=int, default=256, help="time peers only up to this many tokens")
    p.add_argument("--dcp", type=int, default=1, help="decode-context-parallel ranks (>1 runs mla_sink.tools.dcp_bench)")
    p.add_argument("--heads", type=int, default=128, help="with --dcp: query heads H (default 128)")
    p.add_argument("--tokens", type=int, default=64, help="with --dcp: query tokens T (default 64)")
    p.add_argument("--topk", type=int, default=2048, help="with --dcp: ids per token (default 2048)")
    p.add_argument("--host", action="store_true",
                   help="host cost of one eager call (function, layer, operator; FlashMLA when importable) at "
                        "T in {1, 2, 8}, H in {16, 128}, beside the GPU time (mla_sink.tools.host_bench)")
    p.add_argument("--calls", type=int, default=300, help="with --host: back-to-back calls per timing")
    p.add_argument("--repeats", type=int, default=11, help="with --host: timings; the median is reported")
    p.set_defaults(func=cmd_bench)
    return p
