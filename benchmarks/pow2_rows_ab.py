"""A/B of ``pow2_rows`` on the V3.2 32-head unsplit launches (issue #12, seventy-fifth session, BENCHMARKS.md): the
producers store the latent codes of rows whose four tile scales are powers of two (or 0) decoded (code x scale, exact
in bf16), so that a block of such rows takes e4m3's chain in the first consumer (one ``P^T``, scales read 1), against
main, where every V3.2 block carries four ``P_t = P x scale_t``. The cache's scales are FlashMLA's powers of two by
default, vLLM's ``amax / 448`` with ``AB_DS_SCALE=amax`` (every block on the four-``P_t`` fallback: the flag's cost).
The other cases are the bar's references (bf16 and e4m3 at the same shape) and a 16-head V3.2 case, which
``pow2_rows`` leaves alone. Each variant is a tree run in a child process (:mod:`tree_ab`) on the same data,
CUDA-graph replay, L2 flushed, sinks on, topk 2048, bf16 q; every variant's ``out`` is compared with the first one's.

    PYTHONPATH=..:. python3 -u pow2_rows_ab.py OUT.json NAME=TREE [NAME=TREE ...]
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [("fp8_ds_mla", 32, 256), ("bf16", 32, 256), ("fp8_e4m3", 32, 256), ("fp8_ds_mla", 16, 256)]


run_variant, main = case_script("pow2_rows_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
