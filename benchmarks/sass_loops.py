"""What ptxas makes of one gluon_fp8 launch, without a GPU: the kernel compiled ahead of time for sm90 with the
constexprs its launcher gives a call (:func:`mla_sink.kernels.gluon.gluon_fp8.fp8_launch_args`, through
``tests/aot_sm90.py``), then ptxas's spill report, the shared memory, the ``setmaxnreg`` of each partition and, for
every loop of the SASS (a back branch and its target) with at least 8 global loads or 8 wgmmas, its instruction
count, its global loads, wgmmas, 32-bit high multiplies (an integer division's) and local-memory spills. The
producer's loop is the one without wgmmas; spans that hold others end in a barrier wait's retry branch placed
after the code. Eighteenth session: a paged V3.2 cache's page size as a runtime integer
against a constexpr (BENCHMARKS.md). Forty-eighth session: ``--waits`` decodes the control codes of each such loop's
instructions (:func:`control`) and prints, in order, its global loads with the scoreboard each one writes, its score
wgmma groups, its mbarrier waits and every instruction that waits on a global load's scoreboard - where in the loop
a load's result is first waited for (its ``--prefetch-scales``, which compiled the forty-eighth session's
``PREFETCH_SCALES``, went with that flag: benchmarks/gluon_fp8_prefetch_scales.patch).

Needs Triton 3.6 with its bundled ptxas and cuobjdump (the H200 image's; here
``pip download triton==3.6.0 --no-deps`` unpacked onto ``PYTHONPATH``):

    PYTHONPATH=/tmp/tr36/site:. python3 benchmarks/sass_loops.py H SPLITS KV_DTYPE [--paged] [--topk-length]
        [--regs CONSUMER,PRODUCER] [--sass FILE] [--waits]
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


def instructions(sass: str) -> list:
    """``(address, text, control)`` of every instruction of ``sass`` (cuobjdump's text; ``control`` as
    :func:`control` decodes the second 64-bit word of its encoding, ``None`` where the listing lacks it)."""
    lines = sass.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            hi = re.match(r"\s*/\* (0x[0-9a-f]{16}) \*/", lines[i + 1]) if i + 1 < len(lines) else None
            out.append((int(m.group(1), 16), m.group(2).strip(), control(int(hi.group(1), 16)) if hi else None))
    return out


def control(word: int) -> dict:
    """The scheduling control bits of an sm90 instruction, from the second 64-bit word of its encoding (bits 41-61
    of that word, the layout since Volta, as the open decoders of NVIDIA's SASS read it): ``stall`` cycles, the
    scoreboard it writes (``write``) and releases after reading its operands (``read``; None: none), and the
    scoreboards it waits for before it issues (``wait``: a set of 0-5)."""
    bits = word >> 41
    write, read = (bits >> 5) & 7, (bits >> 8) & 7
    return dict(stall=bits & 0xF, write=None if write == 7 else write, read=None if read == 7 else read,
                wait={b for b in range(6) if bits >> (11 + b) & 1})


def loops(sass: str) -> list:
    """``(start, end, instructions)`` of every back branch's span in ``sass`` (cuobjdump's text); ``instructions``
    as :func:`instructions` gives them."""
    ins = instructions(sass)
    out = []
    for addr, text, _ in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            out.append((start, addr, [(a, t, c) for a, t, c in ins if start <= a <= addr]))
    return out


def waits(body: list) -> list:
    """The lines ``--waits`` prints for one loop, in its order: its global loads (``LDG``) with the scoreboard each
    writes, the last wgmma of each group (``gsb0``), the mbarrier waits (``SYNCS.PHASECHK``) and the first instruction
    that waits on a scoreboard while a global load's write to it is pending - where a load's result is first waited
    for. Shuffles, shared loads and ``MUFU`` write scoreboards too: a write by one of those ends the pending load's
    tracking (the scoreboard then counts both). The loop's first pass only (loads in flight across the back branch
    are waited for where the next pass's first wait on their scoreboard is)."""
    pending, out = {}, []
    for addr, text, c in body:
        if c is None:
            continue
        hit = sorted(b for b in c["wait"] if b in pending)
        if hit:
            out.append(f"  {addr:#07x} waits on scoreboard {hit} (loads at "
                       f"{', '.join(f'{pending[b]:#07x}' for b in hit)}): {text}")
            for b in hit:
                del pending[b]
        is_load = "LDG" in text and "LDGSTS" not in text and "LDGDEPBAR" not in text
        if c["write"] is not None:
            if is_load:
                pending.setdefault(c["write"], addr)
            else:
                pending.pop(c["write"], None)
        if is_load:
            out.append(f"  {addr:#07x} load, scoreboard {c['write']}: {text}")
        elif "gsb0" in text and "HGMMA" in text:
            out.append(f"  {addr:#07x} wgmma group ends: {text}")
        elif "SYNCS.PHASECHK" in text:
            out.append(f"  {addr:#07x} mbarrier wait: {text}")
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
    p.add_argument("--waits", action="store_true", help="print each loop's loads and the waits on them")
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
    shown = ("BLOCK_H", "CONSUMER_REGS", "PRODUCER_REGS", "PRODUCER_ROWS", "LINES", "kv_block_size")
    print({k: constexprs.get(k, scalars.get(k)) for k in shown})
    print(*[line.strip() for line in log.splitlines() if "spill" in line], sep="\n")
    print("shared bytes", kernel.metadata.shared, "| setmaxnreg",
          sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"]))))
    for start, end, body in loops(sass):
        count = {k: sum(k in t for _, t, _ in body) for k in ("LDG", "HGMMA", "IMAD.HI", "STL", "LDL")}
        if len(body) >= MIN_LOOP and (count["LDG"] >= 8 or count["HGMMA"] >= 8):
            print(f"loop {start:#x}-{end:#x}: {len(body)} instructions", count)
            if a.waits:
                print(*waits(body), sep="\n")


if __name__ == "__main__":
    main()
