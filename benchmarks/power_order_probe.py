"""Does the board's power state move the bench's timings of the 32-head T=256 cases (sixtieth session,
2026-12-06)? ``clock_probe.py`` found every one of them at the 700 W cap under sustained load on an H100 (SM clock
1.67-1.86 GHz against 1.98 unloaded), so a case's timing may depend on what ran just before it.

Each timing is the bench's own (``mla_sink.tools.bench.GraphTimer``: CUDA-graph replay, L2 flushed before every call,
median over replays), on the data of ``seesaw_wgmma_ab.case_call`` (topk 2048, bf16 q, sinks, uniform random ids over
3.5 M rows, power-of-two V3.2 scales). Schedules, each over the three caches at H=32 T=256:

* ``back_to_back``: bf16, e4m3, V3.2, twice, with nothing between (the bench's order within a shape);
* ``reversed``: V3.2, e4m3, bf16, twice;
* ``idle_first``: each case after ``IDLE_S`` seconds of idle (the board back at its unloaded clock);
* ``loaded_first``: each case right after ``LOAD_S`` seconds of sustained bf16 H=32 T=256 calls (at the cap).

``nvidia-smi`` samples the SM clock and the power every ``SAMPLE_MS`` with timestamps; each timing's wall-clock
interval picks its samples (median SM clock reported, ``null`` where none fell inside).

    PYTHONPATH=. python3 -u benchmarks/power_order_probe.py OUT.json
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time

import torch

from clock_probe import call_graph
from seesaw_wgmma_ab import case_caches, case_call

H, T = 32, 256
KVS = ("bf16", "fp8_e4m3", "fp8_ds_mla")
IDLE_S, LOAD_S, SAMPLE_MS = 3.0, 2.0, 20


def _calls() -> dict:
    caches = case_caches()
    return {kv: case_call(caches, kv, H, T) for kv in KVS}


def _sustain(graph: torch.cuda.CUDAGraph, seconds: float) -> None:
    """``graph`` replayed back to back for ``seconds`` (the board at its power cap)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        graph.replay()
        torch.cuda.synchronize()


def main(path: str) -> None:
    from mla_sink.tools.bench import GraphTimer
    calls = _calls()
    timer = GraphTimer(reps=10, replays=7)
    for k in KVS:  # compile and warm every case once
        timer.time_us(calls[k])
    load = call_graph(calls["bf16"])  # the sustained load of ``loaded_first``, captured once
    sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,"
                                "nounits", f"-lms={SAMPLE_MS}"], stdout=subprocess.PIPE, text=True)
    time.sleep(IDLE_S)
    timings = []

    def timed(schedule: str, kv: str) -> None:
        t0 = datetime.datetime.now()
        us = timer.time_us(calls[kv])
        timings.append(dict(schedule=schedule, kv=kv, us=round(us, 2), t0=t0, t1=datetime.datetime.now()))
        print(schedule, kv, round(us, 2), flush=True)

    for _ in range(2):
        for kv in KVS:
            timed("back_to_back", kv)
    for _ in range(2):
        for kv in reversed(KVS):
            timed("reversed", kv)
    for _ in range(2):
        for kv in KVS:
            time.sleep(IDLE_S)
            timed("idle_first", kv)
    for _ in range(2):
        for kv in KVS:
            _sustain(load, LOAD_S)
            timed("loaded_first", kv)
    time.sleep(0.2)
    sampler.terminate()
    samples = []
    for line in sampler.communicate()[0].splitlines():
        parts = [x.strip() for x in line.split(",")]
        try:
            samples.append((datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1]),
                            float(parts[2])))
        except (ValueError, IndexError):
            continue
    for t in timings:
        inside = [s for s in samples if t["t0"] <= s[0] <= t["t1"]]
        t["sm_mhz"] = statistics.median(s[1] for s in inside) if inside else None
        t["power_w"] = statistics.median(s[2] for s in inside) if inside else None
        t["samples"] = len(inside)
        t["ms"] = round((t.pop("t1") - t.pop("t0")).total_seconds() * 1e3, 1)
    summary = {}
    for t in timings:
        summary.setdefault(t["schedule"], {}).setdefault(t["kv"], []).append(t["us"])
    report = {"device": torch.cuda.get_device_name(), "timings": timings, "summary_us": summary}
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
