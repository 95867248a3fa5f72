"""The trees of the sixty-first session's two-producer A/B (issue #12; BENCHMARKS.md, sixty-first session): branch
``wip/two-producers`` adds the table param ``producers`` (1 or 2) to ``tables/gluon_fp8.yaml``: with 2, the
alternate scores and the column split get a second producer warpgroup, each producer filling one ring stage
(blocks ``FIRST, FIRST + 2, ...``), so that each has two block periods for its gather and conversion. Each tree is
:data:`BASE` archived with rows of the table edited:

- ``main``: as committed (one producer everywhere);
- ``p2``: e4m3's unsplit 32-head launches (``e4m3_h32_unsplit``: the alternate scores, consumers 176) with two
  producers of 80 registers and 32-row steps; V3.2's 32-head launches (``ds_mla_h32``: the column split) with two
  producers of 88 registers and 32-row steps, the second consumer 112 (the first gets 224);
- ``p2s``: as ``p2``, with V3.2's first consumer on the scores only (``scores_only``: the second consumer takes all
  of ``P V``, 176 registers; two producers of 80).

AOT sm90 (Triton 3.6 ptxas): ``p2`` spills nothing; ``p2s`` spills 4 bytes (V3.2 32-head launches).

    PYTHONPATH=. python3 benchmarks/two_producers_trees.py out [COMMIT first|tm|next]
    cd benchmarks && TREE_AB_VARIANT_TIMEOUT=80 PYTHONPATH=..:. python3 -u two_producers_ab.py $OUT/ab.json \\
        m1=../out/main p2=../out/p2 p2s=../out/p2s m2=../out/main p2b=../out/p2
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

#: The commit the trees are archived from (branch ``wip/two-producers``).
BASE = "wip/two-producers"
TABLE = os.path.join("tables", "gluon_fp8.yaml")
E4M3_H32 = "params: {head_block: 32, consumer_regs: 176, producer_regs: 152, deferred_row_sum: true, staged_ids: true, l2_prefetch: false}"
DS_H32 = "params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, rope_by_second: true, meta_by_second: true}"
E4M3_P2 = E4M3_H32.replace("producer_regs: 152", "producer_regs: 80, producer_rows: 32, producers: 2")
DS_P2 = DS_H32.replace("consumer_regs: 104, producer_regs: 152",
                       "consumer_regs: 112, producer_regs: 88, producer_rows: 32, producers: 2")
DS_P2S = DS_H32.replace("consumer_regs: 104, producer_regs: 152",
                        "consumer_regs: 176, producer_regs: 80, producer_rows: 32, producers: 2, scores_only: true")
DS_H16 = "params: {head_block: 16, consumer_regs: 176, producer_regs: 120, producer_rows: 64, lines: true, deferred_row_sum: false}"
E4M3_H16 = ("params: {head_block: 16, consumer_regs: 136, producer_regs: 152, producer_rows: 64, lines: true, "
            "deferred_row_sum: true, staged_ids: true, l2_prefetch: false}")
#: The second call's trees: ``pa`` = ``p2``'s V3.2 32-head row, V3.2 at 16 heads with two producers of 80 registers
#: (32-row steps), e4m3 at 16 heads with two of 120 (whole-block steps); ``pb`` = V3.2 at 32 heads with two of 96
#: (32-row steps, the second consumer 104), e4m3 at 32 heads with two of 88 (32-row steps, consumers 168), V3.2 at
#: 16 heads with two of 72.
DS_H16_A = DS_H16.replace("producer_regs: 120, producer_rows: 64", "producer_regs: 80, producer_rows: 32, producers: 2")
E4M3_H16_A = E4M3_H16.replace("producer_regs: 152", "producer_regs: 120, producers: 2")
DS_B = DS_H32.replace("producer_regs: 152", "producer_regs: 96, producer_rows: 32, producers: 2")
E4M3_B = E4M3_H32.replace("consumer_regs: 176, producer_regs: 152",
                          "consumer_regs: 168, producer_regs: 88, producer_rows: 32, producers: 2")
DS_H16_B = DS_H16.replace("producer_regs: 120, producer_rows: 64", "producer_regs: 72, producer_rows: 32, producers: 2")
VARIANTS = {"main": [], "p2": [(E4M3_H32, E4M3_P2), (DS_H32, DS_P2)],
            "p2s": [(E4M3_H32, E4M3_P2), (DS_H32, DS_P2S)],
            "pa": [(DS_H32, DS_P2), (DS_H16, DS_H16_A), (E4M3_H16, E4M3_H16_A)],
            "pb": [(DS_H32, DS_B), (E4M3_H32, E4M3_B), (DS_H16, DS_H16_B)]}
#: The third call's trees, of branch ``wip/two-producers-tm`` (the fifty-sixth session's ``tm``,
#: benchmarks/gluon_fp8_first_one_tile_on_main.patch, merged: ``first_one_tile``): ``k`` = ``pa`` without its V3.2
#: 16-head row; ``kt`` = ``k`` with V3.2's 32-head row on ``first_one_tile`` (the second consumer 144, the first 192)
#: and e4m3's split launches (the column split at 16 and 32 heads) with two producers of 120 (whole-block steps).
E4M3_H16_SPLIT = "params: {head_block: 16, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, l2_prefetch: false}"
E4M3_H32_SPLIT = ("params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, "
                  "staged_ids: true, l2_prefetch: false}")
TWO_120 = ("producer_regs: 152", "producer_regs: 120, producers: 2")
DS_TM = DS_H32.replace("consumer_regs: 104, producer_regs: 152",
                       "consumer_regs: 144, producer_regs: 88, producer_rows: 32, producers: 2, first_one_tile: true")
TM_VARIANTS = {"main": [], "k": [(DS_H32, DS_P2), (E4M3_H16, E4M3_H16_A)],
               "kt": [(DS_H32, DS_TM), (E4M3_H16, E4M3_H16_A), (E4M3_H16_SPLIT, E4M3_H16_SPLIT.replace(*TWO_120)),
                      (E4M3_H32_SPLIT, E4M3_H32_SPLIT.replace(*TWO_120))]}


#: Prepared in the sixty-first session, timed in the sixty-second (H100; trees of main, on which V3.2's 32-head row
#: and e4m3's 16-head unsplit row already have two producers): V3.2 at 16 heads with two producers of whole-block
#: steps, which AOT sm90 compiles with small spills - ``n16``: producers 96, the second consumer 160 (16 bytes
#: spilled); ``n16b``: producers 104, the second consumer 152 (32 bytes). ``main`` is the baseline. Both lost
#: (BENCHMARKS.md, sixty-second session).
NEXT_VARIANTS = {"main": [],
                 "n16": [(DS_H16, DS_H16.replace("consumer_regs: 176, producer_regs: 120",
                                                  "consumer_regs: 160, producer_regs: 96, producers: 2"))],
                 "n16b": [(DS_H16, DS_H16.replace("consumer_regs: 176, producer_regs: 120",
                                                   "consumer_regs: 152, producer_regs: 104, producers: 2"))]}
#: ``which`` -> the variants it builds.
WHICH = {"first": VARIANTS, "tm": TM_VARIANTS, "next": NEXT_VARIANTS}


def main(out_dir: str = "out", commit: str = BASE, which: str = "first") -> None:
    """``out_dir/NAME`` for each variant of ``WHICH[which]``: :data:`VARIANTS` (``first``), :data:`TM_VARIANTS`
    (``tm``, of branch ``wip/two-producers-tm``) or :data:`NEXT_VARIANTS` (``next``, of main)
    (``tree_ab.build_trees``), each printed."""
    build_trees(commit, out_dir, TABLE, WHICH[which])


if __name__ == "__main__":
    main(*sys.argv[1:])
