"""The trees of the forty-ninth session's ``producer_rope`` A/B (issue #12's V3.2 H=32 T=256 bar). Each is a
``git archive`` of :data:`BASE` (whose kernel has ``PRODUCER_ROPE``, off on every row of tables/gluon_fp8.yaml) with
one edit of the table:

Timed in the forty-ninth session (benchmarks/producer_rope_ab_fortyninth_2026-12-05.json, through the patch's tree,
the same SASS): it lost, and the param left the tree (799a00a); :data:`BASE` still has it.

- ``main``: :data:`BASE` as it is;
- ``pr``: ``ds_mla_h32`` (V3.2 at 17-32 heads, CTAs of more than two blocks, the column split) with
  ``producer_rope``: the producer gathers the rows' bf16 RoPE with their latent codes, and the first consumer copies
  none.

Why (BENCHMARKS.md, forty-ninth session, sections 3-4): without any of the first consumer's global loads V3.2 H=32
T=64 took 55.5 against 62.1 µs on an H100, without its tile-scale loads alone 62.3, so its RoPE copies are on its
period, while the producer has slack at 32 heads (2.40 against 2.88 µs a block). With the flag the sm90 SASS of
``ds_mla_h32`` is that of ``benchmarks/gluon_fp8_producer_rope.patch``; no spill.

    PYTHONPATH=. python3 benchmarks/producer_rope_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main r1=../out/pr m2=../out/main r2=../out/pr
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

TABLE = os.path.join("tables", "gluon_fp8.yaml")
#: The commit the trees are archived from (forty-ninth session: the kernel with ``PRODUCER_ROPE``, off).
BASE = "57179e1"

_DS_H32 = "    params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true}\n"

#: Variant -> the (old, new) edits of tables/gluon_fp8.yaml (each ``old`` occurs once).
VARIANTS = {"main": [], "pr": [(_DS_H32, _DS_H32.replace("}\n", ", producer_rope: true}\n"))]}


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, TABLE, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
