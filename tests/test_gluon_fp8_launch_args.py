"""The few-heads fp8 kernel's launch arguments (mla_sink/kernels/gluon/gluon_fp8.fp8_launch_args), on the CPU: which
consumer arrangement, head block, producer step and register split each kind of call gets. Compiling and running
them is tests/test_gluon_fp8_ptxas.py's and tests/test_gluon_fp8_gpu.py's job."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from mla_sink.kernels.gluon import gluon_fp8 as gf  # noqa: E402

CACHES = {"fp8_e4m3": (576, torch.float8_e4m3fn), "fp8_ds_mla": (656, torch.uint8)}


def launch(kv_dtype, H, splits):
    width, dtype = CACHES[kv_dtype]
    q = torch.empty(2, H, 576, dtype=torch.bfloat16)
    kv = torch.empty(4096, width, dtype=dtype)
    idx = torch.empty(2, 2048, dtype=torch.int32)
    _, _, constexprs, _ = gf.fp8_launch_args(q, kv, idx, num_kv_splits=splits, ids_per_split=2048 // splits,
                                             out_strides=(H * 512, 512), kv_dtype=kv_dtype)
    return constexprs


@pytest.mark.parametrize("kv_dtype,H,splits,block_h,cols", [
    ("fp8_e4m3", 16, 1, 16, False), ("fp8_e4m3", 5, 16, 16, False),  # 16-head blocks: alternate blocks
    ("fp8_e4m3", 32, 1, 32, False), ("fp8_e4m3", 17, 2, 32, True), ("fp8_e4m3", 32, 16, 32, True),
    ("fp8_ds_mla", 16, 1, 16, False), ("fp8_ds_mla", 9, 2, 16, False),
    ("fp8_ds_mla", 32, 1, 32, True), ("fp8_ds_mla", 27, 32, 32, True),  # V3.2 32-head blocks: always split columns
])
def test_consumer_arrangement_per_call(kv_dtype, H, splits, block_h, cols):
    c = launch(kv_dtype, H, splits)
    assert (c["BLOCK_H"], c["COLS"], c["SPLIT"]) == (block_h, cols, splits > 1)
    if cols:  # the producer a worker with 16 heads' whole-block, whole-line steps
        assert (c["CONSUMER_REGS"], c["PRODUCER_REGS"]) == gf.COL_SPLIT_REGS[block_h]
        assert (c["PRODUCER_ROWS"], c["LINES"], c["PRODUCER_DEFAULT"]) == (gf.BLOCK_N, True, False)
    else:
        regs = (gf.DS_WORKER_REGS if kv_dtype == "fp8_ds_mla" else gf.WORKER_REGS)[block_h]
        assert (c["CONSUMER_REGS"], c["PRODUCER_REGS"]) == regs
        assert c["PRODUCER_ROWS"] == gf.PRODUCER_ROWS[block_h]
        assert c["PRODUCER_DEFAULT"] == (block_h in gf.PRODUCER_DEFAULT)  # e4m3 32-head blocks: the producer


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_ds_mla"])
def test_more_than_32_heads_are_refused(kv_dtype):
    with pytest.raises(ValueError, match=f"at most 32 heads with kv_dtype='{kv_dtype}', got num_heads=33"):
        launch(kv_dtype, 33, 1)


@pytest.mark.parametrize("shape,block", [((4096, 656), 1), ((64, 64, 656), 64), ((30, 16, 656), 16)])
def test_the_page_size_is_a_constexpr(shape, block):
    """A paged V3.2 cache's page size reaches both kernels as a constexpr (its page arithmetic a shift and a mask,
    not an integer division per row), 1 for a flat cache; no runtime scalar carries it."""
    from mla_sink.kernels.gluon import gluon_seesaw as gs

    idx = torch.empty(2, 2048, dtype=torch.int32)
    kv = torch.empty(*shape, dtype=torch.uint8)
    for H, fn in ((16, gf.fp8_launch_args), (64, gs.seesaw_launch_args)):
        _, scalars, constexprs, _ = fn(torch.empty(2, H, 576, dtype=torch.bfloat16), kv, idx, num_kv_splits=1,
                                       ids_per_split=2048, out_strides=(H * 512, 512), kv_dtype="fp8_ds_mla")
        assert constexprs["kv_block_size"] == block and "kv_block_size" not in scalars
