"""The 656-byte FP8 V3.2 KV layout (``fp8_ds_mla``) on a CUDA GPU: the library's kernels against the float64
reference (computed on the GPU) at real shapes. On sm90 with bf16 q above 32 heads the seesaw kernel
serves the programs whose scales decode exactly into bf16 (power-of-two scales) and flags the others, which a
second launch of the seesaw, gated per program and reading every scale exactly, recomputes; the ``amax`` pools
exercise the second route, the ``pow2`` pools the first, :func:`test_seesaw_flags_exactly_the_tokens_with_other_scales`
both in one call and :func:`test_seesaw_reads_every_scale_exactly` the exact reading alone.

FlashMLA's method (tests/test_flash_mla_sparse_decoding.py): every row no valid id references is NaN (the
pool is filled with 0xFF bytes: NaN e4m3 codes, NaN float32 scales, NaN bf16 RoPE) and only the rows the
ids may reference are written; ``-1``, negative, ``>= N`` and ``2^31 - 1`` ids sit among the valid ones;
``sm_scale = 576 ** -0.55``; sinks with ``+inf`` and ``-inf`` heads. The main pool is larger than 2^31
bytes (``N * 656 > 2^31``) and half of every row's ids point into its last 2^20 rows (64-bit byte offsets).

Precision budget (elementwise on ``out``: ``abs <= ATOL or rel <= RTOL``, plus ``1 - cos(out, ref)`` over
the whole output; LSE: ``abs <= 1e-5 or rel <= 1e-5``), the budgets of tests/test_triton_gpu.py:

* bf16 q: ``1e-3 or 2/128``, cosine < 1e-5; fp16 q: ``5e-4 or 2/1024``, cosine < 1e-6.
* Error sources: the scores are sums of exact products (e4m3 values are bf16 and fp16 values) accumulated in
  fp32, each 128-column tile's sum multiplied by its float32 scale in fp32 (never rounded to bf16); for
  P.V, P times each row's scale over the block's largest scale is rounded once to q's dtype (as P is for
  every KV dtype), the product rescaled in fp32; out rounded to its dtype. A float32 emulation of these
  steps at H = 16 and 128, T = 2, topk 2048 on unit-variance data stayed within half of each budget
  (max abs error 4.9e-4 bf16 and 5.9e-5 fp16, cosine 2.1e-6 and 3.2e-8, LSE 5e-7).

The reference sees exactly the decoded values (:func:`mla_sink.dequantize_kv_cache`, float64), so
quantisation itself is not an error.
"""

from __future__ import annotations

import pytest
import torch

from mla_sink import SparseMLADecode, quantize_kv_cache, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

D_QK, D_V, ROW = 576, 512, 656
SM_SCALE = 576 ** -0.55
BUDGET = {torch.bfloat16: (1e-3, 2 / 128, 1e-5), torch.float16: (5e-4, 2 / 1024, 1e-6)}
LSE_BUDGET = (1e-5, 1e-5)
HIGH = 1 << 20  # the last HIGH rows start beyond byte 2^31
N_BIG = ((1 << 31) + (64 << 20)) // ROW + 1 + HIGH  # rows of the main pool: (N_BIG - HIGH) * 656 > 2^31 + 64 MiB
TOUCHED = 1 << 16  # rows written (the rest stay NaN): the first half among the last HIGH rows
SCALES = ("pow2", "amax")


@pytest.fixture(scope="module")
def big_pools():
    """Two pools of N_BIG rows (> 2^31 bytes), one per scale convention, NaN except TOUCHED written rows."""
    assert N_BIG * ROW > (1 << 31) and (N_BIG - HIGH) * ROW > (1 << 31)
    g = torch.Generator(device="cuda").manual_seed(0)
    high = torch.randperm(HIGH, generator=g, device="cuda")[: TOUCHED // 2] + (N_BIG - HIGH)
    low = torch.randperm(N_BIG - HIGH, generator=g, device="cuda")[: TOUCHED // 2]
    rows = torch.cat([high, low])  # rows[:TOUCHED // 2] beyond 2^31 bytes
    kv = torch.randn(TOUCHED, D_QK, device="cuda", generator=g)
    pools = {}
    for scale in SCALES:
        pool = torch.full((N_BIG, ROW), 0xFF, dtype=torch.uint8, device="cuda")
        pool[rows] = quantize_kv_cache(kv, scale=scale)
        pools[scale] = pool
    yield dict(pools=pools, rows=rows)
    del pools
    torch.cuda.empty_cache()


def _ids(T, topk, rows, g, num_rows):
    """Ids into the written rows: the first half of each row's ids among the rows beyond 2^31 bytes, then
    -1, -3, num_rows and 2^31 - 1 sprinkled over every row."""
    n = rows.shape[0]
    pick = torch.cat([torch.randint(0, n // 2, (T, topk // 2), device="cuda", generator=g),
                      torch.randint(0, n, (T, topk - topk // 2), device="cuda", generator=g)], 1)
    idx = rows[pick].to(torch.int32)
    idx[:, 5::97] = -1
    idx[:, 11::151] = -3
    idx[:, 7::131] = num_rows
    idx[:, 13::173] = 2 ** 31 - 1
    return idx


def _sinks(H, g):
    s = torch.randn(H, device="cuda", generator=g) + 8.0
    s[0] = float("inf")  # that head's output is exactly 0
    if H > 1:
        s[1] = float("-inf")  # no sink
    return s


def check_budget(o, l, ro, rl):
    atol, rtol, cos_max = BUDGET[o.dtype]
    assert not torch.isnan(o).any(), "out has NaN (a NaN row leaked or an element was not written)"
    assert torch.equal(torch.isneginf(l), torch.isneginf(rl)), "empty rows differ"
    if not ro.abs().sum() > 0:  # every row empty or sunk: exactly 0, no cosine of zero vectors
        assert (o == 0).all(), "reference output is all zero, kernel output is not"
        return
    o64 = o.double()
    err = (o64 - ro).abs()
    ok = (err <= atol) | (err <= rtol * ro.abs())
    assert ok.all(), f"{(~ok).sum().item()} elements over budget; max abs err {err.max().item():.3g}"
    cos = torch.nn.functional.cosine_similarity(o64.flatten(), ro.flatten(), dim=0).item()
    assert 1 - cos < cos_max, f"cosine difference {1 - cos:.3g}"
    fin = torch.isfinite(rl)
    le = (l.double() - rl.double()).abs()[fin]
    lok = (le <= LSE_BUDGET[0]) | (le <= LSE_BUDGET[1] * rl[fin].abs().double())
    assert lok.all(), f"LSE max abs err {le.max().item():.3g}"


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("T", [2, 3, 64])  # T=3: 128-id splits again at H <= 32 (the two-token rows end at 2)
@pytest.mark.parametrize("H", [16, 32, 64, 128])
def test_against_float64(big_pools, H, T, scale, q_dtype):
    pool, rows = big_pools["pools"][scale], big_pools["rows"]
    g = torch.Generator(device="cuda").manual_seed(H * 1000 + T)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(q_dtype)
    idx = _ids(T, 2048, rows, g, N_BIG)
    sinks = _sinks(H, g)
    plan = triton_plan_for(q, pool, idx, sinks=sinks)
    assert plan.launch.tuning_row.startswith("sm90_ds_mla"), plan.launch
    if torch.cuda.get_device_capability() == (9, 0) and plan.platform.gluon:
        # tables/triton_tuning.yaml: sm90_ds_mla_gluon (H <= 16), sm90_ds_mla_gluon_h32 (17-32), the seesaw above
        want = "portable" if q_dtype != torch.bfloat16 else "gluon_fp8" if H <= 32 else "gluon_seesaw"
        assert plan.launch.kernel == want, plan.launch
    o, l = sparse_mla_decode_triton(q, pool, idx, sinks, SM_SCALE)
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE)
    check_budget(o, l, ro, rl)
    assert (o[:, 0] == 0).all()  # the +inf sink head


@pytest.mark.parametrize("splits", [1, 4, 32])
def test_forced_splits_and_sinks(big_pools, splits):
    pool, rows = big_pools["pools"]["amax"], big_pools["rows"]
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 128, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = _ids(2, 2048, rows, g, N_BIG)
    idx[1, 1000:] = -1
    sinks = torch.randn(128, device="cuda", generator=g) + 8.0
    o0, l0 = sparse_mla_decode_triton(q, pool, idx, None, SM_SCALE, num_kv_splits=splits)
    o, l = sparse_mla_decode_triton(q, pool, idx, sinks, SM_SCALE, num_kv_splits=splits)
    assert not torch.allclose(o.float(), o0.float(), atol=1e-3, rtol=1e-2)  # the sinks changed the output
    torch.testing.assert_close(l, l0)  # the LSE is sink-free
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE)
    check_budget(o, l, ro, rl)


def test_topk_length_and_empty_rows(big_pools):
    pool, rows = big_pools["pools"]["pow2"], big_pools["rows"]
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(4, 64, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = _ids(4, 2048, rows, g, N_BIG)
    idx[2] = -1  # no valid id: out 0, lse -inf
    topk_length = torch.tensor([2048, 700, 2048, 0], dtype=torch.int32, device="cuda")
    sinks = _sinks(64, g)
    for splits in (1, 8):
        o, l = sparse_mla_decode_triton(q, pool, idx, sinks, SM_SCALE, topk_length=topk_length, num_kv_splits=splits)
        ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE, topk_length=topk_length)
        check_budget(o, l, ro, rl)
        assert (o[2:] == 0).all() and torch.isneginf(l[2:]).all()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the seesaw kernel is sm90 only")
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("H", [72, 96, 128])
def test_exact_recompute_with_topk_length_and_empty_rows(big_pools, H, splits):
    """An amax pool at more than 32 heads: the seesaw flags every program with a valid id and its exact reading
    recomputes them (64-head blocks, the last one partial at 72 and 96), gated per program, into the same outputs
    or partials; rows with no valid id, ``topk_length`` 0 and 700 (a partial block), ids past the pool. (A handful
    of ids is outside the budget's premise: with 5 ids, P rounded once to bf16 gave 0.007-0.012 on unit-variance
    rows in gluon_fp8, and the portable kernel 0.004-0.006 on an unsunk head, H200 2026-12-02.)"""
    pool, rows = big_pools["pools"]["amax"], big_pools["rows"]
    g = torch.Generator(device="cuda").manual_seed(H + splits)
    T = 5
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = _ids(T, 2048, rows, g, N_BIG)
    idx[1] = -1
    idx[4, ::7] = N_BIG + 3
    topk_length = torch.tensor([2048, 2048, 0, 700, 1500], dtype=torch.int32, device="cuda")
    sinks = _sinks(H, g)
    o, l = sparse_mla_decode_triton(q, pool, idx, sinks, SM_SCALE, topk_length=topk_length, num_kv_splits=splits)
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE, topk_length=topk_length)
    check_budget(o, l, ro, rl)
    assert (o[1:3] == 0).all() and torch.isneginf(l[1:3]).all()


@pytest.fixture(scope="module")
def padded_paged_pool():
    """[4096, 64, 656] carved from blocks of 65 rows (FlashMLA's tests: block stride 65 * 656 bytes); every
    row written, the 65th row of each block NaN."""
    g = torch.Generator(device="cuda").manual_seed(3)
    blocks, block_size = 4096, 64
    storage = torch.full((blocks, block_size + 1, ROW), 0xFF, dtype=torch.uint8, device="cuda")
    paged = storage[:, :block_size]
    kv = torch.randn(blocks * block_size, D_QK, device="cuda", generator=g)
    paged.copy_(quantize_kv_cache(kv, scale="amax").view(blocks, block_size, ROW))
    assert paged.stride() == ((block_size + 1) * ROW, ROW, 1)
    yield paged
    del storage
    torch.cuda.empty_cache()


@pytest.mark.parametrize("T", [2, 64])
@pytest.mark.parametrize("H", [64, 128])
def test_paged_pool_with_padded_blocks(padded_paged_pool, H, T):
    paged = padded_paged_pool
    n = paged.shape[0] * paged.shape[1]
    g = torch.Generator(device="cuda").manual_seed(H + T)
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, n, (T, 2048), device="cuda", generator=g, dtype=torch.int32)
    idx[:, 5::97] = -1
    idx[:, 7::131] = n  # = the first pad row's id if the pool were read as flat 65-row blocks
    sinks = _sinks(H, g)
    o, l = sparse_mla_decode(q, paged, idx, sinks, sm_scale=SM_SCALE)
    ro, rl = sparse_mla_decode_reference(q, paged, idx, sinks, SM_SCALE)
    check_budget(o, l, ro, rl)
    flat = paged.reshape(n, ROW)  # a contiguous copy of the same rows: the same kernel, kv_block_size 1
    fo, fl = sparse_mla_decode(q, flat, idx, sinks, sm_scale=SM_SCALE)
    check_budget(fo, fl, ro, rl)
    torch.testing.assert_close(fo, o)  # the same arithmetic on the same bytes (bitwise equal on the CPU)
    torch.testing.assert_close(fl, l)


def test_layer_and_cuda_graph_capture(big_pools):
    pool, rows = big_pools["pools"]["amax"], big_pools["rows"]
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 64, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = _ids(2, 2048, rows, g, N_BIG)
    sinks = _sinks(64, g)
    layer = SparseMLADecode(num_heads=64, q_dtype="bf16", kv_dtype="fp8_ds_mla", topk=2048, sinks=sinks,
                            sm_scale=SM_SCALE)
    assert layer.plan.path == "triton", layer
    out = torch.empty(2, 64, D_V, device="cuda", dtype=torch.bfloat16)
    layer(q, pool, idx, out=out)  # warm-up: compiles and prepares the call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = layer(q, pool, idx, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE)
    check_budget(out, lse, ro, rl)


def test_fp16_q_reads_rope_beyond_fp16_range():
    """fp16 q on V3.2 rows (the portable kernel): bf16 RoPE values beyond fp16's range (3e5, -1e30) and below its
    normal range (2^-20) in referenced rows, against float64. The kernel cast them to fp16 (inf scores, NaN out)
    before its RoPE product took fp32 products (kmath.ds_mla_rope_scores)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    N, T, H = 4096, 4, 16
    pool = quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g), scale="amax")
    rope = pool[:, 528:].view(torch.bfloat16)  # [N, 64], the rows' RoPE in place
    rope[7, 0], rope[8, 1], rope[9] = 3e5, -1e30, 2.0 ** -20
    q = torch.randn(T, H, D_QK, device="cuda", generator=g)
    q[..., 512:] *= 1e-3  # scores stay moderate: 3e5 x 1e-3 x sm_scale
    q = q.to(torch.float16)
    idx = torch.randint(0, N, (T, 256), device="cuda", generator=g, dtype=torch.int32)
    idx[:, :3] = torch.tensor([7, 8, 9], device="cuda", dtype=torch.int32)
    sinks = _sinks(H, g)
    assert triton_plan_for(q, pool, idx, sinks=sinks).launch.kernel == "portable"
    o, l = sparse_mla_decode_triton(q, pool, idx, sinks, SM_SCALE)
    ro, rl = sparse_mla_decode_reference(q, pool, idx, sinks, SM_SCALE)
    check_budget(o, l, ro, rl)


@pytest.mark.parametrize("ratio", [1e6, 1e8])
def test_fp16_q_keeps_small_scale_rows_beside_a_huge_one(ratio):
    """fp16 q on V3.2 rows (the portable kernel rounds ``P * scale`` to fp16 for ``P V``): one referenced row with
    latent values ``ratio`` times the others' and a score far below theirs, in every block of ids. Normalising by
    the block's largest scale sent the other rows' weights below fp16's range (0.75 relative error at 1e8 on an
    fp16-exact CPU run); per head, by its largest ``|P * scale|`` (kmath.ds_mla_pv), the output keeps the budget."""
    g = torch.Generator(device="cuda").manual_seed(12)
    N, T, H = 4096, 2, 16
    kv = torch.randn(N, D_QK, device="cuda", generator=g) * 0.5
    q1 = torch.randn(D_QK, device="cuda", generator=g) * 0.5
    kv[:64, :512] = -q1[:512].sign() * 0.5 * ratio  # huge values with a score far below the others'
    pool = quantize_kv_cache(kv, scale="amax")
    q = q1.expand(T, H, D_QK).to(torch.float16)
    idx = torch.randint(64, N, (T, 256), device="cuda", generator=g, dtype=torch.int32)
    idx[:, ::32] = torch.arange(8, device="cuda", dtype=torch.int32)  # a huge row in every 32 ids
    assert triton_plan_for(q, pool, idx).launch.kernel == "portable"
    o, l = sparse_mla_decode_triton(q, pool, idx, None, SM_SCALE)
    ro, rl = sparse_mla_decode_reference(q, pool, idx, None, SM_SCALE)
    check_budget(o, l, ro, rl)


def test_misaligned_pool_is_refused_before_the_kernel(big_pools):
    pool = big_pools["pools"]["pow2"]
    shifted = pool.view(-1)[2: 2 + 1024 * ROW].view(1024, ROW)
    q = torch.zeros(1, 16, D_QK, device="cuda", dtype=torch.bfloat16)
    idx = torch.zeros(1, 64, device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match="must start at a multiple of 4 bytes"):
        sparse_mla_decode(q, shifted, idx)


@pytest.mark.parametrize("H", [64, 128])
def test_equals_flash_mla_decode_on_the_same_bytes(H):
    """Our output on a 656-byte cache against FlashMLA's fp8 decode on the same bytes (when ``flash_mla`` is
    importable; see ../shared/peers/README.md), both against the float64 reference within the budget. The
    cache has power-of-two scales (FlashMLA's quantiser convention), which FlashMLA's bf16 rounding of each
    scale keeps exact; sinks on; topk 2048."""
    from mla_sink.tools import peers

    flash_mla, why = peers.import_flash_mla()
    if flash_mla is None:
        pytest.skip(why)
    g = torch.Generator(device="cuda").manual_seed(H)
    N, T, topk = 1 << 16, 4, 2048
    cache = quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g).to(torch.bfloat16),
                              layout="fp8_ds_mla", scale="pow2")
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    idx[0, :100] = -1
    sinks = torch.randn(H, device="cuda", generator=g)
    o, l = sparse_mla_decode(q, cache, idx, sinks, SM_SCALE, return_lse=True)
    peer = peers.decode_call(flash_mla, q, cache, idx, sinks, SM_SCALE)
    fo, fl = peer.result(peer.run())
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, SM_SCALE)
    check_budget(o, l, ro, rl)
    atol, rtol, _ = BUDGET[torch.bfloat16]
    diff = (o.double() - fo.double()).abs()
    ok = (diff <= 2 * atol) | (diff <= 2 * rtol * ro.abs())  # each within the budget of the reference
    assert ok.all(), f"ours vs FlashMLA: {(~ok).sum().item()} elements apart, max {diff.max().item():.3g}"
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(fl), fin)
    assert (l - fl).abs()[fin].max().item() <= 2 * LSE_BUDGET[0] + 2 * LSE_BUDGET[1] * rl[fin].abs().max().item()


def _set_scale(pool, row, tile, value):
    """Write one float32 tile scale of a V3.2 row (its codes unchanged: the decoded values change with it)."""
    pool[row, 512 + 4 * tile: 516 + 4 * tile] = torch.tensor([value], dtype=torch.float32).view(torch.uint8).cuda()


def _odd_scales_case(H, splits, spanning):
    """A pow2 cache of 4096 rows with rows of other scales, T=8 tokens of topk 2048 and their inputs: ``(cache,
    idx, topk_length, q, sinks)``. Row 10 has a non-power of two (1.5 x 2^-7, as an amax writer gives), row 20 a
    power of two below the range the seesaw decodes into bf16 (2^-120), row 30 one above it (2^120, with small codes
    so that the values stay finite), row 40 a zero scale, row 50 the top of the range (2^119, codes up to 448 stay
    below bf16's max); with ``spanning``, row 55's four tiles span 2^-100 .. 2^100 (the Horner ratios of the exact
    scores). Tokens 0, 2, 3, 5, 6 (and 4 with ``spanning``) reference one of them; token 7 references row 10 only
    past its ``topk_length`` (never read)."""
    g = torch.Generator(device="cuda").manual_seed(17 + H + splits)
    N, T, topk = 4096, 8, 2048
    cache = quantize_kv_cache(torch.randn(N, D_QK, device="cuda", generator=g), scale="pow2")
    odd = {10: (1, 1.5 * 2.0 ** -7), 20: (3, 2.0 ** -120), 30: (0, 2.0 ** 120)}  # row: (tile, scale)
    for row, (tile, value) in odd.items():
        _set_scale(cache, row, tile, value)
    cache[30, :128] = 0x08  # e4m3 2^-6 x 1.0: times 2^120 stays far below the float32 / bf16 max
    _set_scale(cache, 40, 2, 0.0)  # a zero scale: the tile's values are 0
    _set_scale(cache, 50, 1, 2.0 ** 119)  # the top of the range (codes up to 448 stay below bf16 max)
    cache[50, 128:256] = 0x08
    where = {0: 10, 2: 20, 3: 30, 5: 40, 6: 50}  # token: the special row it references
    if spanning:
        for tile, value in enumerate((2.0 ** -100, 3.0 * 2.0 ** 40, 2.0 ** 100, 5.0 * 2.0 ** -60)):
            _set_scale(cache, 55, tile, value)
        cache[55, :512] = 0x08
        where[4] = 55
    idx = torch.randint(60, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    idx[:, 3::101] = -1
    for t, row in where.items():
        idx[t, (t * 389) % topk] = row
    idx[7, 1500:] = 10  # past topk_length: never read
    topk_length = torch.full((T,), topk, dtype=torch.int32, device="cuda")
    topk_length[7] = 1500
    q = torch.randn(T, H, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    return cache, idx, topk_length, q, _sinks(H, g)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the seesaw kernel is sm90 only")
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("H", [16, 24, 64, 128])
def test_seesaw_reads_every_scale_exactly(H, splits):
    """The seesaw kernel's exact reading of V3.2 rows (``exact=True``: every program, no flags) on the cache of
    :func:`_odd_scales_case` with the spanning row. Every token is within the budget of the float64 reference,
    through the kernel and the library."""
    from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw

    cache, idx, topk_length, q, sinks = _odd_scales_case(H, splits, spanning=True)
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length)
    o, l = sparse_mla_decode_seesaw(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length, num_kv_splits=splits,
                                    kv_dtype="fp8_ds_mla", exact=True)
    check_budget(o, l, ro, rl)
    o, l = sparse_mla_decode(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length, return_lse=True)
    check_budget(o, l, ro, rl)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the seesaw kernel is sm90 only")
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("H", [16, 24, 64, 128])
def test_seesaw_flags_exactly_the_tokens_with_other_scales(H, splits):
    """The cache of :func:`_odd_scales_case` without the spanning row: the seesaw cannot decode rows 10, 20 and 30
    exactly into bf16, so the tokens that reference one of them are flagged (``redo``) and recomputed; a zero scale
    and in-range powers of two are not flagged. Every token's result is within the budget of the float64
    reference."""
    from mla_sink.kernels.gluon.gluon_seesaw import HEAD_BLOCK, sparse_mla_decode_seesaw

    cache, idx, topk_length, q, sinks = _odd_scales_case(H, splits, spanning=False)
    T = q.shape[0]
    redo = torch.full((T, -(-H // HEAD_BLOCK) * splits), -7, dtype=torch.int32, device="cuda")
    sparse_mla_decode_seesaw(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length, num_kv_splits=splits,
                             kv_dtype="fp8_ds_mla", redo=redo)
    flagged = (redo != 0).any(dim=1).tolist()
    assert ((redo == 0) | (redo == 1)).all(), redo  # every program wrote its word
    assert flagged == [t in (0, 2, 3) for t in range(T)], redo
    o, l = sparse_mla_decode(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length, return_lse=True)
    ro, rl = sparse_mla_decode_reference(q, cache, idx, sinks, SM_SCALE, topk_length=topk_length)
    check_budget(o, l, ro, rl)
