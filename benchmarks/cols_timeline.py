"""Where the time of ``gluon_fp8`` goes at issue #12's last misses (seventeenth session, 2026-12-02): a per-CTA
timeline from ``%globaltimer`` of the column-split consumers, at H=32 T = 2 / 64 / 256 (both fp8 caches) and H=16
T=256. Until the seventy-sixth session it stamped the alternate-block consumers too (words 128-255 below, and
4 / 5 / 6 past their loops and the first's last store); they left the kernel then, and with them those stamps.

As :mod:`gluon_fp8_timeline` (its helper, with 512 words per CTA, and stamps for the current kernel): a copy of
the tree's ``mla_sink`` whose ``gluon_fp8.py`` stores timestamps into an extra int32 buffer. Words: 0 kernel entry,
1 before the partitions start; the producer at ``16 + 3 i + {0, 1, 2}`` (block i's start, past its wait for a free
stage, past the hand-over); the first consumer at ``256 + 4 i + {0, 1, 2, 3}`` (block start, past its
wait for the filled stage, past publishing ``P^T``, past the stage's release), its second at ``384 + 3 i + {0, 1,
2}`` (block start, past its wait for ``P^T``, past the release); 8 the first consumer past staging q, 4 / 5 the
first / second past its loop, 6 / 7 each one's last store; the column split's epilogue (fifty-fifth session) at 9
(the first past the row sum and the LSE), 10 (past the output factor), 11 (past handing it over), 12 (past the LSE's
store) and 13 (the second past its wait for the factor). One eager launch after an L2
flush, five times (plus one that compiles); medians over CTAs and runs, in microseconds; ``kernel_span`` is the
last CTA's end after the first CTA's entry (no combine). The stamps cost registers, so the times bound the
library kernel's from above.

    PYTHONPATH=. python3 -u benchmarks/cols_timeline.py OUT.json [TREE [H]]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_fp8_timeline import add_buffer, case_inputs, cta_base  # noqa: E402  (the buffer, the inputs)
from seesaw_timeline import load_patched, relative_stamps, sub  # noqa: E402

WORDS = 512  # timeline words per CTA
#: (KV dtype, H, T, splits): the misses of issue #12's last bar (H=32 at T = 2 and 256, V3.2 at H=16 T=256) and
#: their neighbours, each with the library's split count; ``main``'s optional third argument picks H
CASES = (("fp8_e4m3", 32, 256, 1), ("fp8_e4m3", 32, 256, 2), ("fp8_ds_mla", 32, 256, 1), ("fp8_e4m3", 32, 2, 16),
         ("fp8_ds_mla", 32, 2, 32), ("fp8_e4m3", 32, 64, 2), ("fp8_ds_mla", 32, 64, 2), ("fp8_e4m3", 16, 256, 1),
         ("fp8_ds_mla", 16, 256, 1))


def _in(s: str, name: str, edit) -> str:
    """``s`` with the body of the function ``name`` (up to the next ``@gluon.jit``) passed through ``edit``."""
    c0 = s.index(f"def {name}(")
    c1 = s.index("@gluon.jit", c0)
    return s[:c0] + edit(s[c0:c1]) + s[c1:]


def patch(src: str) -> str:
    """The kernel source with the timeline stores (see the module docstring)."""
    s = add_buffer(src)
    for fn in ("_producer(IDX, KV, kn_smem", "_consumer_cols(Q, IDX,"):
        s = sub(s, f"def {fn}", f"def {fn.replace('(', '(TLB, ', 1)}")
        s = sub(s, f"({fn.replace('(', ', (', 1)}", f"({fn.replace('(', ', (TLB, ', 1)}", -1)
    tl = cta_base("TLB", WORDS)
    s = sub(s, "    if LAUNCH_DEPENDENTS:\n",
            f"    gl.store({tl}, _now(gl.program_id(1)))\n    if LAUNCH_DEPENDENTS:\n")
    s = sub(s, "    # 16 heads: the first consumer is the default partition",
            f"    gl.store({tl} + 1, _now(gl.program_id(1)))\n"
            "    # 16 heads: the first consumer is the default partition")
    s = _in(s, "_producer", lambda b: _producer_stamps(b, tl))

    def cols(b: str) -> str:  # the column split: the first consumer's four stamps a block, the second's three
        b = sub(b, "                 KV_DS_MLA)\n", f"                 KV_DS_MLA)\n        gl.store({tl} + 8, _now(pid_s))\n")
        b = sub(b, "            phase = (i // STAGES) & 1\n",
                f"            phase = (i // STAGES) & 1\n            TL = {tl} + 256 + 4 * i\n"
                "            gl.store(TL, _now(i), mask=i < 32)\n")
        b = sub(b, "            mbarrier.wait(ready.index(s), phase)\n",
                "            mbarrier.wait(ready.index(s), phase)\n"
                "            gl.store(TL + 1, _now(i), mask=i < 32)\n")
        b = sub(b, "            mbarrier.arrive(p_ready.index(s))\n",
                "            mbarrier.arrive(p_ready.index(s))\n            gl.store(TL + 2, _now(i), mask=i < 32)\n")
        # past the release (with PV_OVERLAP, past the iteration: block i's stage is released in the next one)
        b = sub(b, "                mbarrier.arrive(empty.index(s))\n        if PIPE:",
                "                mbarrier.arrive(empty.index(s))\n            gl.store(TL + 3, _now(i), mask=i < 32)\n"
                f"        gl.store({tl} + 4, _now(pid_s))\n        if PIPE:")
        b = sub(b, "            mbarrier.wait(p_ready.index(s), (i // STAGES) & 1)\n",
                f"            TL = {tl} + 384 + 3 * i\n            gl.store(TL, _now(i), mask=i < 32)\n"
                "            mbarrier.wait(p_ready.index(s), (i // STAGES) & 1)\n"
                "            gl.store(TL + 1, _now(i), mask=i < 32)\n")
        released = "done with stage s and its P^T\n            mbarrier.arrive(empty.index(s))\n"  # ROLE 1's
        b = sub(b, released, released + "            gl.store(TL + 2, _now(i), mask=i < 32)\n")
        b = sub(b, "        mbarrier.wait(f_ready, 0)\n",
                f"        gl.store({tl} + 5, _now(pid_s))\n        mbarrier.wait(f_ready, 0)\n"
                f"        gl.store({tl} + 13, _now(pid_s))\n")
        # the first consumer's epilogue (fifty-fifth session): past the row sum and the LSE, past the output
        # factor (the sinks' load), past handing it over, past the LSE's store
        b = sub(b, "        empty_row, l_safe, lse2 = _final_lse2(m_i, _row_sum(l_i, DEFER))\n",
                "        empty_row, l_safe, lse2 = _final_lse2(m_i, _row_sum(l_i, DEFER))\n"
                f"        gl.store({tl} + 9, _now(pid_s + (gl.max(lse2, axis=0) == 1.0e30).to(gl.int32)))\n")
        b = sub(b, "        f_smem.store(scale)\n",
                f"        f_smem.store(scale)\n        gl.store({tl} + 10, _now(pid_s))\n")
        b = sub(b, "        mbarrier.arrive(f_ready)\n",
                f"        mbarrier.arrive(f_ready)\n        gl.store({tl} + 11, _now(pid_s))\n")
        b = sub(b, "            gl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E, mask=hmask)\n",
                "            gl.store(LSE + pid_t * stride_lt + offs_h * stride_lh, lse2 / LOG2E, mask=hmask)\n"
                f"        gl.store({tl} + 12, _now(pid_s))\n")
        return b.rstrip("\n") + f"\n    gl.store({tl} + 6 + ROLE, _now(pid_s))\n\n\n"

    return _in(s, "_consumer_cols", cols)


def _producer_stamps(b: str, tl: str) -> str:
    """The producer's three stamps a block: its start, past its wait for a free stage, past the hand-over."""
    b = sub(b, "        s = i % STAGES\n", f"        s = i % STAGES\n        TL = {tl}\n"
            "        gl.store(TL + 16 + 3 * i, _now(i), mask=i < 32)\n")
    b = sub(b, "                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)\n",
            "                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)\n"
            "                gl.store(TL + 17 + 3 * i, _now(i), mask=i < 32)\n")
    return sub(b, "        mbarrier.arrive(ready.index(s))\n",
               "        mbarrier.arrive(ready.index(s))\n        gl.store(TL + 18 + 3 * i, _now(i), mask=i < 32)\n")


def _med(x) -> float:
    return float(x.double().median()) if x.numel() else float("nan")


def _phases(tl: torch.Tensor, blocks: int) -> dict:
    """Per-phase ns of one run (``tl``: int64 ``[CTAs, WORDS]`` after the earliest entry)."""
    n = min(blocks, 32)
    prod = tl[:, 16:16 + 3 * n].reshape(-1, n, 3)
    out = {
        "prologue": _med(tl[:, 1] - tl[:, 0]),
        "producer_first_handover": _med(prod[:, 0, 2] - tl[:, 0]),
        "producer_gather_and_wait_free": _med(prod[:, 1:, 1] - prod[:, 1:, 0]),
        "producer_store_to_handover": _med(prod[:, 1:, 2] - prod[:, 1:, 1]),
        "producer_block_period": _med(prod[:, 1:, 0] - prod[:, :-1, 0]),
        "kernel_span": float(tl[:, 6:8].max()),
    }
    c0 = tl[:, 256:256 + 4 * n].reshape(-1, n, 4)
    c1 = tl[:, 384:384 + 3 * n].reshape(-1, n, 3)
    out.update({
        "first_q_staged": _med(tl[:, 8] - tl[:, 0]),
        "first_wait_filled": _med(c0[:, :, 1] - c0[:, :, 0]),
        "first_scores_softmax_p": _med(c0[:, :, 2] - c0[:, :, 1]),
        "first_pv_release": _med(c0[:, :, 3] - c0[:, :, 2]),
        "first_block_period": _med(c0[:, 1:, 0] - c0[:, :-1, 0]),
        "second_wait_p": _med(c1[:, :, 1] - c1[:, :, 0]),
        "second_pv_release": _med(c1[:, :, 2] - c1[:, :, 1]),
        "first_epilogue": _med(tl[:, 6] - tl[:, 4]),
        "second_epilogue": _med(tl[:, 7] - tl[:, 5]),
        # the first consumer's epilogue in parts (fifty-fifth session; the stamps wait for the values they
        # follow): the row sum and the LSE, the output factor (the sinks' load), its hand-over, the LSE's
        # store, its stores of O^T; the second's wait for the factor, its stores
        "first_epi_row_sum_lse": _med(tl[:, 9] - tl[:, 4]),
        "first_epi_out_factor": _med(tl[:, 10] - tl[:, 9]),
        "first_epi_handover": _med(tl[:, 11] - tl[:, 10]),
        "first_epi_lse_store": _med(tl[:, 12] - tl[:, 11]),
        "first_epi_out_stores": _med(tl[:, 6] - tl[:, 12]),
        "second_epi_wait_factor": _med(tl[:, 13] - tl[:, 5]),
        "second_epi_out_stores": _med(tl[:, 7] - tl[:, 13]),
        "cta_total": _med(torch.maximum(tl[:, 6], tl[:, 7]) - tl[:, 0]),
    })
    return out


def timeline(gf, kv_dtype: str, H: int, T: int, splits: int, topk: int = 2048, runs: int = 5) -> dict:
    """The medians of :func:`_phases` over ``runs`` launches of one case (``splits`` programs a token)."""
    q, idx, sinks, cache, scale = case_inputs(kv_dtype, H, T, topk, T * 100 + splits)
    ids_per_split = topk // splits
    flush = torch.ones(1 << 28, device="cuda")
    buf = torch.zeros(T * splits * WORDS, dtype=torch.int32, device="cuda")
    gf._TL_BUF[0] = buf
    blocks = -(-ids_per_split // 64)
    per_run = []
    for r in range(runs + 1):
        buf.zero_()
        flush.sum()
        gf.sparse_mla_decode_fp8_gluon(q, cache, idx, sinks, kv_scale=scale, kv_dtype=kv_dtype, num_kv_splits=splits,
                                       ids_per_split=ids_per_split)
        torch.cuda.synchronize()
        tl = relative_stamps(buf.view(T * splits, WORDS))
        if r:  # the first run compiles
            per_run.append(_phases(tl, blocks))
    res = {k: round(statistics.median(p[k] for p in per_run) / 1e3, 3) for k in per_run[0]}
    return res


def main(path: str, tree: str = ".", heads: str = "") -> None:
    """Every case of :data:`CASES` (those of ``heads`` heads, if given), printed and written to ``path``."""
    gf = load_patched(os.path.abspath(tree), "gluon_fp8", patch)
    report = {"timeline_us": {}}
    for kv_dtype, H, T, splits in CASES:
        if heads and H != int(heads):
            continue
        key = f"{kv_dtype}-h{H}-T{T}-splits{splits}"
        report["timeline_us"][key] = timeline(gf, kv_dtype, H, T, splits)
        print(key, json.dumps(report["timeline_us"][key]), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
