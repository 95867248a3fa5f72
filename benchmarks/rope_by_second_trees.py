"""The trees of the fifty-first session's ``rope_by_second`` probe (issue #12's one missed bar, V3.2 H=32 T=256 on
the H200). Both are ``git archive`` of :data:`BASE` (the local branch ``wip/rope2``: main's kernels plus the table
param ``rope_by_second``; the same change as benchmarks/gluon_fp8_rope_by_second.patch against f78ee27, should the
branch be gone), differing in one row of tables/gluon_fp8.yaml:

- ``main``: ``ds_mla_h32`` without it - main's kernel and SASS (the first consumer copies each block's bf16 RoPE
  two blocks ahead by cp.async, waits for the copy group, fences and takes a barrier at each block's start);
- ``rope2``: ``ds_mla_h32`` with it - the second consumer copies every block's RoPE (the first two before its first
  wait, block ``i + 2``'s into block ``i``'s stage once it has released it, the ids loaded while its ``P V`` runs)
  and signals each copy on an mbarrier by ``cp.async.mbarrier.arrive.noinc`` (128 arrivals a phase); the first
  consumer waits on that barrier and fences, and issues no copy and no barrier for them.

Why (BENCHMARKS.md, fiftieth and fifty-first sessions): without the first consumer's RoPE copies (``norope``, outputs
wrong by design) V3.2 H=32 T=256 took 195.3 against 200.0-201.1 µs on an H100; handing them to the producer lost
(forty-ninth session), and the second consumer, whose loop is 159 instructions against the first's 860, has slack.
AOT sm90 (Triton 3.6): no spill; the first consumer's loop 777 instructions with 4 global loads (main 860 and 13),
the second's 233 (main 159); shared memory 218,704 bytes.

    PYTHONPATH=. python3 benchmarks/rope_by_second_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main r=../out/rope2 m2=../out/main

Check ``max_abs_diff_vs_first`` (the outputs must be bitwise equal) and that the winner's GPU tests pass.
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

TABLE = os.path.join("tables", "gluon_fp8.yaml")
#: The commit the trees are archived from: branch ``wip/rope2`` (main's kernels with ``rope_by_second``).
BASE = "b73d694"

_DS_H32 = ("    params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, "
           "rope_by_second: true}\n")

#: Variant -> the (old, new) edits of tables/gluon_fp8.yaml (each ``old`` occurs once).
VARIANTS = {"main": [(_DS_H32, _DS_H32.replace("rope_by_second: true", "rope_by_second: false"))], "rope2": []}


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, TABLE, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
