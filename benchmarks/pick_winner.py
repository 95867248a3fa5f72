"""Pick the tree of a few-heads A/B (``few_heads_ab.py``'s JSON) for issue #12's open bar, V3.2 H=32 T=256
(forty-fourth session; ``device_ab_then_grid.sh`` calls it on the device and runs the winner's tests and grid).

The winner is the variant with the fastest ``fp8_ds_mla-h32-T256`` that keeps every fp8 case at H=16 and 32 faster
than its own bf16 time at the same shape wherever the baseline (the first variant) does, and whose output matches the
baseline's (max abs difference at most ``MAX_DIFF``); the baseline wins a tie within ``TIE_US``. A variant whose
``NAME`` starts with :data:`PROBE` is timed but never picked (a probe that would not merge as it is: fiftieth session,
the f16 route without its NaN operations). Prints the winner's tree (the ``TREE`` of its ``NAME=TREE``).

    python3 benchmarks/pick_winner.py AB.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import json
import sys

#: the bar's case
TARGET = "fp8_ds_mla-h32-T256"
#: a variant must beat the baseline by more than this (µs) at TARGET: the A/B's run-to-run spread is about 0.5 µs
TIE_US = 1.0
#: the largest max abs difference of ``out`` from the baseline's that still counts as the same result (bf16 out)
MAX_DIFF = 0.02
#: the name prefix of a variant that is timed for information only
PROBE = "x"


def _keeps_bars(us: dict, base: dict) -> bool:
    """Whether every fp8 case that beats bf16 in ``base`` beats it in ``us`` too."""
    for case, t in us.items():
        kv, shape = case.split("-", 1)
        if kv == "bf16":
            continue
        bf16 = f"bf16-{shape}"
        if base[case] < base[bf16] and not t < us[bf16]:
            return False
    return True


def main(path: str, *variants: str) -> None:
    report = json.load(open(path))
    trees = dict(v.split("=", 1) for v in variants)
    names = list(trees)  # in the command's order (the baseline first)
    base_name = names[0]
    base = report["us"].get(base_name)
    if base is None or TARGET not in base:
        print(trees[base_name])
        return
    best, best_us = base_name, base[TARGET] - TIE_US
    for name in names[1:]:
        us = report["us"].get(name)
        diff = report["max_abs_diff_vs_first"].get(name, {})
        if name.startswith(PROBE) or not us or TARGET not in us or any(d > MAX_DIFF for d in diff.values()):
            continue
        if us[TARGET] < best_us and _keeps_bars(us, base):
            best, best_us = name, us[TARGET]
    print(trees[best])


if __name__ == "__main__":
    main(*sys.argv[1:])
