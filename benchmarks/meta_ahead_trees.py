"""The trees of the fifty-second session's two prepared changes (issue #12's one missed bar, V3.2 H=32 T=256 on
the H200: BENCHMARKS.md, fifty-second session, section 5). Each is a ``git archive`` of :data:`BASE` (main):

- ``main``: main's kernel. The column split's second consumer (``meta_by_second``, ``rope_by_second`` on the table
  row ``ds_mla_h32``) loads block i + 2's ids (and RoPE ids) before its P V of block i, and block i + 2's tile
  scales after it, each read in the same block (ncu: a third of that consumer's stall samples; the first consumer's
  wait for the published scales 6% of its);
- ``ahead``: main with benchmarks/gluon_fp8_meta_ahead.patch (branch ``wip/meta-ahead``) - each block's end reads
  what the previous block's end loaded and loads what the next block's end reads, so every global load of the second
  consumer has a block to land, and its prologue loads the first two blocks' ids, then their scales (two round
  trips, not five or six). AOT sm90 (Triton 3.6): no spill, the second consumer's loop 299 instructions against
  295, the first's unchanged (762, no global load);
- ``loop``: ``ahead`` with benchmarks/gluon_fp8_token_loop.patch (branch ``wip/token-loop``) - the table param
  ``token_loop`` on ``ds_mla_h32``: an unsplit launch takes as many CTAs along the tokens as the SMs hold (132 on an
  H100 / H200 at 32 heads), each taking tokens ``program_id, + num_programs, ..`` in turn, the ring's stages and
  phases (and the second consumer's look-ahead) continuing across tokens, so a CTA's next token is gathered while
  its consumers finish this one. At T=256 the timeline (BENCHMARKS.md, fifty-second session, section 4) puts about
  8.7 us of each CTA outside its 32 blocks (the first block's gather about 4, the epilogue 3.5), twice an SM.
  AOT sm90: no spill; every per-block loop as in ``ahead`` but the first consumer's, 770 instructions against 762
  (the ring index counts the token's first block); launches that are split, or of other rows, compile to the same
  loops as ``ahead``.

Fifty-third session (no device lent; AOT sm90 only, BENCHMARKS.md fifty-third session), three more:

- ``loop2``: ``loop`` with benchmarks/gluon_fp8_token_loop2.patch (branch ``wip/token-loop2``) - the second
  consumer issues the next token's first ids before this token's epilogue and the rest after it, the next token's
  range is computed after the block loop, the sinks are loaded once a CTA, the grid takes the plan's ``num_sms``;
  the token loop moves to its own row ``ds_mla_h32_unsplit`` (second consumer 120, producer 144: no spill at H=32);
- ``tiles``: ``ahead`` with benchmarks/gluon_fp8_first_one_tile.patch (branch ``wip/tiles13``) - ``first_one_tile``
  on ``ds_mla_h32``: the first consumer accumulates one V3.2 value tile and the second three (second consumer 144
  registers, first 208; its loop 704 instructions against 762, the second's 360 against 299). The fifty-second
  session's timeline puts the first consumer's chain (2.46 µs a block, 0.64 of it its half of P V) on the period
  while the second waits 0.32 µs a block for P;
- ``both``: ``loop2`` with benchmarks/gluon_fp8_tiles_loop.patch (branch ``wip/tiles-loop``) - the two together
  (unsplit: second consumer 152, producer 144).

    PYTHONPATH=. python3 benchmarks/meta_ahead_trees.py out
    AB_TIMEOUT=450 AB_ONLY=1 bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main a=../out/ahead \
        l2=../out/loop2 t=../out/tiles b=../out/both m2=../out/main
    WINNER=out/<name> bash benchmarks/device_ab_then_grid.sh $OUT     (the second call: its tests and grid)

(on the device, carrying ``out`` and ``.peers``: the A/B, then the winner's fp8 GPU tests and its grid with FlashMLA).

Keep a tree only if every output is bitwise equal to ``m1``'s (``max_abs_diff_vs_first``) and V3.2 H=32 is faster
at T = 64 and 256 (``loop`` and ``loop2`` change T=256 only: T=64 is split).
"""

from __future__ import annotations

import os
import sys

from tree_ab import trees_main

#: The commit the trees are archived from: main when they were built (fifty-third and fifty-fourth sessions); the
#: patches no longer apply to main since the fifty-fifth session's epilogue change.
BASE = "24349e6"
PATCH = os.path.join("benchmarks", "gluon_fp8_meta_ahead.patch")
#: The token loop, against main with :data:`PATCH` applied.
LOOP_PATCH = os.path.join("benchmarks", "gluon_fp8_token_loop.patch")
#: Its second version, against ``loop``.
LOOP2_PATCH = os.path.join("benchmarks", "gluon_fp8_token_loop2.patch")
#: The value tiles one to three, against ``ahead``.
TILES_PATCH = os.path.join("benchmarks", "gluon_fp8_first_one_tile.patch")
#: The value tiles one to three on ``loop2``.
BOTH_PATCH = os.path.join("benchmarks", "gluon_fp8_tiles_loop.patch")
#: Each tree -> the patches applied, in order, to an archive of the base.
TREES = {"main": (), "ahead": (PATCH,), "loop": (PATCH, LOOP_PATCH), "loop2": (PATCH, LOOP_PATCH, LOOP2_PATCH),
         "tiles": (PATCH, TILES_PATCH), "both": (PATCH, LOOP_PATCH, LOOP2_PATCH, BOTH_PATCH)}


main = trees_main(TREES, BASE)


if __name__ == "__main__":
    main(*sys.argv[1:])
