"""The thirty-sixth session's raw ring (``raw_ring_ab.py``) against the column split at one, two and three waves of
unsplit 32-block CTAs (T = 128, 256, 384 at 32 heads on 132 SMs), so that each kernel's time splits into a period
per block and a cost per CTA outside the loop (``time = waves * (32 * period + per_cta)``). Same harness (``raw3`` =
d68b074 of ``wip/raw-ring``, ``raw4`` = 1e46c2c: ``K_t`` by 16-byte loads, ``raw5`` = a8feca9 with the table's
``ds_mla_h32`` at 240 / 24 registers, the row sum once a block, and the launcher's ``PAIRS`` on for the raw ring)::

    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_waves_ab.py OUT.json main=../out/main raw3=../out/raw3
    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_waves_ab.py OUT.json main=../out/main raw3=../out/raw3 \
        raw4=../out/raw4
    cd benchmarks && PYTHONPATH=..:. python3 -u raw_ring_waves_ab.py OUT.json main=../out/main raw4=../out/raw4 \
        raw5=../out/raw5
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, 32, t) for kv in ("fp8_ds_mla", "bf16", "fp8_e4m3") for t in (128, 256, 384)]

run_variant, main = case_script("raw_ring_waves_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
