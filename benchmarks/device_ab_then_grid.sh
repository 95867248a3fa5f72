#!/usr/bin/env bash
# One device call for the third-consumer decision (forty-fourth session, 2026-12-05: the device was refused or taken
# back five times, so the A/B, the GPU tests and the FlashMLA grid share one call instead of three fresh starts).
#
#   bash benchmarks/device_ab_then_grid.sh OUT NAME=TREE ...     (repo root; TREE relative to benchmarks/, as
#   few_heads_ab.py takes it; carry out/ and .peers/)
#
# 1. few_heads_ab.py over the variants (the first one is the baseline), JSON in OUT/ab.json;
# 2. pick_winner.py picks the tree with the fastest V3.2 H=32 T=256 that keeps every fp8 case at H=16 and 32 under
#    its own bf16 time wherever the baseline does (the baseline on a tie or a regression);
# 3. FlashMLA builds in the background while the winner's fp8 GPU tests run (they are not timed);
# 4. the winner's full grid with FlashMLA in it: OUT/grid.json, OUT/grid.png.
# Fifty-third session: AB_TIMEOUT (seconds, default 240) bounds the A/B of more trees; AB_ONLY=1 stops after the A/B
# (and pick_winner), WINNER=TREE (repo-relative) skips the A/B and runs that tree's tests and grid - so six trees take
# two calls of the ten-minute limit:
#   AB_TIMEOUT=450 AB_ONLY=1 bash benchmarks/device_ab_then_grid.sh OUT NAME=TREE ...
#   WINNER=out/NAME bash benchmarks/device_ab_then_grid.sh OUT
set -u
out=$(realpath "$1"); shift
root=$(pwd)
if [ -n "${WINNER:-}" ]; then
  winner=$(realpath "$WINNER")
else
  # a variant that hangs is killed after 100 s and left out (tree_ab.run_variants), so the later ones still run
  (cd benchmarks && TREE_AB_VARIANT_TIMEOUT=100 PYTHONPATH=..:. timeout "${AB_TIMEOUT:-240}" python3 -u few_heads_ab.py \
      "$out/ab.json" "$@" > "$out/ab.log" 2>&1)
  grep -v '^ *$' "$out/ab.log" | grep -v '^{\|^ \|^}' | tail -40
  winner=$(cd benchmarks && cd "$(python3 pick_winner.py "$out/ab.json" "$@")" && pwd)  # TREEs are benchmarks/-relative
fi
echo "winner: $winner"
if [ -n "${AB_ONLY:-}" ]; then
  exit 0
fi
(MAX_JOBS=16 timeout 200 python3 .peers/setup_flashmla.py build_ext --inplace > "$out/build.log" 2>&1; echo "build rc $?" >> "$out/build.log") &
# the empty ranges of 17-32-head V3.2 launches first (the fifty-second session's meta_by_second hang: BENCHMARKS.md;
# more tokens than SMs for the token_loop experiment)
(cd "$winner" && PYTHONPATH=. timeout 90 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
    tests/test_gluon_fp8_gpu.py -k "ds_mla_paged_padded_blocks_topk_length or more_tokens_than_sms" \
    > "$out/tests.log" 2>&1
    echo "tests rc $?" >> "$out/tests.log"
    PYTHONPATH=. timeout 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
    tests/test_fp8_ds_mla_gpu.py tests/test_gluon_fp8_gpu.py >> "$out/tests.log" 2>&1; echo "tests rc $?" >> "$out/tests.log")
grep -E "passed|failed|error|rc " "$out/tests.log" | tail -6
wait
tail -1 "$out/build.log"
(cd "$winner" && PYTHONPATH="$root/.peers/FlashMLA:." timeout 180 python3 -u -m mla_sink bench --peers \
    --json "$out/grid.json" --png "$out/grid.png" > "$out/grid.log" 2>&1; echo "grid rc $?" >> "$out/grid.log")
tail -70 "$out/grid.log"
