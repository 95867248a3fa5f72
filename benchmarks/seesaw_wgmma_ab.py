"""A/B of the seesaw kernel's wgmma pipelining (sixth session, 2026-12-01). Until this session ptxas
serialised every wgmma of the kernel (C7515 / C7514: a wgmma's registers were copied or read while it was in
flight), so each 16-deep step waited for the one before. Variants, on the same data through the library
(``mla_sink.sparse_mla_decode``, the plan's own splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048:

* ``old``: the kernel before this session (the tree at ``ab_old/``, run in a child process);
* ``new``: the current tree.

Runs of 2026-12-01 (BENCHMARKS.md, sixth session):

* ``seesaw_wgmma_ab_first_2026-12-01.json``: ``fix`` is the kernel kept (the waits fixed; consumer 0 waits
  for its last P V inside the pair), and ``fix+pf+fpt`` is the same kernel with an L2 prefetch of the next
  pair's rows and per-thread slot releases. Those two changed nothing beyond 0.5 us and were dropped. The
  ``old`` run failed there: its tree lacked its tables.
* ``seesaw_wgmma_ab_pipelined_2026-12-01.json``: ``new`` was a software-pipelined consumer 0, which was
  slower and was reverted. It issued the next pair's scores while the odd block's P V ran, as FlashMLA's
  warpgroup 0 does, and took 232 registers from the other partitions.

It also checks each variant's output against ``old``'s on the same inputs (max abs difference of ``out``).

    PYTHONPATH=. python3 -u benchmarks/seesaw_wgmma_ab.py benchmarks/seesaw_wgmma_ab_<date>.json [ab_old]

``ab_old`` holds ``git archive <old commit> mla_sink dispatch tables pyproject.toml`` (not committed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

D_QK, TOPK, N = 576, 2048, 3_500_000
CASES = [("bf16", 64, 2), ("bf16", 128, 2), ("bf16", 64, 64), ("bf16", 128, 64), ("bf16", 64, 256),
         ("bf16", 128, 256), ("fp8_e4m3", 128, 256), ("fp8_ds_mla", 64, 2), ("fp8_ds_mla", 128, 2),
         ("fp8_ds_mla", 64, 64), ("fp8_ds_mla", 128, 64), ("fp8_ds_mla", 64, 256), ("fp8_ds_mla", 128, 256)]


def case_caches() -> dict:
    """The caches every case of these A/Bs reads (seed 0): ``{kv_dtype: (kv_cache, kv_scale)}`` for ``bf16`` (``N``
    rows of N(0, 0.25) values), ``fp8_e4m3`` (the same values cast, ``kv_scale`` 1) and ``fp8_ds_mla`` (the same
    values quantised with power-of-two tile scales, or with ``AB_DS_SCALE=amax`` in the environment (seventy-fifth
    session) vLLM's ``amax / 448``), on the GPU."""
    from mla_sink import quantize_kv_cache
    torch.manual_seed(0)
    kv = (torch.randn(N, D_QK, device="cuda") * 0.5).to(torch.bfloat16)
    return {"bf16": (kv, None), "fp8_e4m3": (kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")),
            "fp8_ds_mla": (quantize_kv_cache(kv, scale=os.environ.get("AB_DS_SCALE", "pow2")), None)}


def case_call(caches: dict, kv_dtype: str, H: int, T: int):
    """The call of one case on ``caches`` (:func:`case_caches`): q ``[T, H, 576]`` bf16, ``TOPK`` uniform random ids a
    token over the pool, sinks N(2, 1), all drawn from a generator seeded ``H * 1000 + T``; returns the closure that
    calls ``mla_sink.sparse_mla_decode`` (``return_lse=True``) on them. With ``AB_POOL=P`` in the environment
    (seventy-first session) the ids are drawn from the pool's first ``P`` rows only, so that after a replay's first
    touches the gathers hit the L2 (P = 16384 V3.2 rows: 10.7 MB): the kernel's time without HBM on the period."""
    import mla_sink
    g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    pool = int(os.environ.get("AB_POOL", "0")) or N
    idx = torch.randint(0, pool, (T, TOPK), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(H, device="cuda", generator=g) + 2.0
    cache, sc = caches[kv_dtype]
    return lambda: mla_sink.sparse_mla_decode(q, cache, idx, sinks, kv_scale=sc, return_lse=True)


def run_variant(variant: str, dump: str, cases: list = CASES) -> dict:
    """Time every case of ``cases`` (``(kv_dtype, H, T)``) with the ``mla_sink`` on the path (``variant``: the
    label printed) and save the outputs to ``dump``; the first case is timed twice, the first timing discarded.
    With ``AB_DS_PAGES=P`` in the environment (eighteenth session) the V3.2 cases read the paged view
    ``[rows / P, P, 656]`` of the cache's first ``N - N % P`` rows (ids past them are skipped, as ids >= N are), vLLM's
    and FlashMLA's layout at ``P = 64``."""
    from mla_sink.tools.bench import GraphTimer
    timer = GraphTimer(reps=10, replays=7)
    caches = case_caches()
    pages = int(os.environ.get("AB_DS_PAGES", "0"))
    if pages:
        ds = caches["fp8_ds_mla"][0]
        caches["fp8_ds_mla"] = (ds[:N - N % pages].view(-1, pages, ds.shape[-1]), None)
    res, outs = {}, {}
    first = True
    for kv_dtype, H, T in cases:
        fn = case_call(caches, kv_dtype, H, T)
        o, _ = fn()
        key = f"{kv_dtype}-h{H}-T{T}"
        outs[key] = o.float().cpu()
        if first:  # the first timing of a fresh process reads slow (forty-ninth session: 89 against 81 us, 231
            # against 201 for V3.2 H=32 T=256), so the first case is timed twice and the second kept
            timer.time_us(fn)
            first = False
        res[key] = round(timer.time_us(fn), 2)
        print(variant, key, res[key], flush=True)
    torch.save(outs, dump)
    return res


def main(path: str, old_tree: str = "ab_old") -> None:
    out_dir = os.path.dirname(os.path.abspath(path))
    report: dict = {"cases": [f"{k}-h{h}-T{t}" for k, h, t in CASES], "us": {}, "max_abs_diff_vs_old": {}}
    if os.path.isdir(old_tree):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(old_tree))
        code = (f"import sys, json; sys.path.insert(0, {os.path.abspath(os.path.dirname(__file__))!r}); "
                f"import seesaw_wgmma_ab as m; print('OLDJSON', json.dumps(m.run_variant('old', "
                f"{os.path.join(out_dir, 'ab_old.pt')!r})))")
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.abspath(old_tree), capture_output=True,
                           text=True)
        print(r.stdout[-3000:], r.stderr[-3000:])
        line = [x for x in r.stdout.splitlines() if x.startswith("OLDJSON")]
        if line:
            report["us"]["old"] = json.loads(line[0][len("OLDJSON"):])
    dump = os.path.join(out_dir, "ab_new.pt")
    report["us"]["new"] = run_variant("new", dump)
    old_pt = os.path.join(out_dir, "ab_old.pt")
    if os.path.exists(old_pt):
        a, b = torch.load(old_pt), torch.load(dump)
        report["max_abs_diff_vs_old"]["new"] = {k: float((a[k] - b[k]).abs().max()) for k in a}
    for f in ("ab_old.pt", "ab_new.pt"):
        if os.path.exists(os.path.join(out_dir, f)):
            os.remove(os.path.join(out_dir, f))
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
