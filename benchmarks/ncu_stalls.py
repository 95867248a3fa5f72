"""Where a warp-specialised kernel's warps stall, by partition and by window of SASS (fifty-second session, issue
#12): a summary of ncu's per-instruction stall samples.

Input: the CSV (or its gzip) of ``ncu -i REP --page source --print-source sass --csv`` for a report taken with
``--section SourceCounters`` (see BENCHMARKS.md, fifty-second session, for the command). The SASS is cut into
regions at each ``USETMAXNREG`` (a partition's register request opens its code) and each region into windows of
``WINDOW`` instructions; for each region and window: the stall samples, the instructions executed (warp level),
the top stall reasons and the top opcodes by samples. Regions are printed in code order, so which partition each
is must be read from its opcodes (the producer's ``LDG``/``F2FP``, the consumers' ``HGMMA``).

    python3 benchmarks/ncu_stalls.py SASS.csv[.gz] [WINDOW]
"""

from __future__ import annotations

import csv
import gzip
import sys
from collections import Counter

WINDOW = 80  # SASS instructions a window
TOP = 4  # stall reasons and opcodes shown a window


def read_rows(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and the instruction rows of the CSV (its first line names the kernel)."""
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]


def _num(s: str) -> float:
    """A CSV cell as a number (ncu writes thousands with commas; an empty or non-numeric cell is 0)."""
    try:
        return float(s.replace(",", "")) if s else 0.0
    except ValueError:
        return 0.0


def summarise(header: list[str], rows: list[list[str]], window: int = WINDOW) -> list[dict]:
    """Per region (cut at ``USETMAXNREG``): its windows' samples, executions, top stalls and opcodes."""
    col = {name: i for i, name in enumerate(header)}
    stalls = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    cuts = [0] + [i for i, r in enumerate(rows) if "USETMAXREG" in r[col["Source"]]] + [len(rows)]
    regions = []
    for a, b in zip(cuts, cuts[1:]):
        if a == b:
            continue
        region = {"first": rows[a][col["Address"]], "instructions": b - a, "windows": []}
        for w0 in range(a, b, window):
            chunk = rows[w0:min(w0 + window, b)]
            samples = sum(_num(r[col["Warp Stall Sampling (All Samples)"]]) for r in chunk)
            reasons = Counter({s: sum(_num(r[col[s]]) for r in chunk) for s in stalls})
            ops = Counter()
            for r in chunk:
                ops[r[col["Source"]].split()[0].split(".")[0] if r[col["Source"]].strip() else "?"] += \
                    _num(r[col["Warp Stall Sampling (All Samples)"]])
            region["windows"].append({
                "offset": w0 - a, "samples": samples,
                "executed": sum(_num(r[col["Instructions Executed"]]) for r in chunk),
                "stalls": reasons.most_common(TOP), "opcodes": ops.most_common(TOP)})
        region["samples"] = sum(w["samples"] for w in region["windows"])
        regions.append(region)
    return regions


def main(path: str, window: str = str(WINDOW)) -> None:
    """Print :func:`summarise` of the CSV at ``path``: each region's share of the samples, then its windows of
    ``window`` instructions that hold at least 0.5% of them."""
    header, rows = read_rows(path)
    regions = summarise(header, rows, int(window))
    total = sum(r["samples"] for r in regions)
    print(f"{len(rows)} SASS instructions, {total:.0f} stall samples")
    for i, reg in enumerate(regions):
        print(f"\nregion {i} from {reg['first']}: {reg['instructions']} instructions, {reg['samples']:.0f} samples "
              f"({100 * reg['samples'] / max(total, 1):.1f}%)")
        for w in reg["windows"]:
            if w["samples"] < 0.005 * total:
                continue
            st = ", ".join(f"{k[6:]} {v:.0f}" for k, v in w["stalls"] if v)
            op = ", ".join(f"{k} {v:.0f}" for k, v in w["opcodes"] if v)
            print(f"  +{w['offset']:5d}: {w['samples']:6.0f} samples, {w['executed']:9.0f} executed | {st} | {op}")


if __name__ == "__main__":
    main(*sys.argv[1:])
