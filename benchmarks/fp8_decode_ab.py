"""A/B of where the seesaw kernel decodes an fp8 cache (seventh session, 2026-12-01). Each variant is a tree
(``mla_sink``, ``dispatch``, ``tables``) run in a child process on the same data through the library
(``mla_sink.sparse_mla_decode``, the plan's own splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048;
every variant's ``out`` is compared with the first one's (max abs difference).

    PYTHONPATH=. python3 -u benchmarks/fp8_decode_ab.py OUT.json NAME=TREE [NAME=TREE ...]

``TREE`` holds ``git archive <commit> mla_sink dispatch tables`` (or ``.`` for the working tree).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

D_QK, TOPK, N = 576, 2048, 3_500_000
CASES = [(kv, h, t) for kv in ("fp8_e4m3", "fp8_ds_mla") for h in (64, 128) for t in (2, 64, 256)]
CASES += [("bf16", 64, 256), ("bf16", 128, 256)]


def run_variant(variant: str, dump: str) -> dict:
    """Time every case with the ``mla_sink`` on the path and save the outputs to ``dump``."""
    import mla_sink
    from mla_sink import quantize_kv_cache
    from mla_sink.tools.bench import GraphTimer
    torch.manual_seed(0)
    timer = GraphTimer(reps=10, replays=7)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    caches = {"bf16": (kv, None), "fp8_e4m3": (kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")),
              "fp8_ds_mla": (quantize_kv_cache(kv, scale="pow2"), None)}
    res, outs = {}, {}
    for kv_dtype, H, T in CASES:
        g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
        q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
        sinks = torch.randn(H, device="cuda", generator=g) + 2.0
        cache, sc = caches[kv_dtype]
        fn = lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc, return_lse=True)  # noqa: E731
        o, _ = fn()
        key = f"{kv_dtype}-h{H}-T{T}"
        outs[key] = o.float().cpu()
        res[key] = round(timer.time_us(fn), 2)
        print(variant, key, res[key], flush=True)
    torch.save(outs, dump)
    return res


def main(path: str, *variants: str) -> None:
    out_dir = os.path.dirname(os.path.abspath(path))
    here = os.path.abspath(os.path.dirname(__file__))
    report: dict = {"cases": [f"{k}-h{h}-T{t}" for k, h, t in CASES], "us": {}, "max_abs_diff_vs_first": {}}
    dumps = []
    for spec in variants:
        name, tree = spec.split("=", 1)
        dump = os.path.join(out_dir, f"ab_{name}.pt")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        code = (f"import sys, json; sys.path.insert(0, {here!r}); import fp8_decode_ab as m; "
                f"print('JSON', json.dumps(m.run_variant({name!r}, {dump!r})))")
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.abspath(tree), capture_output=True,
                           text=True)
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        line = [x for x in r.stdout.splitlines() if x.startswith("JSON")]
        if line:
            report["us"][name] = json.loads(line[0][len("JSON"):])
            dumps.append((name, dump))
    if dumps:
        first = torch.load(dumps[0][1])
        for name, dump in dumps[1:]:
            other = torch.load(dump)
            report["max_abs_diff_vs_first"][name] = {k: float((first[k] - other[k]).abs().max()) for k in first}
    for _, dump in dumps:
        os.remove(dump)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
