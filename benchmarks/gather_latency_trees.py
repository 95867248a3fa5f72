"""The trees of a diagnostic for the next H200 (issue #12; BENCHMARKS.md, seventy-ninth session, section 3): where
HBM's latency sits in V3.2's 32-head launches, as the seventy-first session measured it on an H100 (its section 2),
rewritten against main (its patches no longer apply). Each probe sends one kind of global read of
``mla_sink/kernels/gluon/gluon_fp8.py`` to row ``id & 16383`` (an L2-resident row after a replay's first touches) and
leaves every other read on the real row and every mask as it was. Their outputs are wrong: they time, they do not
compute.

- ``main``: main's kernels;
- ``dA``: the producers' gathers of the latent codes (``_gather_latent``, the unsplit launches' ``producer_ahead``,
  and ``_producer``'s hinted row loads, the split launches and e4m3);
- ``dB``: V3.2's tile scales (``_tile_scales``) and RoPE copies (``_copy_rope``), at 32 heads the second consumer's
  loads;
- ``dAB``: both.

On the H100 (seventy-first session) ``dA`` took V3.2 H=32 T=256 from 180-182 to 160-162 us, ``dB`` to 176.5: the
producers' wait for HBM held about 11% there. The H200's HBM is faster; if ``dA`` gains little there, the first
consumer's chain holds what is left of the bar's miss, otherwise the gather's latency does.

    PYTHONPATH=. python3 benchmarks/gather_latency_trees.py out
    # on the device, carrying out/main, out/dA, out/dB, out/dAB (about 45 s a tree):
    cd benchmarks && TREE_AB_VARIANT_TIMEOUT=90 PYTHONPATH=..:. python3 -u producers_h200_ab.py $OUT/diag.json \\
        m1=../out/main dA=../out/dA dB=../out/dB dAB=../out/dAB m2=../out/main
"""

from __future__ import annotations

import os
import sys

from tree_ab import build_trees

#: The commit the trees are archived from (main).
BASE = "HEAD"
#: The kernel file each probe edits, relative to a tree.
KERNEL = os.path.join("mla_sink", "kernels", "gluon", "gluon_fp8.py")
#: Rows of the pool every probed read is sent to (16,384 V3.2 rows: 10.7 MB, well inside the 50-60 MB L2).
L2_ROWS = 16384
_TO_L2 = f" & {L2_ROWS - 1}"
#: The producers' latent gathers: ``_gather_latent``'s row pointers, and ``_producer``'s hinted loads.
GATHERS = [
    ("    rows = _rows(KV, ids, stride_kv, kv_block_size, True, ROW_BYTES)\n",
     f"    rows = _rows(KV, ids{_TO_L2}, stride_kv, kv_block_size, True, ROW_BYTES)\n"),
    ("x_n = _gather_bytes(_rows(KV, ids_n, stride_kv", f"x_n = _gather_bytes(_rows(KV, ids_n{_TO_L2}, stride_kv"),
]
#: V3.2's tile scales and RoPE copies (their masks stay on the real ids).
META = [
    ("    rows = (_rows(KV, ids, stride_kv, kv_block_size, True, ROW_BYTES) + DS_",
     f"    rows = (_rows(KV, ids{_TO_L2}, stride_kv, kv_block_size, True, ROW_BYTES) + DS_", 2),
]
#: Each tree -> its edits of :data:`KERNEL`.
VARIANTS = {"main": [], "dA": GATHERS, "dB": META, "dAB": GATHERS + META}


def main(out_dir: str = "out", commit: str = BASE) -> None:
    """``out_dir/NAME`` for each of :data:`VARIANTS`: ``commit`` archived with the variant's edits
    (``tree_ab.build_trees``), each tree printed.

    Raises:
        ValueError: an edited text no longer occurs as often as the probe needs (the kernel changed).
    """
    build_trees(commit, out_dir, KERNEL, VARIANTS)


if __name__ == "__main__":
    main(*sys.argv[1:])
