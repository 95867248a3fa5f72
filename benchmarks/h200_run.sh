#!/usr/bin/env bash
# One H200 session's run (BENCHMARKS.md): build the FlashMLA peer, the GPU suite, the kernel bench with
# FlashMLA beside ours, the host-cost bench. (Longer than one 600 s device call: run its parts in two.)
# Usage (repo root, .peers/ laid out as ../shared/peers/README.md says): bash benchmarks/h200_run.sh OUTDIR
set -u
OUT=${1:?output dir}
MAX_JOBS=16 python3 .peers/setup_flashmla.py build_ext --inplace > "$OUT/fmla_build.log" 2>&1 || true
export PYTHONPATH=.peers/FlashMLA:.
python3 -c "import flash_mla; print('flash_mla importable')" 2>&1 | tail -1
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > "$OUT/gpu_suite.log" 2>&1
tail -4 "$OUT/gpu_suite.log"
timeout 240 python3 -u -m mla_sink bench --host --pool-rows 1000000 --json "$OUT/host.json" > "$OUT/host.log" 2>&1
tail -9 "$OUT/host.log"
timeout 300 python3 -u -m mla_sink bench --peers --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
tail -60 "$OUT/bench.log"
