"""What ptxas makes of one gluon_fp8 launch, without a GPU: the kernel compiled ahead of time for sm90 with the
constexprs its launcher gives a call (:func:`mla_sink.kernels.gluon.gluon_fp8.fp8_launch_args`, through
``tests/aot_sm90.py``), then ptxas's spill report, the shared memory, the ``setmaxnreg`` of each partition and, for
every loop of the SASS (a back branch and its target) with at least 8 global loads or 8 wgmmas, its instruction
count, its global loads, wgmmas, 32-bit high multiplies (an integer division's) and local-memory spills. The
producer's loop is the one without wgmmas; spans that hold others end in a barrier wait's retry branch placed
after the code. Eighteenth session: a paged V3.2 cache's page size as a runtime integer
against a constexpr (BENCHMARKS.md).

Needs Triton 3.6 with its bundled ptxas and cuobjdump (the H200 image's; here
``pip download triton==3.6.0 --no-deps`` unpacked onto ``PYTHONPATH``):

    PYTHONPATH=/tmp/tr36/site:. python3 benchmarks/sass_loops.py H SPLITS KV_DTYPE [--paged] [--topk-length]
        [--regs CONSUMER,PRODUCER] [--sass FILE]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A launch's caches by KV dtype: (flat shape, paged shape, Triton pointer type of the kernel's KV).
CACHES = {"fp8_e4m3": ((4096, 576), None, "*fp8e4nv"), "fp8_ds_mla": ((4096, 656), (64, 64, 656), "*u8")}
#: Loops smaller than this are the barriers' retry loops, not a partition's block loop.
MIN_LOOP = 150


def loops(sass: str) -> list:
    """``(start, end, instructions)`` of every back branch's span in ``sass`` (cuobjdump's text)."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    out = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            out.append((start, addr, [t for a, t in ins if start <= a <= addr]))
    return out


def main(argv=None) -> None:
    """Compile one launch (see the module docstring) and print its report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("H", type=int)
    p.add_argument("splits", type=int)
    p.add_argument("kv_dtype", choices=sorted(CACHES))
    p.add_argument("--paged", action="store_true", help="a [64, 64, 656] V3.2 cache (page size 64)")
    p.add_argument("--topk-length", action="store_true", help="compile with HAS_TOPK_LEN")
    p.add_argument("--regs", help="override CONSUMER_REGS,PRODUCER_REGS")
    p.add_argument("--sass", help="also write the SASS here")
    a = p.parse_args(argv)
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    import torch
    from aot_sm90 import assemble, compile_gluon_fp8, require

    from mla_sink.kernels.gluon import gluon_fp8 as gf

    _, bin_dir = require()
    flat, paged, kv_ptr = CACHES[a.kv_dtype]
    shape = paged if (a.paged and paged) else flat
    q = torch.empty(3, a.H, 576, dtype=torch.bfloat16)
    idx = torch.empty(3, 2048, dtype=torch.int32)
    _, scalars, constexprs, options = gf.fp8_launch_args(
        q, torch.empty(*shape, dtype=torch.uint8 if a.kv_dtype == "fp8_ds_mla" else torch.float8_e4m3fn), idx,
        num_kv_splits=a.splits, ids_per_split=2048 // a.splits,
        out_strides=(a.H * 512, 512), kv_dtype=a.kv_dtype)
    constexprs.update(HAS_SINKS=True, HAS_TOPK_LEN=a.topk_length)
    if a.regs:
        constexprs["CONSUMER_REGS"], constexprs["PRODUCER_REGS"] = map(int, a.regs.split(","))
    kernel = compile_gluon_fp8(constexprs, scalars, kv_ptr, options["num_warps"])
    with tempfile.TemporaryDirectory() as tmp:
        log, sass = assemble(kernel, bin_dir, Path(tmp))
    if a.sass:
        Path(a.sass).write_text(sass)
    shown = ("BLOCK_H", "COLS", "CONSUMER_REGS", "PRODUCER_REGS", "PRODUCER_ROWS", "LINES", "kv_block_size")
    print({k: constexprs.get(k, scalars.get(k)) for k in shown})
    print(*[line.strip() for line in log.splitlines() if "spill" in line], sep="\n")
    print("shared bytes", kernel.metadata.shared, "| setmaxnreg",
          sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"]))))
    for start, end, body in loops(sass):
        count = {k: sum(k in t for t in body) for k in ("LDG", "HGMMA", "IMAD.HI", "STL", "LDL")}
        if len(body) >= MIN_LOOP and (count["LDG"] >= 8 or count["HGMMA"] >= 8):
            print(f"loop {start:#x}-{end:#x}: {len(body)} instructions", count)


if __name__ == "__main__":
    main()
