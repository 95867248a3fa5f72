#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu`) in one device call, FlashMLA built beside it for the tests that compare
# with it (forty-sixth session, 2026-12-05: no device was lent, and the last whole-suite run, the forty-first
# session's, predates the forty-second to forty-sixth sessions' launcher, routing and DCP changes).
#
#   bash benchmarks/gpu_suite.sh OUT          (repo root on the device; carry .peers/, laid out as
#                                              ../shared/peers/README.md says)
#
# Six pytest processes share the GPU (the suite's files take 1-8 minutes each alone; test_gluon_gpu.py the longest);
# tests/test_fp8_ds_mla_gpu.py starts once FlashMLA is built. Each file group's log is OUT/gpu_<group>.log, ending
# in its pytest summary and "rc N"; the build's is OUT/flashmla_build.log. A group that reaches its limit
# (GPU_TEST_TIMEOUT seconds, default 540) ends with rc 124 and the tests it ran.
set -u
out=$(realpath "$1")
mkdir -p "$out"
limit=${GPU_TEST_TIMEOUT:-540}
group() {  # group NAME PYTEST-ARGS...: one pytest process over the gpu-marked tests of the given files
  local name=$1
  shift
  PYTHONPATH=.peers/FlashMLA:. timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider \
    --basetemp="/tmp/pytest-$name" "$@" > "$out/gpu_$name.log" 2>&1
  echo "rc $?" >> "$out/gpu_$name.log"
}
(MAX_JOBS=16 timeout 240 python3 .peers/setup_flashmla.py build_ext --inplace > "$out/flashmla_build.log" 2>&1
 echo "rc $?" >> "$out/flashmla_build.log") &
build=$!
group fp8_ds_mla tests/test_gluon_fp8_gpu.py -k ds_mla &
group fp8_e4m3 tests/test_gluon_fp8_gpu.py -k "not ds_mla" &
group triton tests/test_triton_gpu.py &
group gluon tests/test_gluon_gpu.py &
group rest tests/test_combine_gpu.py tests/test_cuda_graph_gpu.py tests/test_dcp_gpu.py tests/test_many_tokens_gpu.py &
wait "$build"
tail -n 1 "$out/flashmla_build.log"
group v32_flashmla tests/test_fp8_ds_mla_gpu.py &
wait
for log in "$out"/gpu_*.log; do
  echo "== $(basename "$log"): $(tail -n 2 "$log" | tr '\n' ' ')"
done
