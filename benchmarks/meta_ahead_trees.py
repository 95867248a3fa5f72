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

    PYTHONPATH=. python3 benchmarks/meta_ahead_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main a=../out/ahead l=../out/loop m2=../out/main

(on the device, carrying ``out`` and ``.peers``: the A/B, the winner's fp8 GPU tests, its grid with FlashMLA).

Keep a tree only if every output is bitwise equal to ``m1``'s (``max_abs_diff_vs_first``) and V3.2 H=32 is faster
at T = 64 and 256 (``loop`` changes T=256 only: T=64 is split).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tree_ab import archive_tree

#: The commit both trees are archived from (main; the patch applies to its gluon_fp8.py).
BASE = "HEAD"
PATCH = os.path.join("benchmarks", "gluon_fp8_meta_ahead.patch")
#: The token loop, against main with :data:`PATCH` applied.
LOOP_PATCH = os.path.join("benchmarks", "gluon_fp8_token_loop.patch")


def main(out_dir: str = "out", base: str = BASE) -> None:
    """``out_dir/main``, ``out_dir/ahead`` and ``out_dir/loop`` (run from the repository root).

    Raises:
        subprocess.CalledProcessError: the archive, its extraction or the patch failed.
    """
    print(archive_tree(base, os.path.join(out_dir, "main")))
    ahead = archive_tree(base, os.path.join(out_dir, "ahead"))
    subprocess.run(["git", "apply", f"--directory={ahead}", PATCH], check=True)
    print(ahead)
    loop = archive_tree(base, os.path.join(out_dir, "loop"))
    for patch in (PATCH, LOOP_PATCH):
        subprocess.run(["git", "apply", f"--directory={loop}", patch], check=True)
    print(loop)


if __name__ == "__main__":
    main(*sys.argv[1:])
