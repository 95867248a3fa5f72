"""The sm90 Gluon kernel for fp8 KV at few heads (mla_sink/kernels/gluon/gluon_fp8.py): e4m3fn and the 656-byte
V3.2 rows at H <= 32 (32-head blocks: the column-split consumers for V3.2 and e4m3's split launches), split or
not, against the float64 reference (which sees the same fp8 values and scales, so quantisation is not an
error).

Budget of tests/test_triton_gpu.py (bf16 q: ``1e-3 or 2/128``, cosine < 1e-5; LSE ``1e-5 or 1e-5``) at
topk 2048; with fewer ids the few-id bf16 budget of tests/test_gluon_gpu.py. Adversarial inputs: ids
``-1`` (a leading run and scattered), ``N``, ``2^31 - 1``, negative, rows with no valid id,
``topk_length``, topk not a multiple of 64, sinks ``±inf / 0 / 20 / 100``, fp8 NaN codes in KV rows
nobody references, odd head counts below 16 and 32, split-KV launches (with splits that get no ids), fp16 q, a
pool beyond 2^31 bytes, CUDA-graph replay with new ids and sinks through the public launcher (unsplit and
in two splits). V3.2 rows: both scale conventions (powers of two and vLLM's ``amax / 448``) and scales
written byte by byte (tiny, zero, not powers of two), NaN bytes (codes and scales) in rows nobody
references, a paged pool with FlashMLA's padded 65-row blocks, ``sm_scale = 576 ** -0.55``; their budget is
the bf16 one (``P`` scaled per tile is rounded to bf16). Needs an sm90 GPU.
"""

from __future__ import annotations

import pytest
import torch

import mla_sink
from mla_sink import quantize_kv_cache
from mla_sink.core.platform import gluon_available
from mla_sink.paths.triton.launch import sparse_mla_decode_triton
from mla_sink.paths.triton.plan import plan_triton_launch
from mla_sink.core.reference import sparse_mla_decode_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                       reason="needs an sm90 GPU"),
]

from test_gluon_gpu import adversarial_ids, adversarial_sinks  # noqa: E402  (also registers the few-id budget)
from test_triton_gpu import check_budget  # noqa: E402

D_QK, D_V = 576, 512


def fp8_kernel():
    from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_gluon

    return sparse_mla_decode_fp8_gluon


@pytest.mark.parametrize("splits", [1, 3, 16], ids=["unsplit", "s3", "s16"])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16q", "fp16q"])
@pytest.mark.parametrize("H,T,topk", [(16, 3, 2048), (16, 2, 1000), (5, 2, 37), (1, 1, 64), (12, 4, 130),
                                      (16, 2, 0), (7, 2, 2048), (32, 3, 2048), (17, 2, 1000), (27, 2, 130)])
def test_adversarial(H, T, topk, q_dtype, splits):
    g = torch.Generator(device="cuda").manual_seed(H * 31 + T * 7 + topk)
    N = 4099
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.7).to(torch.float8_e4m3fn)
    kv.view(torch.uint8)[3] = 0x7F  # NaN codes
    kv_scale = torch.tensor([0.8], device="cuda")
    q = (torch.randn(T, H, D_QK, device="cuda", generator=g) * 3).to(q_dtype)
    idx = adversarial_ids(T, topk, N, g)
    sinks = adversarial_sinks(H, g)
    key = "fp8_e4m3" if topk >= 2048 else "bf16_few_ids"
    for s in (sinks, None):
        o, l = fp8_kernel()(q, kv, idx, s, kv_scale=kv_scale, num_kv_splits=splits)
        ro, rl = sparse_mla_decode_reference(q, kv, idx, s, kv_scale=kv_scale)
        assert not torch.isnan(o).any() and not torch.isnan(l).any()
        check_budget(o, l, ro, rl, key)


@pytest.mark.parametrize("H,splits", [(16, 1), (16, 4), (9, 2), (32, 1), (32, 4)])
def test_empty_rows_topk_length_and_strided_q(H, splits):
    g = torch.Generator(device="cuda").manual_seed(5)
    N = 5000
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.7).to(torch.float8_e4m3fn)
    base = torch.randn(4, 2 * H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    q = base[:, ::2]  # non-contiguous heads
    idx = adversarial_ids(4, 2048, N, g)
    idx[1] = -1
    topk_length = torch.tensor([2048, 5, 0, 1029], device="cuda", dtype=torch.int32)
    sinks = torch.randn(H, device="cuda", generator=g)
    o, l = fp8_kernel()(q, kv, idx, sinks, topk_length=topk_length, num_kv_splits=splits)
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, topk_length=topk_length)
    assert (o[1] == 0).all() and torch.isneginf(l[1]).all() and (o[2] == 0).all()
    check_budget(o, l, ro, rl, "fp8_e4m3")


@pytest.mark.parametrize("H,T", [(16, 256), (16, 64), (32, 256), (32, 64), (32, 2), (32, 3)])
def test_routed_big_pool_and_cuda_graph(H, T):
    """H=16 and 32 through the public launcher (routed here: unsplit at T=256, two splits and the combine at T=64;
    at 32 heads split launches take the column-split consumers, T=2 in more splits), ids in a pool beyond 2^31
    bytes, then CUDA-graph replays with new ids and sinks."""
    g = torch.Generator(device="cuda").manual_seed(9)
    rows = ((1 << 31) + (64 << 20)) // D_QK + 1
    kv = (torch.randn(rows, D_QK, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
    kv_scale = torch.tensor([1.1], device="cuda")
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(rows - (1 << 20), rows, (T, 2048), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(H, device="cuda", generator=g) + 8.0
    plan = plan_triton_launch(arch="sm90", q_dtype="bf16", kv_dtype="fp8_e4m3", num_heads=H, num_tokens=T, topk=2048,
                              logit_cap=0.0, gluon=gluon_available(),
                              num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.kernel == ("gluon_fp8" if gluon_available() else "portable")
    # T=256 fills any GPU unsplit; T=64 splits in two on the H200's 132 SMs (a GPU with fewer may not split); T=2
    # in more (32 heads only: at 16 the padded seesaw takes them)
    assert plan.num_kv_splits == 1 if T == 256 else plan.num_kv_splits <= 2 if T == 64 else plan.num_kv_splits > 2
    out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(T, H, device="cuda")
    sparse_mla_decode_triton(q, kv, idx, sinks, kv_scale=kv_scale, out=out, lse=lse)
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, kv_scale=kv_scale)
    check_budget(out, lse, ro, rl, "fp8_e4m3")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_decode_triton(q, kv, idx, sinks, kv_scale=kv_scale, out=out, lse=lse)
    for seed in range(2):
        gg = torch.Generator(device="cuda").manual_seed(100 + seed)
        idx.copy_(torch.randint(-1, rows, idx.shape, device="cuda", dtype=torch.int32, generator=gg))
        sinks.copy_(torch.randn(H, device="cuda", generator=gg))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, kv_scale=kv_scale)
        check_budget(out, lse, ro, rl, "fp8_e4m3")


def test_strided_indices_take_the_portable_kernel():
    """Indices whose rows are not unit-stride (a view of every other column) are valid input; the routed
    gluon_fp8 call reads rows as unit-stride, so the runner sends them to the portable kernel, and the
    result matches the reference."""
    g = torch.Generator(device="cuda").manual_seed(21)
    N, T, H = 6000, 64, 16
    kv = (torch.randn(N, D_QK, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
    kv_scale = torch.tensor([0.9], device="cuda")
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = adversarial_ids(T, 4096, N, g)[:, ::2]  # [T, 2048], column stride 2
    sinks = torch.randn(H, device="cuda", generator=g)
    o, l = sparse_mla_decode_triton(q, kv, idx, sinks, kv_scale=kv_scale)
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks, kv_scale=kv_scale)
    check_budget(o, l, ro, rl, "fp8_e4m3")


DS_ROW = 656
DS_SM_SCALE = 576 ** -0.55


def check_budget_by_length(o, l, ro, rl, topk_length):
    """:func:`check_budget` per token by its ``topk_length``: the issue's bf16 budget where a token attends to all
    2048 ids, the few-id budget (``test_gluon_gpu``: a handful of ``P`` values, each rounded to bf16, dominate the
    row) where it attends to fewer, as :func:`test_ds_mla_adversarial` picks it by ``topk``."""
    full = topk_length.long() >= 2048
    for rows, key in ((full, "bf16"), (~full, "bf16_few_ids")):
        if rows.any():
            check_budget(o[rows], l[rows], ro[rows], rl[rows], key)


def ds_pool(N, g, scale):
    """``[N, 656]`` V3.2 rows of random KV (``quantize_kv_cache``, ``scale`` convention); row 3 all 0xFF
    (NaN codes and NaN scales), never referenced by :func:`adversarial_ids`."""
    cache = quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g) * 0.7, scale=scale)
    cache[3] = 0xFF
    return cache


def set_scales(cache, rows, values):
    """Write float32 tile scales byte by byte: ``values`` (4 floats) into the scale bytes of ``rows``."""
    b = torch.tensor(values, dtype=torch.float32).view(torch.uint8).to("cuda")
    cache[rows, 512:528] = b


@pytest.mark.parametrize("splits", [1, 3, 16], ids=["unsplit", "s3", "s16"])
@pytest.mark.parametrize("scale", ["pow2", "amax"])
@pytest.mark.parametrize("H,T,topk", [(16, 3, 2048), (16, 2, 1000), (5, 2, 37), (1, 1, 64), (12, 4, 130),
                                      (16, 2, 0), (9, 2, 2048), (32, 3, 2048), (17, 2, 1000), (27, 2, 130)])
def test_ds_mla_adversarial(H, T, topk, scale, splits):
    g = torch.Generator(device="cuda").manual_seed(H * 37 + T * 5 + topk)
    N = 4099
    cache = ds_pool(N, g, scale)
    # scales written byte by byte on referenced rows: tiny (its P * scale far below fp16's range), zero, and
    # two that are not powers of two near the rows' own (about 0.006)
    set_scales(cache, torch.arange(10, 4000, 97, device="cuda"), [3.1e-30, 0.0, 1.0 / 300.0, 7.5e-3])
    q = (torch.randn(T, H, D_QK, device="cuda", generator=g) * 3).to(torch.bfloat16)
    idx = adversarial_ids(T, topk, N, g)
    sinks = adversarial_sinks(H, g)
    key = "bf16" if topk >= 2048 else "bf16_few_ids"
    for s in (sinks, None):
        o, l = fp8_kernel()(q, cache, idx, s, DS_SM_SCALE, num_kv_splits=splits, kv_dtype="fp8_ds_mla")
        ro, rl = sparse_mla_decode_reference(q, cache, idx, s, DS_SM_SCALE)
        assert not torch.isnan(o).any() and not torch.isnan(l).any()
        check_budget(o, l, ro, rl, key)


@pytest.mark.parametrize("H", [16, 11, 32, 19])
@pytest.mark.parametrize("splits", [1, 2])
def test_ds_mla_paged_padded_blocks_topk_length_and_empty_rows(splits, H):
    """FlashMLA's test layout: blocks of 65 rows of which 64 are used (block stride 65 * 656 bytes), the 65th
    NaN; the same bytes flat give the same result."""
    g = torch.Generator(device="cuda").manual_seed(17)
    blocks, block_size, T = 512, 64, 4
    storage = torch.full((blocks, block_size + 1, DS_ROW), 0xFF, dtype=torch.uint8, device="cuda")
    paged = storage[:, :block_size]
    n = blocks * block_size
    paged.copy_(quantize_kv_cache(torch.randn(n, D_QK, device="cuda", generator=g), scale="amax")
                .view(blocks, block_size, DS_ROW))
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = adversarial_ids(T, 2048, n, g)
    idx[:, 7::131] = n  # the first pad row's id if the pool were read as flat 65-row blocks
    idx[1] = -1
    topk_length = torch.tensor([2048, 5, 0, 1029], device="cuda", dtype=torch.int32)
    sinks = adversarial_sinks(H, g)
    o, l = fp8_kernel()(q, paged, idx, sinks, DS_SM_SCALE, topk_length=topk_length, num_kv_splits=splits,
                        kv_dtype="fp8_ds_mla")
    ro, rl = sparse_mla_decode_reference(q, paged, idx, sinks, DS_SM_SCALE, topk_length=topk_length)
    assert (o[1] == 0).all() and torch.isneginf(l[1]).all() and (o[2] == 0).all()
    check_budget_by_length(o, l, ro, rl, topk_length)
    fo, fl = fp8_kernel()(q, paged.reshape(n, DS_ROW).contiguous(), idx, sinks, DS_SM_SCALE,
                          topk_length=topk_length, num_kv_splits=splits, kv_dtype="fp8_ds_mla")
    torch.testing.assert_close(fo, o, rtol=0, atol=0)
    torch.testing.assert_close(fl, l, rtol=0, atol=0)


def empty_range_inputs(H):
    """The inputs of :func:`test_ds_mla_more_tokens_than_sms_with_empty_ranges` (also
    ``benchmarks/ds_mla_few_ids_diag.py``'s): ``(cache [4099, 656], q [300, H, 576] bf16, indices [300, 2048],
    sinks [H], topk_length [300])``, ``topk_length`` 0 on every eighth token."""
    g = torch.Generator(device="cuda").manual_seed(300 + H)
    N, T, topk = 4099, 300, 2048
    cache = ds_pool(N, g, "amax")
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = adversarial_ids(T, topk, N, g)
    lengths = torch.tensor([2048, 1, 63, 64, 65, 150, 2048, 1000], dtype=torch.int32).repeat(T // 8 + 1)[:T]
    lengths[::8] = 0
    return cache, q, idx, adversarial_sinks(H, g), lengths.to("cuda")


@pytest.mark.parametrize("H", [32, 19])
def test_ds_mla_more_tokens_than_sms_with_empty_ranges(H):
    """More tokens than an H100 / H200 has SMs (300), unsplit, at 17-32 heads (the column split), with
    ``topk_length`` 0 on every eighth token and 1, 63, 64, 65, 150 (three blocks), 1000 and 2048 on others: a CTA
    that takes several tokens in turn (the ``token_loop`` experiment) meets empty ranges between full ones, and every
    CTA of main meets them one token at a time (the fifty-second session's ``meta_by_second`` hang waited for a block
    an empty range does not have)."""
    cache, q, idx, sinks, topk_length = empty_range_inputs(H)
    o, l = fp8_kernel()(q, cache, idx, sinks, DS_SM_SCALE, topk_length=topk_length, kv_dtype="fp8_ds_mla")
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, DS_SM_SCALE, topk_length=topk_length)
    assert (o[::8] == 0).all() and torch.isneginf(l[::8]).all()
    check_budget_by_length(o, l, ro, rl, topk_length)


@pytest.mark.parametrize("scale", ["pow2", "amax"])
@pytest.mark.parametrize("H,T", [(16, 256), (16, 64), (32, 256), (32, 64), (32, 2)])
def test_ds_mla_routed_big_pool_and_cuda_graph(H, T, scale):
    """V3.2 rows at H=16 and 32 through the public launcher (routed to gluon_fp8: unsplit at T=256, two splits at
    T=64; 32 heads on the column-split consumers, at T=2 in 16 two-block splits), ids in a pool beyond 2^31
    bytes, then CUDA-graph replays with new ids and sinks."""
    g = torch.Generator(device="cuda").manual_seed(19)
    rows = ((1 << 31) + (64 << 20)) // DS_ROW + 1
    cache = torch.full((rows, DS_ROW), 0xFF, dtype=torch.uint8, device="cuda")
    high = rows - (1 << 20)
    cache[high:] = quantize_kv_cache(torch.randn(1 << 20, D_QK, device="cuda", generator=g), scale=scale)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(high, rows, (T, 2048), device="cuda", dtype=torch.int32, generator=g)
    sinks = torch.randn(H, device="cuda", generator=g) + 8.0
    plan = plan_triton_launch(arch="sm90", q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=H, num_tokens=T,
                              topk=2048, logit_cap=0.0, gluon=gluon_available(),
                              num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert plan.kernel == ("gluon_fp8" if gluon_available() else "portable"), plan
    if gluon_available():
        assert plan.kernel_row == ("sm90_ds_mla_gluon" if H <= 16 else "sm90_ds_mla_gluon_h32"), plan
    # T=256 fills the H200 unsplit, T=64 splits in two on its 132 SMs, T=2 at 16 heads in one 64-id block a split,
    # at 32 in 16 two-block splits of two 16-head CTAs each (thirty-first session)
    assert plan.num_kv_splits == 1 if T == 256 else plan.num_kv_splits <= 2 if T == 64 else (
        plan.num_kv_splits == (32 if H <= 16 else 16))
    out = torch.empty(T, H, D_V, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(T, H, device="cuda")
    sparse_mla_decode_triton(q, cache, idx, sinks, DS_SM_SCALE, out=out, lse=lse)
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, DS_SM_SCALE)
    check_budget(out, lse, ro, rl, "bf16")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_decode_triton(q, cache, idx, sinks, DS_SM_SCALE, out=out, lse=lse)
    for seed in range(2):
        gg = torch.Generator(device="cuda").manual_seed(200 + seed)
        new = torch.randint(high, rows, idx.shape, device="cuda", dtype=torch.int32, generator=gg)
        new[:, ::9] = -1
        idx.copy_(new)
        sinks.copy_(torch.randn(H, device="cuda", generator=gg))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, DS_SM_SCALE)
        check_budget(out, lse, ro, rl, "bf16")


@pytest.mark.parametrize("H", [16, 32])
def test_ds_mla_pool_at_4_byte_alignment_and_660_byte_rows(H):
    """V3.2 rows whose pool starts 4 bytes past a 16-byte boundary, with a 660-byte row stride (both allowed:
    multiples of 4), through the routed gluon_fp8 call: the kernel is compiled for that alignment (the producer
    gathers the RoPE) and matches the reference."""
    g = torch.Generator(device="cuda").manual_seed(23)
    N, T = 5000, 8
    storage = torch.full((N * 660 + 16,), 0xFF, dtype=torch.uint8, device="cuda")
    pool = storage[4:4 + N * 660].view(N, 660)[:, :DS_ROW]
    pool.copy_(quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g), scale="amax"))
    assert pool.data_ptr() % 16 == 4 and pool.stride() == (660, 1)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = adversarial_ids(T, 2048, N, g)
    sinks = adversarial_sinks(H, g)
    o, l = sparse_mla_decode_triton(q, pool, idx, sinks, DS_SM_SCALE)
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, DS_SM_SCALE)
    check_budget(o, l, ro, rl, "bf16")


@pytest.mark.parametrize("H", [16, 32])
def test_ds_mla_runner_reused_for_a_pool_4_bytes_off_a_boundary(H):
    """The same call metadata (shapes, strides) first on a 16-byte aligned pool, then on one 4 bytes past a
    boundary: the prepared runner must not take its hinted 16-byte loads there (gluon_fp8.rows_16b), and both
    match the reference (32 heads: the column-split consumers, whose first copies the RoPE only on aligned rows)."""
    g = torch.Generator(device="cuda").manual_seed(29)
    N, T = 5000, 4
    rows = quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g), scale="pow2")
    storage = torch.zeros(N * DS_ROW + 16, dtype=torch.uint8, device="cuda")
    shifted = storage[4:4 + N * DS_ROW].view(N, DS_ROW)
    shifted.copy_(rows)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = adversarial_ids(T, 2048, N, g)
    sinks = adversarial_sinks(H, g)
    for pool in (rows, shifted):
        o, l = mla_sink.sparse_mla_decode(q, pool, idx, sinks, return_lse=True)
        ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks)
        check_budget(o, l, ro, rl, "bf16")



@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("H", [16, 32])
def test_non_finite_q_matches_the_reference(H, kv_dtype, splits):
    """The README's non-finite semantics on gluon_fp8, split or not (twenty-seventh session's break test): a
    ``-inf`` in a head row of q gives every score ``-inf`` (an empty row: e4m3's per-row fp16 scale of q comes
    from the row's largest finite |q|, so the inf stays inf; it was 0, and inf * 0 NaN), a NaN in q a NaN row,
    beside a huge finite |q| in the same row."""
    g = torch.Generator(device="cuda").manual_seed(H + splits)
    N = 4096
    kv = torch.randn(N, D_QK, device="cuda", generator=g)
    kv[:, 5] = kv[:, 5].abs() + 0.5
    q = torch.randn(2, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    q[0, 0, 5] = float("-inf")  # every score -inf: an empty row
    q[0, 1, 9] = float("nan")  # NaN scores
    q[1, :, 5] = float("-inf")  # every head of token 1 empty
    q[1, 2, 6] = 1e30  # the row's largest finite |q| beside its inf (its products stay inside fp32's range)
    if kv_dtype == "fp8_e4m3":
        cache, kv_scale = kv.to(torch.float8_e4m3fn), torch.tensor([1.0], device="cuda")
    else:
        cache, kv_scale = quantize_kv_cache(kv, scale="pow2"), None
    idx = torch.randint(0, N, (2, 2048), device="cuda", dtype=torch.int32, generator=g)
    sinks = adversarial_sinks(H, g)
    o, l = fp8_kernel()(q, cache, idx, sinks, kv_scale=kv_scale, num_kv_splits=splits, kv_dtype=kv_dtype)
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, kv_scale=kv_scale)
    assert torch.equal(l.isnan(), rl.isnan()) and torch.equal(l.isneginf(), rl.isneginf())
    assert torch.equal(o.isnan(), ro.isnan())
    assert rl[0, 0] == float("-inf") and rl[0, 1].isnan() and rl[1].isneginf().all()
    fin = rl.isfinite()
    check_budget(o[fin][:, None], l[fin][:, None], ro[fin][:, None], rl[fin][:, None],
                 "fp8_e4m3" if kv_dtype == "fp8_e4m3" else "bf16")
