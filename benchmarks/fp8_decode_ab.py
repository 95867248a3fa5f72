"""A/B of where the seesaw kernel decodes an fp8 cache (seventh session, 2026-12-01). Each variant is a tree
(``mla_sink``, ``dispatch``, ``tables``) run in a child process on the same data through the library
(``mla_sink.sparse_mla_decode``, the plan's own splits), CUDA-graph replay, L2 flushed, sinks on, topk 2048;
every variant's ``out`` is compared with the first one's (max abs difference).

    PYTHONPATH=. python3 -u benchmarks/fp8_decode_ab.py OUT.json NAME=TREE [NAME=TREE ...]

``TREE`` holds ``git archive <commit> mla_sink dispatch tables pyproject.toml`` (or ``.`` for the working tree).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

CASES = [(kv, h, t) for kv in ("fp8_e4m3", "fp8_ds_mla") for h in (64, 128) for t in (2, 64, 256)]
CASES += [("bf16", 64, 256), ("bf16", 128, 256)]


def run_variant(variant: str, dump: str) -> dict:
    """Time every case with the ``mla_sink`` on the path and save the outputs to ``dump`` (the timing loop of
    :mod:`seesaw_wgmma_ab`, on this script's cases)."""
    import seesaw_wgmma_ab
    return seesaw_wgmma_ab.run_variant(variant, dump, CASES)


def main(path: str, *variants: str) -> None:
    """Run each ``NAME=TREE`` variant in a child process, compare the outputs, write the report to ``path``."""
    out_dir = os.path.dirname(os.path.abspath(path))
    here = os.path.abspath(os.path.dirname(__file__))
    report: dict = {"cases": [f"{k}-h{h}-T{t}" for k, h, t in CASES], "us": {}, "max_abs_diff_vs_first": {}}
    dumps = []
    for spec in variants:
        name, tree = spec.split("=", 1)
        dump = os.path.join(out_dir, f"ab_{name}.pt")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        code = (f"import sys, json; sys.path.insert(0, {here!r}); import fp8_decode_ab as m; "
                f"print('JSON', json.dumps(m.run_variant({name!r}, {dump!r})))")
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.abspath(tree), capture_output=True,
                           text=True)
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        line = [x for x in r.stdout.splitlines() if x.startswith("JSON")]
        if line:
            report["us"][name] = json.loads(line[0][len("JSON"):])
            dumps.append((name, dump))
    if dumps:
        first = torch.load(dumps[0][1])
        for name, dump in dumps[1:]:
            other = torch.load(dump)
            report["max_abs_diff_vs_first"][name] = {k: float((first[k] - other[k]).abs().max()) for k in first}
    for _, dump in dumps:
        os.remove(dump)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
