#!/usr/bin/env bash
# One H200 session's run (BENCHMARKS.md): build the FlashMLA peer, the GPU suite, the kernel bench with
# FlashMLA beside ours, the host-cost bench. (Longer than one 600 s device call: run its parts in two.)
# Usage (repo root, .peers/ laid out as ../shared/peers/README.md says): bash benchmarks/h200_run.sh OUTDIR
#   PARTS   which parts run, of "suite host grid bar" (default the first three; FlashMLA is built whenever grid
#           runs); bar: the grid's 16- and 32-head cases alone, no peers and no build (the one bar of issue #12
#           still missed, fp8 faster than bf16 there, in about two minutes: sixty-ninth session)
#   H200_ONLY=1   stop at once (exit 3) unless nvidia-smi names an H200, so that a device call which lands on
#                 another GPU costs only its start: issue #12's bars name the H200 (sixty-sixth session:
#                 H200_ONLY=1 PARTS=grid bash benchmarks/h200_run.sh "$OUT")
set -u
OUT=${1:?output dir}
PARTS=${PARTS:-suite host grid}
part() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }  # whether PARTS names part $1
gpu=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1)
echo "GPU: $gpu"
if [ -n "${H200_ONLY:-}" ]; then
  case "$gpu" in *H200*) ;; *) echo "not an H200: stop"; exit 3;; esac
fi
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
if part grid; then
  MAX_JOBS=16 python3 .peers/setup_flashmla.py build_ext --inplace > "$OUT/fmla_build.log" 2>&1 || true
fi
export PYTHONPATH=.peers/FlashMLA:.
python3 -c "import flash_mla; print('flash_mla importable')" 2>&1 | tail -1
if part suite; then
  timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ > "$OUT/gpu_suite.log" 2>&1
  tail -4 "$OUT/gpu_suite.log"
fi
if part host; then
  timeout 240 python3 -u -m mla_sink bench --host --pool-rows 1000000 --json "$OUT/host.json" > "$OUT/host.log" 2>&1
  tail -9 "$OUT/host.log"
fi
if part bar; then
  timeout 240 python3 -u -m mla_sink bench --no-peers --cases=-h32-,-h16- --json "$OUT/bar.json" --png "$OUT/bar.png" \
    > "$OUT/bar.log" 2>&1
  tail -30 "$OUT/bar.log"
fi
if part grid; then
  timeout 300 python3 -u -m mla_sink bench --peers --json "$OUT/bench.json" --png "$OUT/bench.png" > "$OUT/bench.log" 2>&1
  tail -60 "$OUT/bench.log"
fi
