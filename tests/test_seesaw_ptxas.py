"""The seesaw kernel's wgmmas stay pipelined: compiled ahead of time for sm90 (no GPU needed), ptxas must
not report C7514 / C7515 ("wgmma.mma_async instructions are serialized due to non wgmma instructions
defining / reading accumulator registers ..."), and the SASS must not wait after every HGMMA. Until the
sixth session every wgmma of the kernel was serialised this way, for every KV format (BENCHMARKS.md,
2026-12-01 sixth session: 358 vs 314 us at H=128, T=256).

Needs the Triton release the kernel is written for (its Gluon API: Triton 3.6, as on the H200 image) with
its bundled ptxas and cuobjdump; skipped elsewhere (CI installs a newer Triton whose Gluon API differs).
Runs on the device, or here with Triton 3.6 on the path.
"""

from __future__ import annotations

import re

import pytest
import torch

from aot_sm90 import assemble, compile_sm90, require

triton, BIN = require()

from mla_sink.core import kv_layout  # noqa: E402
from mla_sink.kernels.gluon import gluon_seesaw as gs  # noqa: E402

#: Pointer element types of the kernel's tensor arguments per KV format (Triton signature strings).
KV_PTR = {"bf16": "*bf16", "fp8_e4m3": "*u8", "fp8_ds_mla": "*u8"}


def _compile(kv_dtype: str, splits: int, exact: bool = False):
    """AOT-compile the kernel for sm90 with the constexprs the launcher gives a 64-head, 2048-id call (``exact``:
    the gated exact reading of V3.2 rows, the recompute of the flagged programs)."""
    q = torch.empty(2, 64, 576, dtype=torch.bfloat16)
    # the cache as the launcher passes it: bf16 rows, or bytes (an fp8 cache is viewed as uint8)
    kv = torch.empty(4096, kv_layout.ROW_BYTES if kv_dtype == "fp8_ds_mla" else 576,
                     dtype=torch.bfloat16 if kv_dtype == "bf16" else torch.uint8)
    idx = torch.empty(2, 2048, dtype=torch.int32)
    _, scalars, constexprs, options = gs.seesaw_launch_args(q, kv, idx, num_kv_splits=splits,
                                                            ids_per_split=2048 // splits, out_strides=(64 * 512, 512),
                                                            kv_dtype=kv_dtype, exact=exact, gated=exact)
    constexprs.update(HAS_SINKS=True, HAS_TOPK_LEN=False)
    ptrs = {"Q": "*bf16", "KV": KV_PTR[kv_dtype], "IDX": "*i32", "SINKS": "*fp32", "TOPK_LEN": "*i32",
            "OUT": "*bf16", "LSE": "*fp32", "PART_OUT": "*fp32", "PART_LSE": "*fp32", "KV_SCALE": "*fp32",
            "REDO": "*i32"}
    return compile_sm90(gs.sparse_mla_decode_seesaw_kernel, constexprs, scalars, ptrs, options["num_warps"])


@pytest.mark.parametrize("kv_dtype,splits,exact", [("bf16", 1, False), ("bf16", 4, False), ("fp8_e4m3", 1, False),
                                                  ("fp8_ds_mla", 1, False), ("fp8_ds_mla", 1, True),
                                                  ("fp8_ds_mla", 4, True)])
def test_wgmmas_are_not_serialised(kv_dtype, splits, exact, tmp_path):
    log, sass = assemble(_compile(kv_dtype, splits, exact), BIN, tmp_path)
    assert not re.search(r"C751[0-9]", log), log  # C7510-C7519: the wgmma serialisation warnings
    hgmma = sass.count("HGMMA")
    waits = len(re.findall(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0", sass))
    assert hgmma >= 80, hgmma  # 36 score steps and 8 P V steps per consumer
    # the exact reading of V3.2 rows waits once per tile of the scores (Horner's rule over the four tile scales,
    # then the RoPE): five waits per block and consumer where the others have one
    allowed = 16 if exact else 8
    assert waits <= allowed, f"{waits} waits for {hgmma} HGMMAs: the wgmmas are serialised"
