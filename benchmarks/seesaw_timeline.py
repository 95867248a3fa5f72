"""Where the seesaw kernel's time goes at H=128 (bf16): a timeline of every CTA from ``%globaltimer``
(eleventh session, 2026-12-01).

The script copies the ``mla_sink`` package of a tree into a temporary directory and inserts timestamp stores
into that copy of ``mla_sink/kernels/gluon/gluon_seesaw.py`` (the library's kernel is not changed). The
stamps go to a float32 buffer passed as ``kv_scale``, which a bf16 launch never reads; 64 words per CTA:
0 kernel entry, 1 producer start, 2 q copies issued, 3 first pair's copies issued, 4 / 5 consumer 0 / 1
past q ready, 6 / 11 consumer 0 / 1 first scores done, 7 / 8 loop exits, 9 / 10 epilogues done, 16 + j
consumer 0 at the start of pair j. One eager launch after an L2 flush, five times; medians over CTAs and
runs. Also timed by CUDA-graph replay (the bench's timer): the kernel with every ``topk_length`` 0 (q loaded,
zeros written), FlashMLA's ``sparse_fwd`` (when importable; the peer build has no ``topk_length`` variant), and
an empty ``lse.zero_()``.

    PYTHONPATH=.peers/FlashMLA:. python3 -u benchmarks/seesaw_timeline.py OUT.json [TREE]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile

import torch

D_QK, D_V, N, H = 576, 512, 1 << 20, 128
SLOTS = 64

HELPER = '''
@gluon.jit
def _now(x):
    """%globaltimer_lo (ns), as the float32 bits of a timeline word (``x``: any int32 scalar)."""
    t = gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo; // $1", "=r,r", [x], dtype=gl.int32,
                                  is_pure=False, pack=1)
    return t.to(gl.float32, bitcast=True)

'''


def sub(s: str, old: str, new: str, count: int = 1) -> str:
    """``s`` with ``old`` replaced by ``new`` ``count`` times (-1: everywhere); ``old`` must occur (the kernel
    source changed otherwise)."""
    assert s.count(old) >= max(count, 1), old
    return s.replace(old, new, count)


def patch(src: str) -> str:
    """The kernel source with the timeline stores (see the module docstring)."""
    s = sub(src, "#: Heads of one CTA", HELPER + "#: Heads of one CTA")
    tl = "TL = KV_SCALE + (pid_t * gl.num_programs(0) + pid_h) * 64"
    # producer: KV_SCALE passed through
    s = sub(s, "def _producer(Q, KV, IDX,", "def _producer(KV_SCALE, Q, KV, IDX,")
    s = sub(s, "        _producer(Q, KV, IDX,", "        _producer(KV_SCALE, Q, KV, IDX,")
    s = sub(s, "def _any_producer(Q, KV, IDX,", "def _any_producer(KV_SCALE, Q, KV, IDX,")
    s = sub(s, "(_any_producer, (Q, KV, IDX,", "(_any_producer, (KV_SCALE, Q, KV, IDX,")
    s = sub(s, "    nrows = num_rows.to(gl.uint32)\n    gather_q(",
             f"    nrows = num_rows.to(gl.uint32)\n    {tl}\n    gl.store(TL + 1, _now(pid_h))\n    gather_q(")
    s = sub(s, "              BLOCK_H, HALF_V, D_ROPE, ROWS, half_l, rope_l)\n",
             "              BLOCK_H, HALF_V, D_ROPE, ROWS, half_l, rope_l)\n    gl.store(TL + 2, _now(pid_h))\n")
    s = sub(s, "        async_copy.mbarrier_arrive(ready_lo.index(1), increment_count=False)\n",
             "        async_copy.mbarrier_arrive(ready_lo.index(1), increment_count=False)\n"
             "        if j == 0:\n            gl.store(TL + 3, _now(j))\n")
    # kernel entry
    s = sub(s, "    if LAUNCH_DEPENDENTS:\n        launch_dependents",
             "    gl.store(KV_SCALE + (gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)) * 64, _now(gl.program_id(0)))\n"
             "    if LAUNCH_DEPENDENTS:\n        launch_dependents")
    c0_at = s.index("def _consumer_even")
    c1_at = s.index("def _consumer_odd")
    k_at = s.index("def sparse_mla_decode_seesaw_kernel")
    c0, c1 = s[c0_at:c1_at], s[c1_at:k_at]
    for body, me, first, exit_, done, ret in ((c0, 4, 6, 7, 9, "0, False, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)\n"),
                                              (c1, 5, 11, 8, 10, "HALF_V, True, BLOCK_H, HALF_V, HAS_SINKS, SPLIT, KV_FMT)\n")):
        new = sub(body, "    j = num_pairs * 0\n", f"    j = num_pairs * 0\n    {tl}\n    gl.store(TL + {me}, _now(j))\n")
        new = sub(new, "        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))\n",
                   "        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))\n"
                   f"        if j == 0:\n            gl.store(TL + {first}, _now(j))\n")
        if me == 4:
            new = sub(new, "        phase = j & 1\n", "        phase = j & 1\n        gl.store(TL + 16 + j, _now(j), mask=j < 48)\n")
        new = sub(new, "    _epilogue(o, m_i,", f"    gl.store(TL + {exit_}, _now(j))\n    _epilogue(o, m_i,")
        new = sub(new, ret, ret + f"    gl.store(TL + {done}, _now(j))\n")
        s = s.replace(body, new)
    return s


def load_patched(tree: str, module: str = "gluon_seesaw", patcher=None):
    """Import ``mla_sink.kernels.gluon.<module>`` from a copy of ``tree``'s package (``mla_sink``, ``dispatch``,
    ``tables``, ``pyproject.toml``) in which that module's source went through ``patcher`` (default: this
    script's :func:`patch`); the library's own files are not changed."""
    import importlib
    tmp = tempfile.mkdtemp(prefix=f"{module}_tl_")
    shutil.copytree(os.path.join(tree, "mla_sink"), os.path.join(tmp, "mla_sink"))
    for d in ("dispatch", "tables"):
        shutil.copytree(os.path.join(tree, d), os.path.join(tmp, d))
    shutil.copy(os.path.join(tree, "pyproject.toml"), tmp)
    path = os.path.join(tmp, "mla_sink", "kernels", "gluon", f"{module}.py")
    with open(path) as f:
        src = f.read()
    with open(path, "w") as f:
        f.write((patcher or patch)(src))
    sys.path.insert(0, tmp)
    for m in [m for m in sys.modules if m == "mla_sink" or m.startswith("mla_sink.")]:
        del sys.modules[m]
    mod = importlib.import_module(f"mla_sink.kernels.gluon.{module}")
    assert mod.__file__.startswith(tmp), mod.__file__
    return mod


def relative_stamps(words: torch.Tensor) -> torch.Tensor:
    """``%globaltimer_lo`` words ``[CTAs, slots]`` (int32 bits) as int64 ns after the earliest kernel entry
    (slot 0), across the 32-bit wrap."""
    raw = words.to(torch.int64) & 0xFFFFFFFF
    return (raw - raw[:, 0].min()) % (1 << 32)


def _phases(tl: torch.Tensor, pairs: int) -> dict:
    """Per-phase ns of one run: ``tl`` int64 ``[CTAs, 64]`` (stamps relative to the earliest entry)."""
    def med(x):
        return float(x.double().median())

    def mx(x):
        return float(x.double().max())

    steps = tl[:, 17:16 + pairs] - tl[:, 16:15 + pairs]
    return {
        "entry_spread_max": mx(tl[:, 0]),
        "entry_to_producer": med(tl[:, 1] - tl[:, 0]),
        "q_issue": med(tl[:, 2] - tl[:, 1]),
        "first_pair_issued": med(tl[:, 3] - tl[:, 0]),
        "c0_q_ready": med(tl[:, 4] - tl[:, 0]),
        "c1_q_ready": med(tl[:, 5] - tl[:, 0]),
        "c0_first_scores": med(tl[:, 6] - tl[:, 0]),
        "c1_first_scores": med(tl[:, 11] - tl[:, 0]),
        "c0_pair0_start": med(tl[:, 16] - tl[:, 0]),
        "pair_median": med(steps),
        "pair_mean": float(steps.double().mean()),
        "pair_first": med(steps[:, 0]),
        "pair_last": med(tl[:, 7] - tl[:, 15 + pairs]),
        "c0_epilogue": med(tl[:, 9] - tl[:, 7]),
        "c1_epilogue": med(tl[:, 10] - tl[:, 8]),
        "cta_total_median": med(torch.maximum(tl[:, 9], tl[:, 10]) - tl[:, 0]),
        "cta_total_max": mx(torch.maximum(tl[:, 9], tl[:, 10]) - tl[:, 0]),
        "last_end": mx(torch.maximum(tl[:, 9], tl[:, 10])),
    }


def timeline(gs, T: int, topk: int, runs: int = 5) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T * 10000 + topk)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(H, device="cuda", generator=g) + 2.0
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    flush = torch.ones(1 << 28, device="cuda")
    ctas = T * ((H + 63) // 64)
    buf = torch.zeros(ctas * SLOTS, device="cuda")
    out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(T, H, device="cuda")
    pairs = topk // 128
    per_run = []
    for r in range(runs + 1):
        buf.zero_()
        flush.sum()
        gs.sparse_mla_decode_seesaw(q, kv, idx, sinks, out=out, lse=lse, kv_scale=buf)
        torch.cuda.synchronize()
        tl = relative_stamps(buf.view(torch.int32).view(ctas, SLOTS))
        if r:  # the first run compiles
            per_run.append(_phases(tl, pairs))
    return {k: round(statistics.median(p[k] for p in per_run) / 1e3, 3) for k in per_run[0]}


def graph_times(gs, fm) -> dict:
    from mla_sink.tools.bench import GraphTimer
    timer = GraphTimer(reps=10, replays=7)
    res = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    for T in (64, 2):
        q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, N, (T, 2048), device="cuda", dtype=torch.int32, generator=g)
        sinks = torch.randn(H, device="cuda", generator=g)
        zero = torch.zeros(T, dtype=torch.int32, device="cuda")
        out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(T, H, device="cuda")
        res[f"seesaw_topk_length0_T{T}"] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
            q, kv, idx, sinks, topk_length=zero, out=out, lse=lse)), 2)
        res[f"seesaw_T{T}"] = round(timer.time_us(lambda: gs.sparse_mla_decode_seesaw(
            q, kv, idx, sinks, out=out, lse=lse)), 2)
        if fm is not None:
            kv3, idx3 = kv.unsqueeze(1), idx.unsqueeze(1)
            res[f"flash_mla_sparse_fwd_T{T}"] = round(timer.time_us(
                lambda: fm.flash_mla_sparse_fwd(q, kv3, idx3, D_QK ** -0.5, D_V, sinks)), 2)
        res[f"lse_zero_T{T}"] = round(timer.time_us(lambda: lse.zero_()), 2)
        print(res, flush=True)
    return res


def main(path: str, tree: str = ".") -> None:
    from mla_sink.tools import peers
    fm = peers.import_flash_mla()[0]
    plain = graph_times(__import__("mla_sink.kernels.gluon.gluon_seesaw", fromlist=["x"]), fm)
    gs = load_patched(os.path.abspath(tree))
    report = {"H": H, "graph_us": plain, "timeline_us": {}}
    for T, topk in ((64, 2048), (64, 512), (256, 2048)):
        report["timeline_us"][f"T{T}-topk{topk}"] = timeline(gs, T, topk)
        print(f"T{T}-topk{topk}", json.dumps(report["timeline_us"][f"T{T}-topk{topk}"]), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
