"""A/B of where the seesaw kernel decodes an fp8 cache (seventh session, 2026-12-01). Each variant is a tree
(``mla_sink``, ``dispatch``, ``tables``) run in a child process on the same data through the library
(``mla_sink.sparse_mla_decode``, the plan's own splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048;
every variant's ``out`` is compared with the first one's (max abs difference).

    PYTHONPATH=. python3 -u benchmarks/fp8_decode_ab.py OUT.json NAME=TREE [NAME=TREE ...]

``TREE`` holds ``git archive <commit> mla_sink dispatch tables pyproject.toml`` (or ``.`` for the working tree).
"""

from __future__ import annotations

import sys

from tree_ab import case_script

CASES = [(kv, h, t) for kv in ("fp8_e4m3", "fp8_ds_mla") for h in (64, 128) for t in (2, 64, 256)]
CASES += [("bf16", 64, 256), ("bf16", 128, 256)]


run_variant, main = case_script("fp8_decode_ab", CASES)


if __name__ == "__main__":
    main(*sys.argv[1:])
