"""The trees of the third-consumer A/B (prepared in the forty-second session, which had no device time; issue #12's
V3.2 H=32 T=256 bar; timed in the forty-fifth session and not kept, BENCHMARKS.md). Each is a ``git archive`` of
:data:`BASE` (the last commit the patch was kept applying to; later kernel changes need not follow it) with
``benchmarks/gluon_fp8_third_consumer.patch`` applied (the kernel's ``THIRD_CONSUMER``: the first consumer of the
column split on the scores only, the second and a third consumer warpgroup on half of ``P V`` each; the table's
``ds_mla_h32`` row on it) and one edit of ``tables/gluon_fp8.yaml``:

- ``main``: :data:`BASE` as it is (no patch);
- ``three``: the patch (``ds_mla_h32``: consumers 104, producer 120, the first consumer 184 registers);
- ``three_p152``: the producer at 152 (as main's ``ds_mla_h32``), the first consumer 152;
- ``three_early``: with ``early_ids`` (the first consumer loads each next block's ids a block ahead; it lost on long
  ranges when it also held half of ``O^T``, thirty-fifth session);
- ``three_e4``: e4m3's 32-head rows (``e4m3_h32_unsplit``, ``e4m3_h32_split``) on the column split with a third
  consumer too (consumers 104, producer 152);
- ``three_h16``: V3.2's 16-head rows (``ds_mla_h16``, both ``*_short`` rows) with a third consumer (consumers 96,
  producer 152).

Every variant compiles for sm90 with Triton 3.6's ptxas without a spill (forty-second session). Then, on the H200:

    PYTHONPATH=. python3 benchmarks/third_consumer_trees.py out
    cd benchmarks && PYTHONPATH=..:. python3 -u few_heads_ab.py OUT.json m1=../out/main a1=../out/three \\
        b1=../out/three_p152 c1=../out/three_early d1=../out/three_e4 e1=../out/three_h16 m2=../out/main a2=../out/three
"""

from __future__ import annotations

import os
import subprocess
import sys

from tree_ab import archive_tree

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH = os.path.join(HERE, "gluon_fp8_third_consumer.patch")
TABLE = os.path.join("tables", "gluon_fp8.yaml")
#: The commit the trees are archived from (forty-fifth session; its kernels are d931ea3's, timed in that session).
BASE = "30937de18b3e452fa9b9703c5da283ac00d484c9"

_DS_H32 = ("    params: {head_block: 32, consumer_regs: 104, producer_regs: 120, deferred_row_sum: true, "
           "scores_only: true,\n")
_E4_UNSPLIT = ("    path: alternate_scores\n    params: {head_block: 32, consumer_regs: 176, producer_regs: 152, "
               "deferred_row_sum: true, staged_ids: true}")
_E4_SPLIT = ("    params: {head_block: 32, consumer_regs: 104, producer_regs: 152, deferred_row_sum: true, "
             "staged_ids: true}")
_THIRD_E4 = _E4_SPLIT.replace("staged_ids: true}", "staged_ids: true, scores_only: true, third_consumer: true}")
_DS_H16 = ("    path: alternate_blocks\n    params: {head_block: 16, consumer_regs: 176, producer_regs: 120, "
           "producer_rows: 64, lines: true, deferred_row_sum: false}")
_THIRD_H16 = ("    path: column_split\n    params: {head_block: 16, consumer_regs: 96, producer_regs: 152, "
              "deferred_row_sum: false, scores_only: true, third_consumer: true}")
_DS_SHORT = ("    params: {head_block: 16, consumer_regs: 104, producer_regs: 152, deferred_row_sum: false, "
             "scores_only: true,\n             early_ids: true}")
_THIRD_SHORT = _DS_SHORT.replace("consumer_regs: 104", "consumer_regs: 96").replace(
    "early_ids: true}", "early_ids: true, third_consumer: true}")

#: Variant -> the (old, new, count) edits of the patched tables/gluon_fp8.yaml (``count``: how often ``old`` occurs).
VARIANTS = {
    "three": [],
    "three_p152": [(_DS_H32, _DS_H32.replace("producer_regs: 120", "producer_regs: 152"), 1)],
    "three_early": [(_DS_H32, _DS_H32.replace("scores_only: true,", "scores_only: true, early_ids: true,"), 1)],
    "three_e4": [(_E4_UNSPLIT, "    path: column_split\n" + _THIRD_E4, 1), (_E4_SPLIT, _THIRD_E4, 1)],
    "three_h16": [(_DS_H16, _THIRD_H16, 1), (_DS_SHORT, _THIRD_SHORT, 2)],
}


def build(out_dir: str, name: str) -> str:
    """``out_dir/name``: :data:`BASE`'s ``mla_sink``, ``dispatch``, ``tables``, ``tests`` and ``pyproject.toml``,
    patched and edited as :data:`VARIANTS` says (``main``: as they are). Returns its path.

    Raises:
        ValueError: an edit's text is not in the table as often as expected (the table moved on: rebase the edit).
        subprocess.CalledProcessError: the archive or the patch failed.
    """
    tree = archive_tree(BASE, os.path.join(out_dir, name))
    if name == "main":
        return tree
    subprocess.run(["git", "apply", "--unsafe-paths", "--directory", os.path.relpath(tree), PATCH], check=True)
    path = os.path.join(tree, TABLE)
    with open(path) as f:
        text = f.read()
    for old, new, count in VARIANTS[name]:
        if text.count(old) != count:
            raise ValueError(f"{name}: expected {count} occurrence(s) of {old!r} in {TABLE}, got {text.count(old)}")
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return tree


def main(out_dir: str = "out", *names: str) -> None:
    """Build ``main`` and every variant of :data:`VARIANTS` (or those named) under ``out_dir``."""
    for name in names or ("main", *VARIANTS):
        print(build(out_dir, name))


if __name__ == "__main__":
    main(*sys.argv[1:])
