"""The trees of the fifty-first session's probe of the column split's second consumer taking the first consumer's
global loads (issue #12's one missed bar, V3.2 H=32 T=256 on the H200). Each is a ``git archive`` of :data:`BASE`
(the local branch ``wip/rope2``: main's kernels plus the table params ``rope_by_second`` and ``meta_by_second``; the
same change as benchmarks/gluon_fp8_second_consumer.patch against d4d9a9a, should the branch be gone), differing in
one row of tables/gluon_fp8.yaml (``ds_mla_h32``):

- ``main``: neither param - main's kernel and SASS. The first consumer loads each block's ids and then their tile
  scales at the block's start, and copies each block's bf16 RoPE two blocks ahead by cp.async (a ``wait_group``, a
  fence and a barrier at each block's start);
- ``rope2``: ``rope_by_second`` - the second consumer copies every block's RoPE (the first two before its first
  wait, block ``i + 2``'s into block ``i``'s stage once it has released it, the ids loaded while its ``P V`` runs)
  and signals each copy on an mbarrier by ``cp.async.mbarrier.arrive.noinc`` (128 arrivals a phase); the first
  consumer waits on that barrier and fences;
- ``meta2``: ``meta_by_second`` - the second consumer loads each block's ids and tile scales (the first two blocks'
  before its first wait, block ``i + 2``'s once it has released block ``i``) and publishes the mask and the four
  scales in a two-slot shared-memory ring behind an mbarrier; the first consumer reads block ``i + 1``'s during block
  ``i``, after its ``P_t`` stores (as the fiftieth session's ``s4`` read the producer's, which lost by the producer's
  extra work; the second consumer has slack);
- ``both``: both params - no global load left in the first consumer's loop.

Why (BENCHMARKS.md, fiftieth and fifty-first sessions): without all of the first consumer's loads (``noloads``,
outputs wrong by design) V3.2 H=32 T=256 took 178.2 against 200.3-200.5 µs on an H100, without its ids and scales
(``noids``) 192.8 and without its RoPE copies (``norope``) 195.3 against 200.0-201.1. AOT sm90 (Triton 3.6), no
spill: the first consumer's loop 860 instructions and 13 global loads on main, 777 and 4 with ``rope2``, 762 and 0
with ``both`` (9 ``BAR.SYNC``); the second's 159 on main, 295 with ``both``; shared memory 221,280 bytes.

    PYTHONPATH=. python3 benchmarks/second_consumer_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main b=../out/both r=../out/rope2 m2=../out/main

(``meta2`` alone in a second call if ``both`` wins.) Check ``max_abs_diff_vs_first`` (the outputs must be bitwise
equal) and that the winner's GPU tests pass.
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

TABLE = os.path.join("tables", "gluon_fp8.yaml")
#: The commit the trees are archived from: branch ``wip/rope2`` (main's kernels with both params, on ds_mla_h32).
BASE = "aee07e3"

_DS_H32 = ("    params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, "
           "rope_by_second: true, meta_by_second: true}\n")


def _row(rope: bool, meta: bool) -> list:
    return [(_DS_H32, _DS_H32.replace("rope_by_second: true", f"rope_by_second: {str(rope).lower()}")
             .replace("meta_by_second: true", f"meta_by_second: {str(meta).lower()}"))]


#: Variant -> the (old, new) edits of tables/gluon_fp8.yaml (each ``old`` occurs once).
VARIANTS = {"main": _row(False, False), "rope2": _row(True, False), "meta2": _row(False, True), "both": []}


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, TABLE, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
