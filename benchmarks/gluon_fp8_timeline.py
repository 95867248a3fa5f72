"""Where the few-heads fp8 kernel's time goes (``gluon_fp8``, H <= 16): a timeline of every CTA from
``%globaltimer`` (written in the eleventh session, 2026-12-01, for the next one; not yet run). Written for trees
with the alternate-block consumers (before the seventy-sixth session); on later trees its patch stops at the first
anchor that is gone.

As :mod:`seesaw_timeline` (whose patch-and-import steps it uses): the script copies the ``mla_sink`` package of a
tree into a temporary directory and inserts timestamp stores into that copy of ``mla_sink/kernels/gluon/gluon_fp8.py`` (the library's kernel is not
changed). The stamps go to an extra int32-word buffer argument of the patched kernel, 256 words per CTA:
0 kernel entry, 1 prologue done (q in shared memory), 4 / 5 consumer 0 / 1 past its loop, 6 epilogue done;
``16 + 3 i + {0, 1, 2}`` the producer at block i's start, past its wait for a free stage, and past the
stage's hand-over (its rows gathered, converted and stored); ``128 + 64 c + 3 k + {0, 1, 2}`` consumer c at its
k-th block's start, past its wait for the filled stage, and past the stage's release. One eager launch after an
L2 flush, five times; medians over CTAs and runs, in microseconds. The stamps cost registers (AOT sm90: the
patched e4m3 kernel spills 16 bytes, the V3.2 one none), so its times bound the library kernel's from above.

    PYTHONPATH=. python3 -u benchmarks/gluon_fp8_timeline.py OUT.json [TREE]

Its stamps fit the kernel of its session; :mod:`cols_timeline` (seventeenth session) stamps the current one and
uses this script's helper.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seesaw_timeline import load_patched, relative_stamps, sub  # noqa: E402  (the shared patch-and-import steps)

D_QK, D_V, N, H = 576, 512, 1 << 20, 16
WORDS = 256

HELPER = '''
#: the patched kernel's timeline buffer (set by benchmarks/gluon_fp8_timeline.py)
_TL_BUF = [None]


@gluon.jit
def _now(x):
    """%globaltimer_lo (ns) as an int32 word (``x``: any int32 scalar)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo; // $1", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)
'''


def _after(body: str, pattern: str, lines: list) -> str:
    """``lines`` inserted after the first line of ``body`` matching ``pattern`` (after its indentation), at
    that line's indentation."""
    m = re.search(r"^( *)" + pattern + r"\n", body, flags=re.M)
    assert m, pattern
    ind = m.group(1)
    return body[:m.end()] + "".join(f"{ind}{ln}\n" for ln in lines) + body[m.end():]


def cta_base(tlb: str, words: int = WORDS) -> str:
    """The first timeline word of this CTA (program ``(0, pid_s, pid_t)``, ``words`` a CTA), as kernel source."""
    return f"{tlb} + (gl.program_id(2) * gl.num_programs(1) + gl.program_id(1)) * {words}"


def add_buffer(src: str) -> str:
    """The kernel source with :data:`HELPER` and the timeline buffer ``TLB`` as the kernel's argument after
    ``PART_LSE``, passed by the launcher from ``_TL_BUF[0]``."""
    # (the anchor is the ring's STAGES line, gl.constexpr(2) on trees before the seventy-third session's review,
    # gl.constexpr(RING_STAGES) since)
    s = sub(src, "\nSTAGES = gl.constexpr(", "\n" + HELPER + "\nSTAGES = gl.constexpr(")
    s = sub(s, "    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, sm_scale,",
            "    Q, KV, IDX, SINKS, TOPK_LEN, KV_SCALE, OUT, LSE, PART_OUT, PART_LSE, TLB, sm_scale,")
    return sub(s, "kv_scale, out, lse, part_out, part_lse,\n        float(sm_scale)",
               "kv_scale, out, lse, part_out, part_lse, _TL_BUF[0],\n        float(sm_scale)")


def patch(src: str) -> str:
    """The kernel source with the timeline stores (see the module docstring)."""
    s = add_buffer(src)
    # the buffer as the producer's and the consumers' first argument
    s = sub(s, "def _producer(IDX, KV, kn_smem,", "def _producer(TLB, IDX, KV, kn_smem,")
    s = sub(s, "def _consumer(IDX, KV, SINKS,", "def _consumer(TLB, IDX, KV, SINKS,")
    s = sub(s, "def _blocks_ds(IDX, KV,", "def _blocks_ds(TLB, IDX, KV,")
    s = sub(s, "_blocks_ds(IDX, KV, q_n,", "_blocks_ds(TLB, IDX, KV, q_n,")
    s = sub(s, "(_producer, (IDX, KV, kn_smem", "(_producer, (TLB, IDX, KV, kn_smem", -1)
    s = sub(s, "(_consumer, (IDX, KV, SINKS", "(_consumer, (TLB, IDX, KV, SINKS", -1)
    tl = cta_base("TLB")
    # kernel entry and the end of the prologue
    s = sub(s, "    if LAUNCH_DEPENDENTS:\n        launch_dependents(gl.program_id(1))",
             f"    gl.store({tl}, _now(gl.program_id(1)))\n"
             "    if LAUNCH_DEPENDENTS:\n        launch_dependents(gl.program_id(1))")
    s = sub(s, "    # 16 heads: the first consumer is the default partition",
             f"    gl.store({tl} + 1, _now(gl.program_id(1)))\n    # 16 heads: the first consumer is the default partition")
    # producer
    p0 = s.index("def _producer(")
    p1 = s.index("@gluon.jit", p0)
    prod = s[p0:p1]
    new = sub(prod, "        s = i % STAGES\n", f"        s = i % STAGES\n        TL = {tl}\n"
               "        gl.store(TL + 16 + 3 * i, _now(i), mask=i < 32)\n")
    new = sub(new, "                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)\n",
               "                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)\n"
               "                gl.store(TL + 17 + 3 * i, _now(i), mask=i < 32)\n")
    new = sub(new, "        mbarrier.arrive(ready.index(s))\n",
               "        mbarrier.arrive(ready.index(s))\n        gl.store(TL + 18 + 3 * i, _now(i), mask=i < 32)\n")
    s = s.replace(prod, new)
    # consumers: both loops (e4m3 in _consumer, V3.2 in _blocks_ds), each line at its anchor's indentation
    for name in ("def _blocks_ds(", "def _consumer("):
        c0 = s.index(name)
        c1 = s.index("@gluon.jit", c0)
        body = s[c0:c1]
        new = _after(body, r"s = _stage\(i, FIRST, [^\n]*",
                     [f"TL = {tl} + 128 + 64 * FIRST + 3 * (i // STAGES)", "gl.store(TL, _now(i), mask=i < 32)"])
        new = _after(new, r"mbarrier\.wait\(ready\.index\(s\), \(i // STAGES\) & 1\)",
                     ["gl.store(TL + 1, _now(i), mask=i < 32)"])
        new = _after(new, r"mbarrier\.arrive\(empty\.index\(s\)\)", ["gl.store(TL + 2, _now(i), mask=i < 32)"])
        if name == "def _consumer(":
            new = sub(new, "    if FIRST == 1:\n        m_smem.store(m_i)",
                       f"    gl.store({tl} + 4 + FIRST, _now(pid_s))\n    if FIRST == 1:\n        m_smem.store(m_i)")
            tail = "mask=hmask_o[None, :])\n"
            at = new.rindex(tail) + len(tail)
            new = new[:at] + f"        gl.store({tl} + 6, _now(pid_s))\n" + new[at:]
        s = s.replace(body, new)
    return s


def _phases(tl: torch.Tensor, blocks: int) -> dict:
    """Per-phase durations (ns) of one run: ``tl`` int64 ``[CTAs, 256]`` relative to the earliest entry."""
    def med(x):
        return float(x.double().median())

    n = min(blocks, 32)
    prod = tl[:, 16:16 + 3 * n].reshape(-1, n, 3)
    cons = [tl[:, 128 + 64 * c:128 + 64 * c + 3 * ((n + 1 - c) // 2)].reshape(-1, (n + 1 - c) // 2, 3)
            for c in (0, 1)]
    out = {
        "prologue": med(tl[:, 1] - tl[:, 0]),
        "producer_first_block_start": med(prod[:, 0, 0] - tl[:, 0]),
        "producer_gather_and_wait_free": med(prod[:, 1:, 1] - prod[:, 1:, 0]),
        "producer_store_to_handover": med(prod[:, 1:, 2] - prod[:, 1:, 1]),
        "producer_block_period": med(prod[:, 1:, 0] - prod[:, :-1, 0]),
        "producer_first_handover": med(prod[:, 0, 2] - tl[:, 0]),
        "epilogue": med(tl[:, 6] - torch.maximum(tl[:, 4], tl[:, 5])),
        "cta_total": med(tl[:, 6] - tl[:, 0]),
        "last_end": float(tl[:, 6].max()),
    }
    for c in (0, 1):
        out[f"consumer{c}_wait_filled"] = med(cons[c][:, :, 1] - cons[c][:, :, 0])
        out[f"consumer{c}_compute"] = med(cons[c][:, :, 2] - cons[c][:, :, 1])
    return out


def case_inputs(kv_dtype: str, heads: int, T: int, topk: int, seed: int):
    """``(q, indices, sinks, kv_cache, kv_scale)`` of one timeline case: bf16 q ``[T, heads, 576]``, ids uniform
    over an ``N``-row pool, sinks around 2, and the pool as an e4m3 cache (``kv_scale`` 1) or V3.2 rows with
    power-of-two scales (``kv_scale`` ``None``)."""
    from mla_sink import quantize_kv_cache
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, heads, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(heads, device="cuda", generator=g) + 2.0
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    if kv_dtype == "fp8_e4m3":
        return q, idx, sinks, kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda")
    return q, idx, sinks, quantize_kv_cache(kv, scale="pow2"), None


def timeline(gf, kv_dtype: str, T: int, topk: int, runs: int = 5) -> dict:
    q, idx, sinks, cache, scale = case_inputs(kv_dtype, H, T, topk, T * 10000 + topk)
    flush = torch.ones(1 << 28, device="cuda")
    buf = torch.zeros(T * WORDS, dtype=torch.int32, device="cuda")
    gf._TL_BUF[0] = buf
    blocks = -(-topk // 64)
    per_run = []
    for r in range(runs + 1):
        buf.zero_()
        flush.sum()
        gf.sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, kv_scale=scale, kv_dtype=kv_dtype)
        torch.cuda.synchronize()
        tl = relative_stamps(buf.view(T, WORDS))
        if r:  # the first run compiles
            per_run.append(_phases(tl, blocks))
    return {k: round(statistics.median(p[k] for p in per_run) / 1e3, 3) for k in per_run[0]}


def main(path: str, tree: str = ".") -> None:
    gf = load_patched(os.path.abspath(tree), "gluon_fp8", patch)
    report = {"H": H, "timeline_us": {}}
    for kv_dtype in ("fp8_e4m3", "fp8_ds_mla"):
        for T, topk in ((256, 2048), (64, 2048)):
            key = f"{kv_dtype}-T{T}-topk{topk}"
            report["timeline_us"][key] = timeline(gf, kv_dtype, T, topk)
            print(key, json.dumps(report["timeline_us"][key]), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
