"""The few-heads fp8 kernel (mla_sink/kernels/gluon/gluon_fp8.py) fits its register and shared-memory budgets:
compiled ahead of time for sm90 (no GPU needed) with the constexprs its launcher gives a call, unsplit and
split (at 32 heads the column-split consumers), at 16 and 32 heads, for per-tensor e4m3 caches and V3.2 rows
(flat and paged), ptxas must report no spill beyond ``SPILL_BYTES`` (the rows of tables/gluon_fp8.yaml give each
partition what it needs; other register splits spilled, as the ninth session's second producer did, BENCHMARKS.md;
two producers where the rows say so, sixty-first session), no wgmma serialisation warning
(C7510-C7519), and the kernel must fit in the 227 KB of shared memory an sm90 CTA may hold.

Needs Triton 3.6 with its bundled ptxas and cuobjdump (:mod:`aot_sm90`); skipped elsewhere.
"""

from __future__ import annotations

import re

import pytest
import torch

from aot_sm90 import assemble, compile_gluon_fp8, require

triton, BIN = require()

from mla_sink.kernels.gluon import gluon_fp8 as gf  # noqa: E402

#: Shared memory one sm90 CTA may allocate (bytes): 227 KB (CUDA C Programming Guide, compute capability 9.0).
SM90_SMEM_PER_CTA = 227 * 1024


#: Spill bytes ptxas may report, per (KV dtype, head block): none (CTAs of one or two blocks at 16 and 32 heads, and
#: every long range - two producers of 32-row steps at 88 registers, the second consumer 112 - with the row sum
#: deferred or not), but for V3.2's unsplit launches with ``topk_length`` (rows ds_mla_h32 and ds_mla_h16: the
#: producers' next step in flight at 96 registers, the first consumer's half of P V in flight): at 32 heads ptxas
#: stores 8 and reloads 11 registers a block in one producer's loop and one at the kernel's entry (64 / 68 bytes;
#: none without ``topk_length``, the case the A/Bs timed; seventy-second session), at 16 heads one register stored
#: at the entry and reloaded once per outer pass, none in a block's loop (4 bytes; seventy-sixth session).
SPILL_BYTES = {("fp8_e4m3", 16): 0, ("fp8_e4m3", 32): 0, ("fp8_ds_mla", 16): 4, ("fp8_ds_mla", 32): 68}


#: KV caches of the cases: (kv_dtype, shape, Triton pointer type of the kernel's KV).
CACHES = {"e4m3": ("fp8_e4m3", (4096, 576), "*fp8e4nv"), "ds": ("fp8_ds_mla", (4096, 656), "*u8"),
          "ds_paged": ("fp8_ds_mla", (64, 64, 656), "*u8")}


def _compiled(H: int, splits: int, cache: str, tmp_path) -> tuple:
    """``(constexprs, ptxas -v report, SASS, kernel)`` of the launch ``fp8_launch_args`` gives 3 tokens of ``H``
    heads and 2048 ids in ``splits`` splits on the cache ``CACHES[cache]``, with sinks and ``topk_length``, compiled
    for sm90."""
    kv_dtype, shape, kv_ptr = CACHES[cache]
    q = torch.empty(3, H, 576, dtype=torch.bfloat16)
    kv = torch.empty(*shape, dtype=torch.uint8 if kv_dtype == "fp8_ds_mla" else torch.float8_e4m3fn)
    idx = torch.empty(3, 2048, dtype=torch.int32)
    _, scalars, constexprs, options = gf.fp8_launch_args(q, kv, idx, num_kv_splits=splits,
                                                         ids_per_split=2048 // splits, out_strides=(H * 512, 512),
                                                         kv_dtype=kv_dtype)
    constexprs.update(HAS_SINKS=True, HAS_TOPK_LEN=True)
    kernel = compile_gluon_fp8(constexprs, scalars, kv_ptr, options["num_warps"])
    log, sass = assemble(kernel, BIN, tmp_path)
    return constexprs, log, sass, kernel


@pytest.mark.parametrize("H,splits,cache", [(16, 1, "e4m3"), (16, 2, "e4m3"), (5, 16, "e4m3"), (32, 1, "e4m3"),
                                            (17, 2, "e4m3"), (32, 16, "e4m3"), (16, 1, "ds"), (16, 2, "ds_paged"),
                                            (9, 16, "ds"), (16, 32, "ds_paged"), (32, 1, "ds"), (27, 16, "ds_paged"),
                                            (32, 32, "e4m3"), (32, 2, "ds")])
def test_no_spills_and_shared_memory_fits(H, splits, cache, tmp_path):
    kv_dtype = CACHES[cache][0]
    constexprs, log, sass, kernel = _compiled(H, splits, cache, tmp_path)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and max(map(int, spills.groups())) <= SPILL_BYTES[kv_dtype, constexprs["BLOCK_H"]], log
    assert not re.search(r"C751[0-9]", log), log
    assert kernel.metadata.shared <= SM90_SMEM_PER_CTA, kernel.metadata.shared
    n = constexprs["BLOCK_H"]
    # 36 score and 32 P V steps a block: the scores and half of P V in the first consumer, the other half in the
    # second
    assert sass.count(f"HGMMA.64x{n}x16") >= 36 + 32
    if kv_dtype == "fp8_ds_mla":  # bf16 operands only
        assert re.search(rf"HGMMA\.64x{n}x16\.F32\.BF16", sass) and not re.search(r"HGMMA\.\S+\.F16", sass)


def test_v32_rows_need_bf16_q_and_unknown_caches_are_refused():
    idx = torch.empty(1, 64, dtype=torch.int32)
    with pytest.raises(ValueError,
                       match=r"kv_dtype='fp8_ds_mla' with q dtype fp16, num_heads=16: V3.2 rows .* bf16 q only"):
        gf.fp8_launch_args(torch.empty(1, 16, 576, dtype=torch.float16), torch.empty(8, 656, dtype=torch.uint8),
                           idx, num_kv_splits=1, ids_per_split=64, out_strides=(16 * 512, 512), kv_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_dtype='fp8_ds_mla' with q dtype bf16, num_heads=33: the kernel serves at "
                                         "most 32 heads"):
        gf.fp8_launch_args(torch.empty(1, 33, 576, dtype=torch.bfloat16), torch.empty(8, 656, dtype=torch.uint8),
                           idx, num_kv_splits=1, ids_per_split=64, out_strides=(33 * 512, 512), kv_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_dtype='bf16'"):
        gf.fp8_launch_args(torch.empty(1, 16, 576, dtype=torch.bfloat16), torch.empty(8, 576, dtype=torch.bfloat16),
                           idx, num_kv_splits=1, ids_per_split=64, out_strides=(16 * 512, 512), kv_dtype="bf16")


def test_more_heads_than_a_block_are_refused():
    q = torch.empty(1, 33, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_dtype=.fp8_e4m3. with q dtype bf16, num_heads=33: the kernel serves "
                                         "at most 32 heads"):
        gf.fp8_launch_args(q, torch.empty(8, 576, dtype=torch.uint8), torch.empty(1, 64, dtype=torch.int32),
                           num_kv_splits=1, ids_per_split=64, out_strides=(33 * 512, 512))


def test_a_cache_of_another_kv_dtype_is_refused():
    """A 656-byte V3.2 pool launched as an e4m3 cache (the kernel would read its bytes as codes), or the reverse,
    is refused before any launch (twenty-seventh session: a GPU test passed the V3.2 pool without its kv_dtype)."""
    q, idx = torch.empty(1, 16, 576, dtype=torch.bfloat16), torch.empty(1, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"'kv_cache' \(torch.uint8, shape \(8, 656\)\) is a 'fp8_ds_mla' cache, "
                                         r"not the kv_dtype='fp8_e4m3'"):
        gf.fp8_launch_args(q, torch.empty(8, 656, dtype=torch.uint8), idx, num_kv_splits=1, ids_per_split=64,
                           out_strides=(16 * 512, 512))
    with pytest.raises(ValueError, match=r"is a 'fp8_e4m3' cache, not the kv_dtype='fp8_ds_mla'"):
        gf.fp8_launch_args(q, torch.empty(8, 576, dtype=torch.float8_e4m3fn), idx, num_kv_splits=1,
                           ids_per_split=64, out_strides=(16 * 512, 512), kv_dtype="fp8_ds_mla")


@pytest.mark.parametrize("shape,dtype,kv_dtype,match", [
    ((8, 656), torch.float8_e4m3fn, "fp8_e4m3", r"kv_dtype='fp8_e4m3' 'kv_cache' must be \[N, 576\] \(got shape \(8, 656\)\)"),
    ((8, 512), torch.float8_e4m3fn, "fp8_e4m3", r"must be \[N, 576\] \(got shape \(8, 512\)\)"),
    ((2, 4, 576), torch.float8_e4m3fn, "fp8_e4m3", r"must be \[N, 576\] \(got shape \(2, 4, 576\)\)"),
    ((2, 2, 4, 656), torch.uint8, "fp8_ds_mla", r"must be \[N, 656\] or \[blocks, block_size, 656\]"),
])
def test_a_cache_of_another_shape_is_refused(shape, dtype, kv_dtype, match):
    """The V3.2 pool viewed as e4m3 codes, a 512-byte e4m3 row (the kernel reads 576 bytes a row), a paged e4m3
    cache (its rows would count as pages) and a 4-D V3.2 cache are refused (a second break test, twenty-seventh
    session)."""
    q, idx = torch.empty(1, 16, 576, dtype=torch.bfloat16), torch.empty(1, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        gf.fp8_launch_args(q, torch.empty(*shape, dtype=dtype), idx, num_kv_splits=1, ids_per_split=64,
                           out_strides=(16 * 512, 512), kv_dtype=kv_dtype)
