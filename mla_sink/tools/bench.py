"""``mla-sink bench``: time the Triton decode kernel and its peers on one GPU.

Method (see BENCHMARKS.md): every measurement is a CUDA graph replay. One graph holds ``reps``
repetitions of (read a 256 MB buffer, call); a second holds ``reps`` reads of the same buffer
alone. The read evicts the 60 MB L2 and leaves it full of clean lines, so each call starts cold
without paying for the write-back of someone else's dirty lines (a write flush adds that, about
10 us, to every call). The two graphs are replayed back to back ``replays`` times; a call's time is
the median of ``(t(call graph) - t(flush graph)) / reps`` over those pairs, so a drift of the flush's
own time during the run (clocks, temperature: 1% of a 0.68 ms read is 6.8 us per call) cancels instead
of landing on the call (the flush graph timed once, first, had put up to 9 us on the first case of a
run at T=2). Ceilings are measured in the same run: a bf16 8192^3 matmul (TFLOP/s) and a
device-to-device copy (GB/s, read + write bytes).

FLOPs of a call: ``2 * H * T * topk * (576 + 512)``; bytes: ``T * topk * row_bytes + q bytes + out bytes``
(``row_bytes`` of the cache the implementation reads: 1152 bf16, 576 fp8 e4m3, 656 for the V3.2 layout).

Peers, timed the same way in the same run on the same q, ids, sinks and ``sm_scale``: plain PyTorch
(``torch``, bf16 cases) and, when ``flash_mla`` is importable (``../shared/peers/README.md``; never a
dependency), FlashMLA's ``flash_mla_sparse_fwd`` on the bf16 cases and its fp8 decode
``flash_mla_with_kvcache`` (``flash_mla_decode``) on the fp8 cases, on the 656-byte cache of the same pool,
at the head counts they serve (64, 128); adapters and their correctness check:
:mod:`mla_sink.tools.peers`. Each case records ``ours_over_peer`` (our us ÷ the peer's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable, Optional

import torch

from mla_sink.core.kv_layout import LAYOUT as DS_MLA_KV  # the 656-byte V3.2 FP8 layout (issue #12)
from mla_sink.core.kv_layout import SCALE_CONVENTIONS
from mla_sink.core.records import D_QK, D_V, CallSpec, Platform, call_key
from mla_sink.tools import dcp_bench, peers
from mla_sink.tools.flags import check_int_count, check_not_empty, check_output_path
from mla_sink.tools.report import report_header

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
        self._flush_graph: Optional[torch.cuda.CUDAGraph] = None

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
        return [self._one_replay_ms(g) for _ in range(self.replays)]

    @staticmethod
    def _one_replay_ms(g: torch.cuda.CUDAGraph) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    def _flush_only(self) -> torch.cuda.CUDAGraph:
        if self._flush_graph is None:
            self._flush_graph = self._graph(None)
        return self._flush_graph

    def flush_ms(self) -> float:
        """Milliseconds of the flush graph alone (``reps`` reads; median of ``replays``), for the record."""
        if self._flush_ms is None:
            self._flush_ms = statistics.median(self._replay_ms(self._flush_only()))
        return self._flush_ms

    def time_us(self, fn: Callable[[], Any]) -> float:
        """Median microseconds of one cold-L2 call of ``fn``: the call graph and the flush graph replayed
        back to back ``replays`` times, the median of their differences over ``reps`` (module docstring)."""
        g = self._graph(fn)
        flush = self._flush_only()
        g.replay()
        flush.replay()
        torch.cuda.synchronize()
        diffs = []
        for _ in range(self.replays):
            call_ms = self._one_replay_ms(g)
            diffs.append(call_ms - self._one_replay_ms(flush))
        del g
        return max(0.0, statistics.median(diffs) / self.reps * 1e3)


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


def _flashinfer_peer():
    try:
        import flashinfer  # type: ignore  # noqa: F401
    except Exception:
        return None
    return None  # importable, but no sparse-MLA-with-sinks entry point is wired here


def _ours_call(q, kv_cache, indices, sinks, sm_scale, kv_scale, out, lse) -> None:
    """Our timed call: the ``triton`` path straight (``sparse_mla_decode_triton``, planned per call)."""
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    sparse_mla_decode_triton(q, kv_cache, indices, sinks, sm_scale, kv_scale=kv_scale, out=out, lse=lse)


def _ours_refuses(q, kv_cache, indices, sinks, sm_scale) -> Optional[str]:
    """Why this version of mla-sink does not take ``kv_cache`` (one call of the public
    ``sparse_mla_decode``, which validates it: a ``ValueError`` or ``NoKernelError``), or None."""
    from mla_sink import NoKernelError, sparse_mla_decode

    try:
        sparse_mla_decode(q, kv_cache, indices, sinks, sm_scale)
    except (ValueError, NoKernelError) as e:
        return f"mla-sink refuses a {kv_cache.dtype} {list(kv_cache.shape)} kv_cache: {e}"[:300]
    return None


# ---------------------------------------------------------------- cases
#: the KV dtype of the pool every case starts from (other KV caches are cast or quantised from it); the
#: peers PyTorch and FlashMLA's bf16 sparse kernel take it
BASE_KV = "bf16"
#: the grid: heads and tokens of the bf16 cases (with and without sinks), ids per token
GRID_HEADS = (16, 32, 64, 128)
GRID_TOKENS = (2, 64, 128, 256)
GRID_TOPK = 2048
#: the fp8 cases (sinks on): both fp8 caches at every grid head count and these token counts
FP8_KVS = ("fp8_e4m3", DS_MLA_KV)
FP8_TOKENS = (2, 64, 256)


def default_cases() -> list[dict]:
    """The grid (issues #11, #12): bf16 KV with and without sinks at H in {16, 32, 64, 128} x T in
    {2, 64, 128, 256}; both fp8 caches (per-tensor ``fp8_e4m3`` and the 656-byte ``fp8_ds_mla``) with
    sinks at H in {16, 32, 64, 128} x T in {2, 64, 256}; topk 2048, q bf16."""
    cases = []
    for H in GRID_HEADS:
        for T in GRID_TOKENS:
            for sinks in (True, False):
                cases.append(dict(H=H, T=T, topk=GRID_TOPK, kv=BASE_KV, sinks=sinks))
    for H in GRID_HEADS:
        for T in FP8_TOKENS:
            for kv in FP8_KVS:
                cases.append(dict(H=H, T=T, topk=GRID_TOPK, kv=kv, sinks=True))
    return cases


def case_name(c: dict, platform: Platform) -> str:
    """Canonical case name: ``call_key(spec, platform)`` + ``-T{T}-topk{topk}``.

    A KV layout the call records of this version do not name yet (``fp8_ds_mla`` before issue #12 lands)
    is named as they would name it: the key of the same call with ``fp8_e4m3`` KV, its KV part replaced.
    """
    fields = dict(q_dtype="bf16", num_heads=c["H"], topk=c["topk"], sinks=c["sinks"])
    try:
        key = call_key(CallSpec(kv_dtype=c["kv"], **fields), platform)
    except ValueError:
        stand_in = FP8_KVS[0]
        key = call_key(CallSpec(kv_dtype=stand_in, **fields), platform).replace(f"kv_{stand_in}", f"kv_{c['kv']}", 1)
    return key + f"-T{c['T']}-topk{c['topk']}"


def selected_cases(patterns: Optional[str], platform: Platform) -> list[dict]:
    """The cases of :func:`default_cases` whose :func:`case_name` on ``platform`` contains one of ``patterns``
    (``--cases``: substrings separated by commas; ``None`` or empty: every case).

    Raises:
        ValueError: naming ``--cases``, when its patterns select no case; the message gives two case names of this
            platform (their arch part is the GPU's, e.g. ``sm90``), since a name is known only once the GPU is.
    """
    cases = default_cases()
    if not patterns:
        return cases
    wanted = patterns.split(",")
    names = [case_name(c, platform) for c in cases]  # each name once, whatever the number of patterns
    chosen = [c for c, name in zip(cases, names) if any(w in name for w in wanted)]
    if not chosen:
        raise ValueError(f"'--cases' selects none of the {len(cases)} cases (got {patterns!r}); give substrings of "
                         f"case names such as {names[0]!r} or {names[-1]!r} (e.g. 'bf16-h', 'kv_fp8', '-h128-')")
    return chosen


def flash_peers_of(c: dict, peer_max_tokens: int) -> dict[str, Optional[str]]:
    """The FlashMLA peers a case gets, each with why it is skipped (None: timed).

    bf16 KV cases get ``flash_mla_sparse_fwd``, fp8 cases (both caches) FlashMLA's fp8 decode
    ``flash_mla_decode`` (on the 656-byte cache of the same pool); either only at the head counts it serves
    (:func:`mla_sink.tools.peers.skip_reason`; the decode is never called at others) and up to
    ``peer_max_tokens`` tokens.
    """
    if c["kv"] == BASE_KV:
        peer = peers.SPARSE_FWD
    elif c["kv"] in FP8_KVS:
        peer = peers.DECODE
    else:
        return {}
    reason = peers.skip_reason(peer, c["H"])
    if reason is None and c["T"] > peer_max_tokens:
        reason = f"T={c['T']} > --peer-max-tokens {peer_max_tokens}"
    return {peer: reason}


def ratios(entry: dict) -> dict[str, float]:
    """``{peer: ours us / peer us}`` for each FlashMLA peer timed beside ours in a case (< 1: ours faster)."""
    ours = entry["impls"].get("triton", {})
    out = {}
    for peer in (peers.SPARSE_FWD, peers.DECODE):
        theirs = entry["impls"].get(peer, {})
        if "us" in ours and "us" in theirs and theirs["us"] > 0:
            out[peer] = ours["us"] / theirs["us"]
    return out


class _Pools:
    """The KV pools of a run, built once on first use: the random bf16 pool (``rows`` rows), its fp8 casts,
    and the 656-byte cache of its first :func:`~mla_sink.tools.peers.ds_mla_rows` rows, tile scales of convention
    ``ds_scale`` (a failure to build that one is kept and raised again on each use)."""

    def __init__(self, rows: int, device: Any, ds_scale: str = "pow2"):
        self.rows, self.device, self.ds_scale = rows, device, ds_scale
        self.pools: dict[str, Any] = {}
        self.ds_source = ""

    def get(self, kv: str) -> torch.Tensor:
        if kv not in self.pools:
            from mla_sink.core.dtypes import TORCH_DTYPES

            if kv == BASE_KV:
                self.pools[kv] = torch.randn(self.rows, D_QK, device=self.device, dtype=TORCH_DTYPES[kv])
            elif kv == DS_MLA_KV:
                try:
                    self.pools[kv], self.ds_source = peers.ds_mla_cache(self.get(BASE_KV), self.ds_scale)
                except Exception as e:
                    self.pools[kv] = e
            else:
                self.pools[kv] = self.get(BASE_KV).to(TORCH_DTYPES[kv])
        pool = self.pools[kv]
        if isinstance(pool, Exception):
            raise RuntimeError(f"the {DS_MLA_KV} cache could not be built: {pool!r}"[:300]) from pool
        return pool


def _ds_pages_ok(value: Any) -> bool:
    """Whether ``value`` is a page size the bench can view its 656-byte cache in: 0 (flat) or an int dividing
    FlashMLA's 64-row pages (the cache's rows are a multiple of them)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0 and \
        (value == 0 or peers.FLASH_MLA_BLOCK % value == 0)


def run_cases(cases: list[dict], *, device: Any, pool_rows: int, peer_max_tokens: int, timer: Any,
              ceilings: dict, platform: Platform, flash_mla: Any = None, ds_pages: int = 0, ds_scale: str = "pow2",
              progress: Callable[[Any], Any] = lambda x: x) -> tuple[list[dict], str]:
    """Time every case on ``device`` with ``timer`` (anything with ``time_us(fn) -> float``).

    Each case draws its own q, ids (in ``[0, ds_mla_rows(pool_rows))``, so that the 656-byte cache holds
    every id) and sinks; every implementation of the case runs on those same tensors. Implementations:
    ``triton`` (ours; on the 656-byte case only when mla-sink takes that cache, else
    ``{"unavailable": why}``), ``torch`` (bf16 cases up to ``peer_max_tokens``), and with ``flash_mla``
    the peers of :func:`flash_peers_of` (``{"skipped": why}`` where a peer does not apply). ``ds_pages``: 0, or
    the page size (rows) of the paged view ``[rows / ds_pages, ds_pages, 656]`` of the same 656-byte cache that
    our calls then get (vLLM's and FlashMLA's layout at 64; FlashMLA always gets its own ``[.., 64, 1, 656]``
    view); the cache's rows are a multiple of 64, so ``ds_pages`` must divide them. ``ds_scale``: the tile
    scales of the 656-byte cache (``mla_sink.core.kv_layout.SCALE_CONVENTIONS``): ``"pow2"`` (FlashMLA's
    quantiser) or ``"amax"`` (``amax / 448``, vLLM's writer), which every implementation reads.

    Raises:
        ValueError: ``ds_pages`` not an int, negative or not a divisor of 64, or ``ds_scale`` not a convention
            (before any case runs).

    Returns:
        ``(results, ds_mla_source)``: one entry per case (``case``, the case fields, ``flops``, ``bytes``
        (ours), ``impls``: ``{name: {us, tflops, gbs, bytes, pct_matmul, pct_copy} | {error} | {skipped} |
        {unavailable}}``, ``ours_over_peer``: :func:`ratios`, ``triton_plan``) and which quantiser wrote the
        656-byte cache ("" when none was built).
    """
    if not _ds_pages_ok(ds_pages):
        raise ValueError(f"ds_pages must be 0 (a flat [N, 656] cache) or a divisor of {peers.FLASH_MLA_BLOCK}, got "
                         f"ds_pages={ds_pages!r}")
    if ds_scale not in SCALE_CONVENTIONS:
        raise ValueError(f"ds_scale must be one of {SCALE_CONVENTIONS}, got ds_scale={ds_scale!r}")
    pools = _Pools(pool_rows, device, ds_scale)
    pools.get(BASE_KV)  # drawn first, as before the peers came (same random pool for the same seed)
    id_rows = peers.ds_mla_rows(pool_rows) or pool_rows
    sm_scale = D_QK ** -0.5
    results = []
    for c in progress(cases):
        T, H, topk = c["T"], c["H"], c["topk"]
        q = torch.randn(T, H, D_QK, device=device, dtype=torch.bfloat16)
        idx = torch.randint(0, id_rows, (T, topk), device=device, dtype=torch.int32)
        sinks = torch.randn(H, device=device) if c["sinks"] else None
        out = torch.empty(T, H, D_V, device=device, dtype=torch.bfloat16)
        lse = torch.empty(T, H, device=device)
        flops = 2 * H * T * topk * (D_QK + D_V)

        def nbytes(kv: torch.Tensor) -> int:  # gathered rows + q + out
            return T * topk * kv.shape[-1] * kv.element_size() + q.numel() * 2 + out.numel() * 2

        entry: dict = dict(case=case_name(c, platform), **c, flops=flops, bytes=None, impls={})
        calls: dict[str, tuple[Callable[[], Any], int]] = {}
        try:  # ours
            kv = pools.get(c["kv"])
            if c["kv"] == DS_MLA_KV and ds_pages:  # the paged view of the same bytes: ids stay row numbers
                kv = kv.view(-1, ds_pages, kv.shape[-1])
            entry["bytes"] = nbytes(kv)
            why = _ours_refuses(q, kv, idx, sinks, sm_scale) if c["kv"] == DS_MLA_KV else None
        except Exception as e:
            entry["impls"]["triton"] = {"error": repr(e)[:300]}
        else:
            if why is not None:
                entry["impls"]["triton"] = {"unavailable": why}
            else:
                kv_scale = None if c["kv"] in (BASE_KV, DS_MLA_KV) else torch.ones(1, device=device)
                calls["triton"] = (lambda kv=kv, kv_scale=kv_scale: _ours_call(q, kv, idx, sinks, sm_scale, kv_scale,
                                                                               out, lse), entry["bytes"])
            try:
                from mla_sink.paths.triton.launch import triton_plan_for

                plan = triton_plan_for(q, kv, idx, sinks=sinks).launch
                entry["triton_plan"] = dict(row=plan.tuning_row, kernel=plan.kernel, num_kv_splits=plan.num_kv_splits)
            except Exception as e:  # a layout the tuning lookup does not know yet
                entry["triton_plan"] = {"error": repr(e)[:300]}
        if c["kv"] == BASE_KV and T <= peer_max_tokens:
            base = pools.get(BASE_KV)
            calls["torch"] = (lambda: torch_peer(q, base, idx, sinks, sm_scale), nbytes(base))
        for peer, reason in (flash_peers_of(c, peer_max_tokens).items() if flash_mla is not None else ()):
            if reason is not None:
                entry["impls"][peer] = {"skipped": reason}
                continue
            try:
                kv = pools.get(BASE_KV if peer == peers.SPARSE_FWD else DS_MLA_KV)
                make = peers.sparse_fwd_call if peer == peers.SPARSE_FWD else peers.decode_call
                calls[peer] = (make(flash_mla, q, kv, idx, sinks, sm_scale).run, nbytes(kv))
            except Exception as e:  # a peer that fails is reported, not fatal
                entry["impls"][peer] = {"error": repr(e)[:300]}
        for impl, (fn, impl_bytes) in calls.items():
            try:
                us = timer.time_us(fn)
            except Exception as e:  # a peer that fails is reported, not fatal
                entry["impls"][impl] = {"error": repr(e)[:300]}
                continue
            tflops = flops / (us * 1e-6) / 1e12 if us > 0 else float("inf")
            gbs = impl_bytes / (us * 1e-6) / 1e9 if us > 0 else float("inf")
            entry["impls"][impl] = dict(
                us=us, tflops=tflops, gbs=gbs, bytes=impl_bytes,
                pct_matmul=100 * tflops / ceilings["matmul_tflops"], pct_copy=100 * gbs / ceilings["copy_gbs"],
            )
        entry["impls"] = {k: entry["impls"][k] for k in sorted(entry["impls"], key=_impl_order)}
        entry["ours_over_peer"] = ratios(entry)
        results.append(entry)
        del q, idx, out, lse, calls
    return results, pools.ds_source


#: the order of implementations in the report and the table
IMPL_ORDER = ("triton", "torch", peers.SPARSE_FWD, peers.DECODE)


def _impl_order(name: str) -> tuple:
    return (IMPL_ORDER.index(name) if name in IMPL_ORDER else len(IMPL_ORDER), name)


def run_bench(args: argparse.Namespace, device: str = "cuda") -> dict:
    """Time every case (and each importable peer) on the current CUDA GPU; see BENCHMARKS.md "Method".
    (``device`` is for tests, which replace the timer and the ceilings.)

    Returns:
        The report: device, ceilings (``matmul_tflops``, ``copy_gbs``), ``peers`` (FlashMLA: timed, off or
        not importable, and the quantiser of the 656-byte cache), ``peer_checks``
        (:func:`mla_sink.tools.peers.peer_checks`, when FlashMLA is timed) and ``results``
        (:func:`run_cases`: per case and implementation the time in us, median of CUDA-graph replays with
        the L2 flushed before each call, TFLOP/s, gathered GB/s and both as % of the ceilings; per case
        ``ours_over_peer``).

    Raises:
        ValueError: ``--cases`` selects no case of this platform (:func:`selected_cases`), before anything is timed.
    """
    from mla_sink.core.platform import detect_platform

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **kw):
            return x

    torch.manual_seed(0)
    platform = detect_platform(device)
    cases = selected_cases(args.cases, platform)  # a --cases that selects nothing fails before anything is timed
    flash_mla, why = peers.flash_mla_unless_off(getattr(args, "peers", None))
    peer_doc: dict = {"flash_mla": {"status": "timed", "file": getattr(flash_mla, "__file__", None)}
                      if flash_mla is not None else {"status": why}}
    checks = None
    if flash_mla is not None:
        checks = peers.peer_checks(flash_mla, device)
        print(f"peer checks against the float64 reference: {json.dumps(checks)}", file=sys.stderr, flush=True)
    timer = GraphTimer(reps=args.reps, replays=args.replays, flush=args.flush)
    ceilings = measure_ceilings(timer)
    ds_pages = getattr(args, "ds_pages", None) or 0
    ds_scale = getattr(args, "ds_scale", None) or "pow2"
    results, ds_source = run_cases(
        cases, device=device, pool_rows=args.pool_rows, peer_max_tokens=args.peer_max_tokens, timer=timer,
        ceilings=ceilings, platform=platform, flash_mla=flash_mla, ds_pages=ds_pages, ds_scale=ds_scale,
        progress=lambda x: tqdm(x, desc="bench", file=sys.stderr))
    if ds_source:
        peer_doc[DS_MLA_KV + "_cache"] = ds_source
    props = torch.cuda.get_device_properties(device)
    report = dict(
        **report_header("kernels", props.name), sms=props.multi_processor_count, platform=str(platform),
        pool_rows=args.pool_rows, ds_pages=ds_pages, ds_scale=ds_scale,
        flush=args.flush, flush_us=timer.flush_ms() * 1e3,
        method=__doc__.split("Method (see BENCHMARKS.md): ")[1].split("\n\n")[0],
        ceilings=ceilings, peers=peer_doc, results=results,
        peers_missing=[n for n, ok in (("flash_mla", flash_mla is not None),
                                       ("flashinfer", _flashinfer_peer() is not None))
                       if not ok],
    )
    if checks is not None:
        report["peer_checks"] = checks
    return report


def _cell(v: Optional[dict]) -> str:
    if v is None:
        return "-"
    if "us" in v:
        return f"{v['us']:.1f}"
    return next(k for k in ("error", "unavailable", "skipped") if k in v) if v else "-"


def print_table(report: dict) -> None:
    """Print the report of :func:`run_bench` as a Markdown table: per case each implementation's us
    (``skipped``: a peer that does not serve the case; ``unavailable``: a KV layout mla-sink does not take;
    ``error``: a call that failed; the JSON says why), ours ÷ each FlashMLA peer, our TFLOP/s and GB/s."""
    res = report["results"]
    impls = sorted({i for r in res for i in r["impls"]}, key=_impl_order)
    peers_timed = [p for p in (peers.SPARSE_FWD, peers.DECODE) if any(p in r.get("ours_over_peer", {}) for r in res)]
    print(f"ceilings: matmul {report['ceilings']['matmul_tflops']:.0f} TFLOP/s, "
          f"copy {report['ceilings']['copy_gbs']:.0f} GB/s")
    print(f"peers: {json.dumps(report.get('peers', {}))}")
    for peer, doc in report.get("peer_checks", {}).items():
        if peer in (peers.SPARSE_FWD, peers.DECODE):
            print(f"peer check {peer} (float64 reference, {report['peer_checks']['shape']}): "
                  + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in doc.items()))
    print("| case | " + " | ".join(f"{i} us" for i in impls)
          + "".join(f" | ours ÷ {p}" for p in peers_timed) + " | triton TFLOP/s (% mm) | triton GB/s (% copy) |")
    print("|---" * (len(impls) + len(peers_timed) + 3) + "|")
    for r in res:
        cells = [_cell(r["impls"].get(i)) for i in impls]
        cells += [f"{r['ours_over_peer'][p]:.2f}" if p in r.get("ours_over_peer", {}) else "-" for p in peers_timed]
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
    impls = sorted({i for r in res for i in r["impls"]}, key=_impl_order)
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


#: ``mla-sink bench`` flags that must be ints in ``[1, 2^31 - 1]`` (:func:`mla_sink.tools.flags.check_int_count`;
#: ``--peer-max-tokens`` may be 0: no peers).
POSITIVE_FLAGS = ("dcp", "reps", "replays", "pool_rows", "heads", "tokens", "topk", "calls", "repeats")
#: The three modes of ``mla-sink bench``: the kernel grid (:func:`run_bench`), the host cost (``--host``,
#: :mod:`mla_sink.tools.host_bench`) and the DCP benchmark (``--dcp`` > 1, :mod:`mla_sink.tools.dcp_bench`).
GRID, HOST, DCP = "the kernel grid", "--host", "--dcp > 1"
#: Every flag that not all modes read -> {mode that reads it: its default there} (the DCP benchmark's own defaults
#: for its flags and its pool). The parser leaves them ``None`` when not given; one given in a mode that does not
#: read it is refused rather than silently ignored (a fresh user's check, twenty-ninth session: ``--dcp 2 --reps 7
#: --cases x --png x.png`` ran the DCP benchmark and dropped the three).
MODE_FLAGS = {
    **{name: {DCP: dcp_bench.DEFAULTS[name]} for name in ("heads", "tokens", "topk")},
    "calls": {HOST: 300}, "repeats": {HOST: 11},
    "cases": {GRID: ""}, "png": {GRID: ""}, "reps": {GRID: 10}, "replays": {GRID: 7}, "flush": {GRID: "read"},
    "peer_max_tokens": {GRID: 256}, "ds_pages": {GRID: 0}, "ds_scale": {GRID: "pow2"},
    "peers": {GRID: None, HOST: None},  # None: timed when importable
    "pool_rows": {GRID: 3_500_000, HOST: 3_500_000, DCP: dcp_bench.DEFAULTS["pool_rows"]},
}


def bench_mode(args: argparse.Namespace) -> str:
    """The mode of these ``mla-sink bench`` flags: :data:`DCP` for ``--dcp`` > 1, :data:`HOST` for ``--host``, else
    :data:`GRID`.

    Raises:
        ValueError: ``--host`` given with ``--dcp`` > 1 (two modes).
    """
    dcp, host = getattr(args, "dcp", 1), getattr(args, "host", False)
    if host and isinstance(dcp, int) and dcp > 1:
        raise ValueError(f"'--host' and '--dcp {dcp}' are two benchmarks; give one or the other")
    return DCP if isinstance(dcp, int) and dcp > 1 else HOST if host else GRID


def _flag(name: str, value: Any) -> str:
    """How the command line gave ``args.<name>`` = ``value``: ``--name``, ``--no-peers`` or ``--name value``."""
    if value is True:
        return f"--{name.replace('_', '-')}"
    if value is False and name == "peers":
        return "--no-peers"
    return f"--{name.replace('_', '-')} {value}"


def check_chart_path(path: str) -> None:
    """``--png``: matplotlib is importable and writes the format the path's extension names (none: PNG) - checked
    before the grid runs, which took the chart's error to its end (a fresh user's check, twenty-ninth session).

    Raises:
        ValueError: naming ``--png``: matplotlib missing, or an extension it cannot write.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ValueError(f"'--png' needs matplotlib ({e}); install it (pip install 'mla-sink[bench]') or leave the "
                         f"flag out") from None
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    formats = Figure().canvas.get_supported_filetypes()
    if ext and ext not in formats:
        raise ValueError(f"'--png' must name a chart file matplotlib writes ({', '.join(sorted(formats))}; got "
                         f"{path!r})")


def check_bench_args(args: argparse.Namespace) -> None:
    """Check the values of the ``mla-sink bench`` flags, before looking for a GPU.

    Raises:
        ValueError: naming the flag, e.g. ``'--reps' must be an int >= 1 (got 0)``; ``--ds-pages`` not 0 or a
            divisor of 64; ``--host`` with ``--dcp`` > 1; a flag of :data:`MODE_FLAGS` given (not ``None``) in a mode
            that does not read it, e.g. ``--heads`` without ``--dcp`` > 1 or ``--reps`` with ``--host``; ``--peers``
            given while ``flash_mla`` is not importable; ``--json`` / ``--png`` a path that cannot be written
            (:func:`mla_sink.tools.flags.check_output_path`), ``--png`` a chart matplotlib cannot write
            (:func:`check_chart_path`); a count outside ``[1, 2^31 - 1]`` (the kernels' int32 arguments).
    """
    for name in POSITIVE_FLAGS:  # first: a --dcp out of range decides no mode
        value = getattr(args, name, None)
        if value is not None:  # None: left out (its mode's default)
            check_int_count(f"--{name.replace('_', '-')}", value)
    mode = bench_mode(args)
    for name, modes in MODE_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None and mode not in modes:
            raise ValueError(f"'{_flag(name, True)}' applies to {' and '.join(modes)} only, not to {mode} (got "
                             f"{_flag(name, value)})")
    value = getattr(args, "peer_max_tokens", None)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"'--peer-max-tokens' must be an int >= 0 (got {value!r})")
    value = getattr(args, "ds_pages", None)
    if value is not None and not _ds_pages_ok(value):
        raise ValueError(f"'--ds-pages' must be 0 (a flat [N, 656] cache) or a divisor of {peers.FLASH_MLA_BLOCK} "
                         f"(got {value!r})")
    for flag, default in (("json", "no JSON file"), ("png", "no chart")):  # written after the run: a path that
        check_not_empty(f"--{flag}", getattr(args, flag, None), default)  # cannot be written fails now, not then
        check_output_path(f"--{flag}", getattr(args, flag, None) or "")
    cases = getattr(args, "cases", None)
    check_not_empty("--cases", cases, "every case")
    if cases is not None and not all(name.strip() for name in cases.split(",")):
        raise ValueError(f"'--cases' must be names separated by commas, none empty (got {cases!r})")
    if getattr(args, "png", None):
        check_chart_path(args.png)
    scale = getattr(args, "ds_scale", None)
    if scale is not None and scale not in SCALE_CONVENTIONS:
        raise ValueError(f"'--ds-scale' must be one of {SCALE_CONVENTIONS} (got {scale!r})")
    if getattr(args, "peers", None) is True:
        flash_mla, why = peers.import_flash_mla()
        if flash_mla is None:
            raise ValueError(f"'--peers' needs FlashMLA importable ({why}); build FlashMLA "
                             f"(github.com/deepseek-ai/FlashMLA, setup.py) and put it on PYTHONPATH, or leave the flag "
                             f"out (peers are timed when importable)")


def cmd_bench(args: argparse.Namespace) -> int:
    """``mla-sink bench``: the host-cost benchmark with ``--host``, the DCP benchmark for ``--dcp > 1``,
    else :func:`run_bench` (exit 2 without a GPU).

    Raises:
        ValueError: a flag value out of its domain (:func:`check_bench_args`), checked before the GPU; a ``--cases``
            that selects no case (:func:`selected_cases`), checked once the GPU names the cases, before anything
            is timed.
    """
    check_bench_args(args)
    mode = bench_mode(args)
    for name, modes in MODE_FLAGS.items():  # this mode's defaults, for the flags left out
        if getattr(args, name, None) is None and mode in modes:
            setattr(args, name, modes[mode])
    if mode == HOST:
        from mla_sink.tools.host_bench import cmd_host_bench

        if not torch.cuda.is_available():
            print("error: mla-sink bench --host needs a CUDA GPU", file=sys.stderr)
            return 2
        return cmd_host_bench(args)
    if mode == DCP:
        from mla_sink.tools import dcp_bench

        return dcp_bench.run_dcp_bench(args) or 0
    if not torch.cuda.is_available():
        print("error: mla-sink bench needs a CUDA GPU", file=sys.stderr)
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
    p = subparsers.add_parser("bench", help="time the Triton kernel and its peers on this GPU (cold L2, CUDA graphs)",
                              description="Time the decode on this GPU (exit 2 without one) in one of three modes: "
                                          "the kernel grid (default: bf16 and both fp8 caches, H 16-128, T 2-256, "
                                          "CUDA-graph replays with the L2 flushed, FlashMLA beside ours when "
                                          "importable), --host (the host cost of one eager call) or --dcp N (decode "
                                          "context parallel over N GPUs). A flag given in a mode that does not read "
                                          "it is refused. Method and results: BENCHMARKS.md.")
    p.add_argument("--cases", default=None,
                   help="comma-separated substrings of case names to keep (default: all), e.g. 'bf16-h' (the bf16 "
                        "cases), 'kv_fp8' (the fp8 cases), '-h128-'")
    p.add_argument("--json", default=None, help="write the report as JSON to this path (default: no JSON file)")
    p.add_argument("--png", default=None,
                   help="write a bar chart of time per case to this path (the kernel grid; needs matplotlib: "
                        "pip install 'mla-sink[bench]'; default: no chart)")
    p.add_argument("--pool-rows", type=int, default=None,
                   help=f"rows of the random KV pool (default 3.5M, ~4 GB bf16; with --dcp the DCP benchmark's "
                        f"{MODE_FLAGS['pool_rows'][DCP]})")
    p.add_argument("--reps", type=int, default=None, help="calls per CUDA graph (default 10)")
    p.add_argument("--replays", type=int, default=None, help="graph replays; the median is reported (default 7)")
    p.add_argument("--flush", choices=["read", "write"], default=None,
                   help="how the L2 is flushed before each call (default read)")
    p.add_argument("--peer-max-tokens", type=int, default=None,
                   help="time peers only up to this many tokens; 0: no peers (default 256)")
    p.add_argument("--ds-pages", type=int, default=None,
                   help="give our fp8_ds_mla calls the paged view [rows / N, N, 656] of the same cache; N is 0 or a "
                        "divisor of 64 (64: vLLM's and FlashMLA's pages; default 0: the flat [rows, 656])")
    p.add_argument("--ds-scale", choices=SCALE_CONVENTIONS, default=None,
                   help="tile scales of the fp8_ds_mla cache: pow2 (FlashMLA's quantiser, the default) or amax "
                        "(amax / 448, vLLM's writer); every implementation reads the same bytes")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--peers", dest="peers", action="store_true", default=None,
                      help="time FlashMLA beside ours (the default when flash_mla is importable; an error when not)")
    peer.add_argument("--no-peers", dest="peers", action="store_false",
                      help="do not time FlashMLA (default: timed when importable)")
    p.add_argument("--dcp", type=int, default=1,
                   help="decode-context-parallel ranks, one GPU each; > 1 runs the DCP benchmark "
                        "(mla_sink.tools.dcp_bench; default 1: no DCP)")
    for name, what in (("heads", "query heads H"), ("tokens", "query tokens T"), ("topk", "ids per token")):
        p.add_argument(f"--{name}", type=int, default=None,
                       help=f"with --dcp: {what} (default {MODE_FLAGS[name][DCP]})")
    p.add_argument("--host", action="store_true",
                   help="host cost of one eager call (function, layer, operator; FlashMLA when importable) at "
                        "T in {1, 2, 8}, H in {16, 128}, beside the GPU time (mla_sink.tools.host_bench; default: the "
                        "kernel grid)")
    p.add_argument("--calls", type=int, default=None,
                   help=f"with --host: back-to-back calls per timing (default {MODE_FLAGS['calls'][HOST]})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"with --host: timings; the median is reported (default {MODE_FLAGS['repeats'][HOST]})")
    p.set_defaults(func=cmd_bench)
    return p
