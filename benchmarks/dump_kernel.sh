#!/usr/bin/env bash
# Compile the decode kernel for H=128,T=256 (bf16) and dump its Triton IR and an opcode histogram of its SASS.
# Usage (device machine, repo root): bash benchmarks/dump_kernel.sh OUTDIR
set -euo pipefail
out=${1:?outdir}
export TRITON_CACHE_DIR=$(mktemp -d)
PYTHONPATH=. python3 benchmarks/profile_ncu.py 128 256 >/dev/null
d=$(dirname "$(ls "$TRITON_CACHE_DIR"/*/_sparse_mla_decode_kernel.cubin | head -1)")
cp "$d"/_sparse_mla_decode_kernel.ttgir "$out"/decode_h128.ttgir
cuobjdump --dump-sass "$d"/_sparse_mla_decode_kernel.cubin > "$out"/decode_h128.sass
grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z][A-Z0-9_.]+' "$out"/decode_h128.sass | awk '{print $NF}' | sed 's/\..*//' \
  | sort | uniq -c | sort -rn | head -40 > "$out"/decode_h128_opcodes.txt
grep -cE "async_copy_global_to_local|ttng.warp_group_dot|ttg.local_alloc" "$out"/decode_h128.ttgir || true
grep -oE "ttg\.async_copy_global_to_local|ttng\.warp_group_dot|ttg\.convert_layout|ttg\.local_store|ttg\.local_alloc|tt\.load" "$out"/decode_h128.ttgir | sort | uniq -c
cat "$out"/decode_h128_opcodes.txt
