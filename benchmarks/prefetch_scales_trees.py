"""The trees of the forty-eighth session's ``prefetch_scales`` A/B (issue #12's V3.2 H=32 T=256 bar). Each is a
``git archive`` of :data:`BASE` (whose kernel has ``PREFETCH_SCALES``, off on every row of tables/gluon_fp8.yaml) with
one edit of the table:

- ``main``: :data:`BASE` as it is;
- ``pf32``: ``ds_mla_h32`` with ``prefetch_scales`` (the column split's first consumer at 17-32 heads, CTAs of more
  than two blocks);
- ``pfall``: ``ds_mla_h32`` and ``ds_mla_h16`` (both alternate-block consumers at 16 heads) with it.

Why (AOT sm90 SASS of :data:`BASE`, Triton 3.6's ptxas): without it the first consumer's loop loads a block's ids,
then their tile scales, and its first instruction after the stage's mbarrier wait (``FADD`` of a scale) waits on the
loads' scoreboard, before the block's score wgmmas are issued - two dependent global round trips a block on the
period. With it, the loop's first wait on that scoreboard comes after the block's ``P_t`` stores and ``p_ready``.
Every variant compiles without a spill. Timed in the forty-ninth session (an H100,
benchmarks/prefetch_scales_ab_fortyninth_2026-12-05.json): both variants lost, and the flag left the tree
(benchmarks/gluon_fp8_prefetch_scales.patch); :data:`BASE` still has it.

    PYTHONPATH=. python3 benchmarks/prefetch_scales_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main a1=../out/pf32 b1=../out/pfall m2=../out/main \\
        a2=../out/pf32
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

TABLE = os.path.join("tables", "gluon_fp8.yaml")
#: The commit the trees are archived from (forty-eighth session: the kernel with ``PREFETCH_SCALES``).
BASE = "19a5293"

_DS_H32 = "    params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true}\n"
_DS_H16 = ("    params: {head_block: 16, consumer_regs: 176, producer_regs: 120, producer_rows: 64, lines: true, "
           "deferred_row_sum: false}\n")


def _on(params: str) -> str:
    return params.replace("}\n", ", prefetch_scales: true}\n")


#: Variant -> the (old, new) edits of tables/gluon_fp8.yaml (each ``old`` occurs once).
VARIANTS = {"main": [], "pf32": [(_DS_H32, _on(_DS_H32))], "pfall": [(_DS_H32, _on(_DS_H32)), (_DS_H16, _on(_DS_H16))]}


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, TABLE, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
