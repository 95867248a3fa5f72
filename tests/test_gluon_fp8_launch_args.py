"""The few-heads fp8 kernel's launch arguments (mla_sink/kernels/gluon/gluon_fp8.fp8_launch_args), on the CPU: which
consumer arrangement, head block, producer step and register split each kind of call gets (the rows of
tables/gluon_fp8.yaml), and the seesaw's producer registers (tables/gluon_seesaw.yaml). Compiling and running them
is tests/test_gluon_fp8_ptxas.py's and tests/test_gluon_fp8_gpu.py's job."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from mla_sink.core.dtypes import DTYPE_KEYS  # noqa: E402
from mla_sink.kernels.gluon import gluon_fp8 as gf  # noqa: E402
from mla_sink.kernels.gluon import tuning  # noqa: E402

CACHES = {"fp8_e4m3": (576, torch.float8_e4m3fn), "fp8_ds_mla": (656, torch.uint8), "bf16": (576, torch.bfloat16)}


def launch(kv_dtype, H, splits, q_dtype=torch.bfloat16, grid=False):
    """The constexprs of a two-token launch (``grid``: and its grid) over 2048 ids in ``splits`` splits."""
    width, dtype = CACHES[kv_dtype]
    q = torch.empty(2, H, 576, dtype=q_dtype)
    kv = torch.empty(4096, width, dtype=dtype)
    idx = torch.empty(2, 2048, dtype=torch.int32)
    g, _, constexprs, _ = gf.fp8_launch_args(q, kv, idx, num_kv_splits=splits, ids_per_split=2048 // splits,
                                             out_strides=(H * 512, 512), kv_dtype=kv_dtype)
    return (constexprs, g) if grid else constexprs


@pytest.mark.parametrize("kv_dtype,H,splits,block_h,defer", [
    ("fp8_e4m3", 16, 1, 16, True),  # 16-head long ranges: two producers of 32-row steps (seventy-sixth session)
    ("fp8_e4m3", 5, 2, 16, True),  # split launches too, the row sum deferred
    ("fp8_e4m3", 5, 16, 16, False),  # two blocks a CTA: the row sum once a block, one producer of whole blocks
    ("fp8_e4m3", 32, 1, 32, True),  # e4m3's unsplit 32-head blocks: two producers (seventy-fourth session)
    ("fp8_e4m3", 17, 2, 32, True),
    ("fp8_e4m3", 32, 16, 16, False),  # two blocks a CTA: two 16-head CTAs a token
    ("fp8_ds_mla", 16, 1, 16, True), ("fp8_ds_mla", 9, 2, 16, True),
    ("fp8_ds_mla", 9, 32, 16, False),  # one block a CTA
    ("fp8_ds_mla", 32, 1, 32, True), ("fp8_ds_mla", 27, 32, 16, False),
])
def test_consumer_arrangement_per_call(kv_dtype, H, splits, block_h, defer):
    c, grid = launch(kv_dtype, H, splits, grid=True)
    assert (c["BLOCK_H"], c["SPLIT"], c["DEFER_ROW_SUM"]) == (block_h, splits > 1, defer)
    assert "COLS" not in c  # one arrangement of the consumers: the column split
    assert grid == (-(-H // block_h), splits, 2)  # head groups x splits x tokens
    # the producers workers with whole-line steps everywhere: whole blocks with one producer (CTAs of one or two
    # blocks); two (one a ring stage) of half blocks on every long range (88 registers each, 96 ahead)
    two = block_h == 32 or splits <= 2
    assert (c["PRODUCER_ROWS"], c["LINES"]) == (gf.BLOCK_N // 2 if two else gf.BLOCK_N, True)
    assert c["PRODUCERS"] == (2 if two else 1)
    assert "PRODUCER_DEFAULT" not in c  # the first consumer is the default partition


def _arrangement_of(c: dict) -> tuple:
    return (c["BLOCK_H"], c["CONSUMER_REGS"], c["PRODUCER_REGS"], c["PRODUCER_ROWS"], c["LINES"],
            c["DEFER_ROW_SUM"], c["SCORES_ONLY"], c["EARLY_IDS"], c["STAGED_IDS"], c["WARP_MAX"], c["ROPE_BY_SECOND"],
            c["META_BY_SECOND"], c["L2_PREFETCH"], c["PRODUCERS"], c["PRODUCER_AHEAD"], c["PV_OVERLAP"])


@pytest.mark.parametrize("kv_dtype", tuning.fp8_kv_dtypes())
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_launch_args_follow_the_table_for_every_combination(kv_dtype, q_dtype):
    """For every head count up to the largest head block and past it, split or not (one to 32 blocks a CTA), and both
    half q dtypes, the launch's arrangement constexprs are the params of the row tables/gluon_fp8.yaml selects
    (refusals refused)."""
    key = DTYPE_KEYS[q_dtype]
    for H in range(0, 35):
        for splits in (1, 2, 16, 32):
            blocks = tuning.cta_blocks(2048 // splits, 2048)
            sel = tuning.fp8_selection(kv_dtype, key, H, splits > 1, blocks)
            if sel.refused:
                with pytest.raises(ValueError, match=f"row {sel.row.id} of tables/gluon_fp8.yaml"):
                    launch(kv_dtype, H, splits, q_dtype)
                continue
            arr = tuning.fp8_arrangement(kv_dtype, key, H, splits > 1, blocks)
            p = sel.params
            assert sel.path == tuning.COLUMN_SPLIT
            assert _arrangement_of(launch(kv_dtype, H, splits, q_dtype)) == (
                p["head_block"], p["consumer_regs"], p["producer_regs"],
                p["producer_rows"], p["lines"], p["deferred_row_sum"],
                p["scores_only"], p["early_ids"], p["staged_ids"], p["warp_max"], p["rope_by_second"],
                p["meta_by_second"], p["l2_prefetch"], p["producers"], p["producer_ahead"], p["pv_overlap"]) == (
                arr.head_block, arr.consumer_regs, arr.producer_regs, arr.producer_rows,
                arr.lines, arr.deferred_row_sum, arr.scores_only, arr.early_ids, arr.staged_ids, arr.warp_max,
                arr.rope_by_second, arr.meta_by_second, arr.l2_prefetch, arr.producers, arr.producer_ahead,
                arr.pv_overlap), (
                kv_dtype, q_dtype, H, splits)
            assert gf.BLOCK_N % p["producer_rows"] == 0  # whole blocks, or an even part of one a step
            assert tuning.BLOCK_IDS == gf.BLOCK_N  # the table's load check divides the kernel's block


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_ds_mla"])
def test_more_than_32_heads_are_refused(kv_dtype):
    with pytest.raises(ValueError, match=f"kv_dtype='{kv_dtype}' with q dtype bf16, num_heads=33: the kernel serves "
                                         "at most 32 heads"):
        launch(kv_dtype, 33, 1)


def test_other_caches_and_q_dtypes_are_refused():
    with pytest.raises(ValueError, match="reads kv_dtype 'fp8_e4m3' or 'fp8_ds_mla', got kv_dtype='bf16'"):
        launch("bf16", 16, 1)
    with pytest.raises(ValueError, match="row ds_mla_q_not_bf16"):
        launch("fp8_ds_mla", 16, 1, torch.float16)
    with pytest.raises(ValueError, match=r"the gluon_fp8 kernel: q dtype must be one of .* \(got torch.float32\)"):
        launch("fp8_e4m3", 16, 1, torch.float32)


def test_the_seesaw_producer_registers_follow_the_table():
    from mla_sink.kernels.gluon import gluon_seesaw as gs

    for kv_dtype in tuning.gluon_seesaw_table().fields["kv_dtype"].domain:
        width = 656 if kv_dtype == "fp8_ds_mla" else 576
        _, _, constexprs, _ = gs.seesaw_launch_args(
            torch.empty(2, 64, 576, dtype=torch.bfloat16), torch.empty(4096, width, dtype=torch.uint8),
            torch.empty(2, 2048, dtype=torch.int32), num_kv_splits=1, ids_per_split=2048,
            out_strides=(64 * 512, 512), kv_dtype=kv_dtype)
        assert constexprs["PRODUCER_REGS"] == tuning.seesaw_producer_regs(kv_dtype)
        assert constexprs["CONSUMER_REGS"] == tuning.seesaw_consumer_regs(kv_dtype)


@pytest.mark.parametrize("shape,pad,block", [((4096, 656), 0, 1), ((64, 64, 656), 1, 64), ((30, 16, 656), 3, 16),
                                             ((64, 64, 656), 0, 1), ((1, 64, 656), 1, 1)],
                         ids=["flat", "padded_64", "padded_16", "gapless_pages", "one_block"])
def test_the_page_size_is_a_constexpr(shape, pad, block):
    """A paged V3.2 cache's page size reaches both kernels as a constexpr (its page arithmetic a shift and a mask,
    not an integer division per row), 1 for a flat cache and for pages that follow each other without a gap (the
    flat pool they are, at its row stride); no runtime scalar carries it."""
    from mla_sink.kernels.gluon import gluon_seesaw as gs

    idx = torch.empty(2, 2048, dtype=torch.int32)
    if len(shape) == 3:  # blocks of shape[1] rows, `pad` unused rows after each
        kv = torch.empty(shape[0], shape[1] + pad, shape[2], dtype=torch.uint8)[:, :shape[1]]
    else:
        kv = torch.empty(*shape, dtype=torch.uint8)
    stride = kv.stride(0) if block > 1 or kv.dim() == 2 else 656
    for H, fn in ((16, gf.fp8_launch_args), (64, gs.seesaw_launch_args)):
        _, scalars, constexprs, _ = fn(torch.empty(2, H, 576, dtype=torch.bfloat16), kv, idx, num_kv_splits=1,
                                       ids_per_split=2048, out_strides=(H * 512, 512), kv_dtype="fp8_ds_mla")
        assert scalars["stride_kv"] == stride, (scalars["stride_kv"], stride)
        assert constexprs["kv_block_size"] == block and "kv_block_size" not in scalars


@pytest.mark.parametrize("splits", [1, 2, 16])
def test_the_seesaw_lets_what_follows_a_split_launch_start_early(splits):
    """A split seesaw launch lets the grid after it launch early (``LAUNCH_DEPENDENTS``): the combine, or for V3.2 rows
    the gated exact recompute, which the library launches as a programmatic dependent; an unsplit launch does not
    (a dependent measured slower there: BENCHMARKS.md, twenty-second session). Only the recompute is gated."""
    from mla_sink.kernels.gluon import gluon_seesaw as gs

    for kv_dtype, exact in (("bf16", False), ("fp8_e4m3", False), ("fp8_ds_mla", False), ("fp8_ds_mla", True)):
        width, dtype = CACHES[kv_dtype]
        _, _, constexprs, _ = gs.seesaw_launch_args(
            torch.empty(2, 64, 576, dtype=torch.bfloat16), torch.empty(4096, width, dtype=dtype),
            torch.empty(2, 2048, dtype=torch.int32), num_kv_splits=splits, ids_per_split=2048 // splits,
            out_strides=(64 * 512, 512), kv_dtype=kv_dtype, exact=exact, gated=exact)
        assert constexprs["LAUNCH_DEPENDENTS"] is (splits > 1), (kv_dtype, exact)
        assert constexprs["GATED"] is exact
