#!/usr/bin/env bash
# The kernel grid with FlashMLA beside ours, on an H200 only (issue #12's bars name the H200): on any other GPU it
# stops at once, so a device call that lands on an H100 costs only its start. Run from the repo root on the device,
# with .peers (FlashMLA laid out by ../shared/peers/prepare_flashmla.sh, setup_flashmla.py and its stubs) carried:
#     bash benchmarks/h200_grid.sh        (writes $OUT/grid.json, grid.png, grid.log, fmla_build.log)
set -u
name=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in *H200*) ;; *) echo "not an H200: stop"; exit 3;; esac
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
(MAX_JOBS=16 python3 .peers/setup_flashmla.py build_ext --inplace > "$OUT/fmla_build.log" 2>&1) || { tail -20 "$OUT/fmla_build.log"; exit 4; }
PYTHONPATH=.peers/FlashMLA:. python3 -u -m mla_sink bench --peers --json "$OUT/grid.json" --png "$OUT/grid.png" 2>&1 | tee "$OUT/grid.log"
