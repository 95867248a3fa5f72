"""The SM clock and board power while one few-heads case runs back to back (sixtieth session, 2026-12-06): does the
V3.2 (``fp8_ds_mla``) launch at H=32 T=256 run at a lower clock than bf16's at the same shape (a power limit would
put part of issue #12's last miss on the clock, not on the kernel's chain)?

Per case (``(kv_dtype, H, T)``, the data of ``seesaw_wgmma_ab.case_call``: topk 2048, bf16 q, sinks, uniform
random ids over the pool, power-of-two V3.2 scales): one CUDA graph of ``REPLAYS_PER_GRAPH`` calls is replayed for
``SECONDS`` while ``nvidia-smi`` samples the SM clock, the memory clock, the power draw and the active throttle
reasons every ``SAMPLE_MS``; the medians of the samples taken after the first ``WARM_S`` seconds are reported with the
mean time per call over that loop (no L2 flush between calls: a sustained load, not the bench's timing).

    PYTHONPATH=. python3 -u benchmarks/clock_probe.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import torch

from seesaw_wgmma_ab import case_caches, case_call

CASES = [("bf16", 32, 256), ("fp8_ds_mla", 32, 256), ("fp8_e4m3", 32, 256), ("bf16", 16, 256),
         ("fp8_ds_mla", 16, 256)]
REPLAYS_PER_GRAPH = 20
SECONDS, WARM_S, SAMPLE_MS = 4.0, 1.0, 50
QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def _sampler() -> subprocess.Popen:
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                             f"-lms={SAMPLE_MS}"], stdout=subprocess.PIPE, text=True)


def _parse(lines: list) -> dict:
    rows = [[x.strip() for x in line.split(",")] for line in lines if line.count(",") == 4]
    if not rows:
        return {"samples": 0}
    col = lambda i: [float(r[i]) for r in rows if r[i].replace(".", "", 1).isdigit()]  # noqa: E731
    reasons = sorted({r[4] for r in rows})
    return {"samples": len(rows), "sm_mhz": statistics.median(col(0)), "sm_mhz_min": min(col(0)),
            "mem_mhz": statistics.median(col(1)), "power_w": statistics.median(col(2)),
            "temp_c": statistics.median(col(3)), "throttle_reasons": reasons}


def call_graph(fn) -> torch.cuda.CUDAGraph:
    """``fn`` called three times (compiled and warm), then captured ``REPLAYS_PER_GRAPH`` times in one CUDA graph,
    replayed once."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAYS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def run_case(kv_dtype: str, H: int, T: int, caches: dict) -> dict:
    """One case: :func:`call_graph` of the call, replayed for ``SECONDS`` under the sampler. Returns the samples'
    medians and ``us_per_call``."""
    graph = call_graph(case_call(caches, kv_dtype, H, T))
    proc = _sampler()
    t0 = time.perf_counter()
    warm_calls, warm_t, calls = 0, None, 0
    while time.perf_counter() - t0 < SECONDS:
        graph.replay()
        calls += REPLAYS_PER_GRAPH
        if warm_t is None and time.perf_counter() - t0 >= WARM_S:
            torch.cuda.synchronize()
            warm_t, warm_calls = time.perf_counter(), calls
        if calls % (REPLAYS_PER_GRAPH * 20) == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    proc.terminate()
    out = proc.communicate()[0].splitlines()
    skip = int(WARM_S * 1000 / SAMPLE_MS)
    res = _parse(out[skip:])
    res["us_per_call"] = round((t1 - warm_t) * 1e6 / (calls - warm_calls), 2)
    return res


def main(path: str) -> None:
    caches = case_caches()
    report = {"device": torch.cuda.get_device_name(), "cases": {}}
    for rnd in range(2):  # two rounds, so a drift of the board's state over the run shows
        for kv_dtype, H, T in CASES:
            key = f"{kv_dtype}-h{H}-T{T}-r{rnd}"
            report["cases"][key] = run_case(kv_dtype, H, T, caches)
            print(key, report["cases"][key], flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
