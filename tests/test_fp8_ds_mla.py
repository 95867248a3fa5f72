"""The 656-byte FP8 V3.2 KV layout (``fp8_ds_mla``): the dtype key, the quantiser and the exact
dequantiser (:mod:`mla_sink.core.kv_layout`), and the layout through every entry point on the CPU.

Layout (FlashMLA ``flash_mla_interface.py``): bytes 0..511 e4m3fn latent values, 512..527 four
float32 scales (one per 128 latent columns), 528..655 64 bf16 RoPE values.
"""

from __future__ import annotations

import struct

import pytest
import torch

import mla_sink
from mla_sink.core import kv_layout
from mla_sink.core.dtypes import allowed_dtype_pairs, kv_dtype_key
from mla_sink.core.kv_layout import dequantize_kv_cache, quantize_kv_cache
from mla_sink.core.records import CallSpec

D_QK, D_V, ROW = 576, 512, 656


def e4m3_value(code: int) -> float:
    """The value of one float8 e4m3fn code, from the OCP definition (bias 7, no inf, NaN = S.1111.111)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0 ** -6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def write_row(codes, scales, rope) -> bytes:
    """One 656-byte row written field by field with ``struct`` (little-endian float32 scales, bf16 RoPE as
    the top half of a float32), independent of the code under test."""
    assert len(codes) == 512 and len(scales) == 4 and len(rope) == 64
    out = bytes(codes) + struct.pack("<4f", *scales)
    for r in rope:
        out += struct.pack("<I", struct.unpack("<I", struct.pack("<f", r))[0] >> 16)[:2]
    assert len(out) == ROW
    return out


# ---- the dtype key -------------------------------------------------------------------------------

def test_dtype_key_and_pairs():
    assert ("bf16", "fp8_ds_mla") in allowed_dtype_pairs() and ("fp16", "fp8_ds_mla") in allowed_dtype_pairs()
    spec = CallSpec(q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=16, topk=64)
    assert str(spec) == "bf16+kv_fp8_ds_mla-h16-nosinks-dcp1"
    CallSpec(q_dtype="fp16", kv_dtype="fp8_ds_mla", num_heads=16, topk=64)
    for q in ("fp8_e4m3", "fp8_e4m3fnuz"):
        with pytest.raises(ValueError, match="fp8_ds_mla kv_cache takes q in"):
            CallSpec(q_dtype=q, kv_dtype="fp8_ds_mla", num_heads=16, topk=64)
    with pytest.raises(ValueError, match="'q_dtype' must be in"):  # a KV-only key is no q dtype
        CallSpec(q_dtype="fp8_ds_mla", kv_dtype="fp8_ds_mla", num_heads=16, topk=64)


def test_kv_dtype_key_from_tensors():
    assert kv_dtype_key(torch.zeros(4, ROW, dtype=torch.uint8)) == "fp8_ds_mla"
    assert kv_dtype_key(torch.zeros(2, 64, ROW, dtype=torch.uint8)) == "fp8_ds_mla"
    assert kv_dtype_key(torch.zeros(4, D_QK, dtype=torch.bfloat16)) == "bf16"
    with pytest.raises(ValueError, match=r"'kv_cache' of dtype torch.uint8 must have a last dimension of 656"):
        kv_dtype_key(torch.zeros(4, D_QK, dtype=torch.uint8))
    with pytest.raises(ValueError, match="'kv_cache' dtype must be one of"):
        kv_dtype_key(torch.zeros(4, D_QK, dtype=torch.float32))


# ---- the dequantiser: exact ----------------------------------------------------------------------

def test_dequantiser_decodes_every_code_exactly():
    """Each of the 256 codes, in each tile, times a hand-chosen float32 scale (powers of two and not),
    decodes to ``e4m3 * scale`` in float64 exactly; NaN codes to NaN; RoPE bf16 bits exactly."""
    scales = [0.5, 1.7000000476837158, 3.0517578125e-05, 123.456787109375]  # float32 values
    assert all(struct.unpack("<f", struct.pack("<f", s))[0] == s for s in scales)
    rows, want = [], []
    for r in range(2):
        codes = [c % 256 if r == 0 else 255 - c % 256 for c in range(512)]  # every code in every tile pair
        rope = [(-1) ** j * (j + 0.5) * 2.0 ** (j - 30) for j in range(64)]  # exact in bf16: 2 significant bits
        rows.append(write_row(codes, scales, rope))
        want.append([e4m3_value(c) * scales[i // 128] for i, c in enumerate(codes)] + rope)
    cache = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).reshape(2, ROW)
    got = dequantize_kv_cache(cache)
    assert got.dtype == torch.float64 and got.shape == (2, D_QK)
    want = torch.tensor(want, dtype=torch.float64)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got).sum() == 8  # 0x7F, 0xFF twice a row
    fin = ~torch.isnan(want)
    assert torch.equal(got[fin], want[fin])


def test_dequantiser_nonfinite_scales_and_paged_form():
    codes = [0x38] * 512  # 1.0
    row_nan = write_row(codes, [float("nan"), 1.0, float("inf"), 2.0], [1.0] * 64)
    cache = torch.frombuffer(bytearray(row_nan * 3), dtype=torch.uint8).reshape(3, 1, ROW)
    got = dequantize_kv_cache(cache)
    assert got.shape == (3, D_QK)
    assert torch.isnan(got[:, :128]).all() and (got[:, 128:256] == 1).all()
    assert torch.isposinf(got[:, 256:384]).all() and (got[:, 384:512] == 2).all()
    # a paged pool with padded blocks (block stride 65 rows): row ids block * 64 + offset
    pool = torch.randint(0, 256, (3, 65, ROW), dtype=torch.uint8)
    paged = pool[:, :64]
    flat = torch.cat([pool[b, :64] for b in range(3)])
    a, b = dequantize_kv_cache(paged), dequantize_kv_cache(flat)
    assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("blocks,block_size,pad,flat", [
    (None, 37, 0, True),  # [N, 656]
    (None, 37, 16, True),  # [N, 656] rows at a 672-byte stride
    (5, 8, 0, True),  # pages without gaps: the flat pool they are
    (5, 8, 1, False),  # FlashMLA's tests' padded blocks: block stride (block_size + 1) rows
    (5, 64, 3, False),
    (1, 64, 2, True),  # one block: no block stride to follow
    (6, 1, 1, True),  # one row a block: the block stride is the row stride
])
def test_row_addressing_points_at_every_row(blocks, block_size, pad, flat):
    """``kv_layout.row_addressing`` (what the kernels address rows with) gives every id the byte offset of its row
    in the pool's storage, and drops the page arithmetic exactly when the pages follow each other without a gap."""
    if blocks is None:
        pool = torch.empty(block_size, ROW + pad, dtype=torch.uint8)[:, :ROW]
    else:
        pool = torch.empty(blocks, block_size + pad, ROW, dtype=torch.uint8)[:, :block_size]
    kv_block_size, stride_kv = kv_layout.row_addressing(pool)
    assert (kv_block_size == 1) == flat
    rows = kv_layout.num_rows(pool)
    row_stride = pool.stride(-2)
    for i in range(rows):
        want = (pool[i] if pool.dim() == 2 else pool[i // block_size, i % block_size]).data_ptr() - pool.data_ptr()
        assert (i // kv_block_size) * stride_kv + (i % kv_block_size) * row_stride == want, (i, want)


@pytest.mark.parametrize("bad,message", [(torch.empty(ROW, dtype=torch.uint8), r"got shape \(656,\)"),
                                         (torch.empty(2, 2, 2, ROW, dtype=torch.uint8), r"got shape \(2, 2, 2, 656\)"),
                                         ([1, 2], "got list")])
def test_row_addressing_refuses_what_is_not_a_pool(bad, message):
    with pytest.raises(ValueError, match=r"'kv_cache' must be a pool .*" + message):
        kv_layout.row_addressing(bad)


# ---- the quantiser -------------------------------------------------------------------------------

def _kv(n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(n, D_QK, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    kv[3, :128] = 0.0  # an all-zero tile
    kv[4, 128:256] = 448.0  # a tile whose amax is exactly 448 * 2^0
    kv[5, 256:384] = 1e-39  # a subnormal float32 amax
    kv[6] = kv[6] * 1e30
    return kv


@pytest.mark.parametrize("scale", ["pow2", "amax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantiser_round_trip(scale, dtype):
    kv = _kv() if dtype == torch.float32 else (_kv() / 1e30 if dtype == torch.float16 else _kv()).to(dtype)
    kv = kv.nan_to_num(posinf=1e4, neginf=-1e4).to(dtype)
    cache = quantize_kv_cache(kv, scale=scale)
    assert cache.dtype == torch.uint8 and cache.shape == (kv.shape[0], ROW) and cache.is_contiguous()
    x = kv.double()
    back = dequantize_kv_cache(cache)
    # RoPE: bf16 rounding of the input (exact for bf16 input)
    assert torch.equal(back[:, D_V:], kv[:, D_V:].to(torch.bfloat16).double())
    s = cache[:, 512:528].contiguous().view(torch.float32).double()  # [N, 4]
    amax = x[:, :D_V].reshape(-1, 4, 128).abs().amax(-1)
    zero = amax == 0
    assert (s[zero] == 1.0).all()
    nz = ~zero
    assert (s[nz] >= kv_layout.MIN_SCALE).all()  # no scale below the floor, a 1e-39 tile's included (_kv)
    # every code in range (amax / 448 rounded in float32 may leave amax / scale one ulp above 448: clamped)
    assert (amax[nz] / s[nz] <= 448 * (1 + 2.0 ** -22)).all()
    assert not torch.isnan(back).any()
    if scale == "pow2":
        m, _ = torch.frexp(s)
        assert (m == 0.5).all()  # powers of two
        small = s[nz] > kv_layout.MIN_SCALE
        assert (amax[nz][small] / (s[nz][small] / 2) > 448).all()  # the smallest such power of two
    else:
        want = torch.clamp((amax.float() / 448).double(), min=kv_layout.MIN_SCALE)
        assert torch.equal(s[nz], want[nz])
    # latent: each value within half an e4m3 ulp of its tile (relative 2^-4, absolute 2^-10 * scale)
    err = (back[:, :D_V] - x[:, :D_V]).abs().reshape(-1, 4, 128)
    lim = torch.maximum(x[:, :D_V].abs().reshape(-1, 4, 128) * 2.0 ** -4, s.unsqueeze(-1) * 2.0 ** -10)
    assert (err <= lim).all()
    # a second quantisation of what decodes is exact (codes and scales reproduce)
    if scale == "pow2":
        again = quantize_kv_cache(torch.cat([back[:, :D_V], back[:, D_V:]], 1).float(), scale="pow2")
        assert torch.equal(dequantize_kv_cache(again), back)


def test_quantiser_amax_is_vllms_float32_quotient():
    """vLLM's rule, hand-computed: each tile's scale is ``amax / 448`` rounded once to float32 (Python's float
    division, then the float32 nearest it), floored at float32's smallest normal 2^-126 (FLT_MIN); an all-zero tile
    gets 1.0."""
    import struct

    def f32(x: float) -> float:
        return struct.unpack("<f", struct.pack("<f", x))[0]

    amaxes = [448.0, 1.0, 3.0, 1e-3, 5e4, 448.0 * 2.0 ** -130, 0.0]
    kv = torch.zeros(len(amaxes), D_QK)
    for r, a in enumerate(amaxes):
        kv[r, 5] = -a  # the tile's largest magnitude, negative: amax is of |values|
        kv[r, 6] = a / 3
    s = quantize_kv_cache(kv, scale="amax")[:, 512:528].contiguous().view(torch.float32)[:, 0].tolist()
    want = [1.0, f32(1.0 / 448.0), f32(3.0 / 448.0), f32(f32(1e-3) / 448.0), f32(5e4 / 448.0), 2.0 ** -126, 1.0]
    assert s == want


def test_quantiser_pow2_matches_flashmla_rule():
    """FlashMLA's rule ``2^ceil(log2(amax / 448))`` where ``amax / 448 >= 1e-4`` (its clamp), exactly at
    the binade edges: amax = 448 * 2^k gives 2^k, one ulp above gives 2^(k+1)."""
    kv = torch.zeros(3, D_QK)
    kv[0, 0] = 448.0 * 4
    kv[1, 0] = torch.nextafter(torch.tensor(448.0 * 4), torch.tensor(1e9))
    kv[2, 0] = 0.75
    s = quantize_kv_cache(kv)[:, 512:516].contiguous().view(torch.float32).flatten().tolist()
    assert s == [4.0, 8.0, 2.0 ** -9]


def test_quantiser_paged_and_errors():
    kv = torch.randn(2, 5, D_QK)
    paged = quantize_kv_cache(kv, scale="amax")
    assert paged.shape == (2, 5, ROW)
    assert torch.equal(paged.reshape(10, ROW), quantize_kv_cache(kv.reshape(10, D_QK), scale="amax"))
    with pytest.raises(ValueError, match="'scale' must be one of"):
        quantize_kv_cache(kv, scale="ue8m0")
    with pytest.raises(ValueError, match="'layout' must be 'fp8_ds_mla'"):
        quantize_kv_cache(kv, layout="fp8_e4m3")
    with pytest.raises(ValueError, match="'kv' must be bfloat16, float16 or float32"):
        quantize_kv_cache(kv.double())
    with pytest.raises(ValueError, match=r"'kv' must be \[N, 576\]"):
        quantize_kv_cache(torch.randn(4, 512))
    with pytest.raises(ValueError, match="'kv' must be a torch.Tensor"):
        quantize_kv_cache([[0.0] * D_QK])
    bad = torch.randn(3, D_QK)
    bad[1, 7] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        quantize_kv_cache(bad)
    with pytest.raises(ValueError, match="'layout' must be 'fp8_ds_mla'"):
        dequantize_kv_cache(paged, layout="bf16")
    with pytest.raises(ValueError, match=r"'kv_cache' must be uint8 \[N, 656\].*\(got torch.uint8 shape \(4, 576\)\)$"):
        dequantize_kv_cache(torch.zeros(4, D_QK, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"shape \(3, 64, 1, 656\)\); a \[num_blocks, block_size, 1, 656\] cache of "
                                         r"one KV head \(FlashMLA's k_cache\) is passed as kv_cache.squeeze\(2\)"):
        dequantize_kv_cache(torch.zeros(3, 64, 1, 656, dtype=torch.uint8))


def test_public_api_exports():
    assert mla_sink.quantize_kv_cache is quantize_kv_cache
    assert mla_sink.dequantize_kv_cache is dequantize_kv_cache


# ---- the kernel (Triton's interpreter) against the float64 reference -----------------------------
#
# FlashMLA's method (tests/test_flash_mla_sparse_decoding.py): the reference sees exactly the decoded
# values; every row no valid id references is NaN (NaN e4m3 codes 0x7F/0xFF, NaN or inf scales, NaN
# RoPE); -1, negative and >= N ids anywhere; sm_scale = 576 ** -0.55; sinks with +-inf; empty rows.

SM_SCALE = 576 ** -0.55
#: (atol, rtol) of ``out`` by out dtype: under the interpreter the tiles are fp32 (exact products), so the
#: error is the final rounding to the out dtype plus fp32 sums (tests/test_triton_kernel.py's budget)
OUT_TOL = {torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 8e-3)}
LSE_TOL = (2e-5, 1e-5)
BAD_IDS = (-1, -5, "N", 2 ** 31 - 1)
NAN_BF16 = 0x7FC0


def poison_unreferenced(cache: torch.Tensor, used: torch.Tensor) -> None:
    """Fill every row of a flat uint8 ``[N, 656]`` view that ``used`` (bool ``[N]``) marks False with NaN:
    latent codes 0x7F / 0xFF, scales NaN or +inf (alternating rows), RoPE NaN."""
    rows = torch.nonzero(~used).flatten()
    for k, r in enumerate(rows.tolist()):
        cache[r, :512] = 0x7F if k % 2 else 0xFF
        cache[r, 512:528] = torch.tensor([float("nan") if k % 2 else float("inf")] * 4).view(torch.uint8)
        cache[r, 528:] = torch.tensor([NAN_BF16] * 64, dtype=torch.int16).view(torch.uint8)


def make_case(T=4, H=5, topk=37, N=96, seed=0, scale="pow2", q_dtype=torch.bfloat16, sinks="mixed",
              block_size=None):
    """Inputs in the fp8_ds_mla layout. Token rows: 0 = valid ids with -1, -5, N and 2^31-1 mixed in;
    1 = its first 16 ids -1; 2 = every id -1 (empty); the rest random. Rows N-8.. are never referenced.
    ``block_size``: a paged pool ``[N / block_size, block_size, 656]`` carved from blocks of
    ``block_size + 1`` rows (FlashMLA's tests: block stride ``(block_size + 1) * 656``), pad rows NaN."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, H, D_QK, generator=g) * 1.5).to(q_dtype)
    mag = torch.logspace(-2, 2, N).unsqueeze(1)[torch.randperm(N, generator=g)]
    kv = torch.randn(N, D_QK, generator=g) * mag
    kv[:, D_V:] = torch.randn(N, D_QK - D_V, generator=g)  # RoPE at unit scale
    idx = torch.randint(0, N - 8, (T, topk), generator=g, dtype=torch.int32)
    if T > 0:
        pos = torch.arange(0, topk, 3)
        bad = torch.tensor([N if b == "N" else b for b in BAD_IDS], dtype=torch.int32)
        idx[0, pos] = bad[torch.arange(len(pos)) % len(bad)]
    if T > 1:
        idx[1, : min(16, topk - 1)] = -1
    if T > 2:
        idx[2] = -1
    flat = quantize_kv_cache(kv, scale=scale)
    used = torch.zeros(N, dtype=torch.bool)
    ok = (idx >= 0) & (idx < N)
    used[idx[ok].long()] = True
    poison_unreferenced(flat, used)
    cache = flat
    if block_size is not None:
        assert N % block_size == 0
        pool = torch.empty(N // block_size, block_size + 1, ROW, dtype=torch.uint8)
        poison_unreferenced(pool.view(-1, ROW), torch.zeros(pool.shape[0] * pool.shape[1], dtype=torch.bool))
        cache = pool[:, :block_size]
        cache.copy_(flat.view(-1, block_size, ROW))
        assert cache.stride() == ((block_size + 1) * ROW, ROW, 1)
    if sinks == "mixed":
        vals = [float("-inf"), 0.5, float("inf"), 0.0, 20.0, 100.0, -1.0, 2.0]
        s = torch.tensor([vals[h % len(vals)] for h in range(H)], dtype=torch.float32)
    else:
        s = None if sinks is None else torch.full((H,), float(sinks))
    return dict(q=q, kv_cache=cache, indices=idx, sinks=s)


def run_kernel(case, sm_scale=SM_SCALE, **kw):
    """(kernel out, kernel lse, reference out, reference lse); output buffers poisoned with NaN."""
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    q = case["q"]
    T, H, _ = q.shape
    out = torch.full((T, H, D_V), float("nan"), dtype=q.dtype)
    lse = torch.full((T, H), float("nan"))
    extra = {k: kw.pop(k) for k in ("topk_length",) if k in kw}
    o, l = sparse_mla_decode_triton(q, case["kv_cache"], case["indices"], case["sinks"], sm_scale, out=out, lse=lse,
                                    **extra, **kw)
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    assert not torch.isnan(o).any(), "out has NaN (unwritten element or a leaked NaN row)"
    assert not torch.isnan(l).any(), "lse has NaN (unwritten element or a leaked NaN row)"
    ro, rl = sparse_mla_decode_reference(q, case["kv_cache"], case["indices"], case["sinks"], sm_scale, **extra)
    assert not torch.isnan(ro).any()
    return o, l, ro, rl


def check(o, l, ro, rl):
    atol, rtol = OUT_TOL[o.dtype]
    torch.testing.assert_close(o.double(), ro, atol=atol, rtol=rtol)
    torch.testing.assert_close(l, rl, atol=LSE_TOL[0], rtol=LSE_TOL[1])


def _cfg(**kw):
    from mla_sink.paths.triton.plan import TritonConfig

    base = dict(block_h=16, block_n=32, num_warps=4, num_stages=1, max_kv_splits=32, min_ids_per_split=32,
                split_waves=1.0, split_min_fill=0.5, combine_block_h=16, combine_block_d=D_V, min_combine_block_d=32,
                fp8_f16=False)
    return TritonConfig(**{**base, **kw})


UNSPLIT = dict(config=_cfg(), num_kv_splits=1)
SPLIT = dict(config=_cfg(block_h=64, block_n=16), num_kv_splits=3)
interp = pytest.mark.interpreter


@interp
@pytest.mark.parametrize("scale", ["pow2", "amax"])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_kernel_against_float64(scale, q_dtype, split):
    case = make_case(scale=scale, q_dtype=q_dtype, seed=1)
    check(*run_kernel(case, **(SPLIT if split else UNSPLIT)))


@interp
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32_upcast"])
def test_rope_scores_keep_bf16_range_and_small_values(q_dtype):
    """kmath.ds_mla_rope_scores, the RoPE product of the portable kernel's V3.2 rows, run by Triton's interpreter
    on fp16 q as the GPU's tiles hold it (the kernel itself runs fp32 tiles under the interpreter, the second
    case; the interpreter does no bf16 arithmetic, so bf16 q runs on the GPU only): bf16 RoPE values beyond
    fp16's range (3e5, -1e30) and below its normal range (2^-20) against float64. Casting them to fp16 q's
    dtype, as the kernel did, gave inf scores and NaN weights."""
    from interp_kernels import rope_scores_kernel
    from triton.runtime.interpreter import InterpretedFunction

    from mla_sink.kernels.triton.interpreter import interpreter_stdlib

    g = torch.Generator().manual_seed(3)
    H, N, D = 16, 16, kv_layout.D_ROPE
    q = (torch.randn(H, D, generator=g) * 1e-3).to(q_dtype)
    k = torch.randn(N, D, generator=g).to(torch.bfloat16)
    k[0, 0], k[1, 1], k[2] = 3e5, -1e30, 2.0 ** -20
    out = torch.full((H, N), float("nan"))
    with interpreter_stdlib():
        InterpretedFunction(rope_scores_kernel.fn)[(1,)](q, k, out, H=H, N=N, D=D)
    ref = q.double() @ k.double().T
    assert torch.isfinite(out).all()
    # fp32 sums of exact products: a few fp32 ulps of the sum of |products|
    bound = 1e-6 * (q.double().abs() @ k.double().abs().T)
    assert ((out.double() - ref).abs() <= bound).all()


@interp
@pytest.mark.parametrize("H", [1, 5, 24])
def test_kernel_odd_heads_and_default_tiles(H):
    case = make_case(T=3, H=H, topk=40, seed=2)
    check(*run_kernel(case))  # the tuning table's cpu row
    check(*run_kernel(case, **SPLIT))


@interp
@pytest.mark.parametrize("block_size", [1, 8, 16])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_kernel_paged_pool_with_padded_blocks(block_size, split):
    """[num_blocks, block_size, 656] with block stride (block_size + 1) * 656: ids block * block_size + offset;
    the pad rows between blocks are NaN and never read."""
    case = make_case(N=96, block_size=block_size, seed=3, scale="amax")
    o, l, ro, rl = run_kernel(case, **(SPLIT if split else UNSPLIT))
    check(o, l, ro, rl)
    flat = dict(case, kv_cache=case["kv_cache"].reshape(-1, ROW))  # the same rows as one flat pool
    fo, fl, _, _ = run_kernel(flat, **(SPLIT if split else UNSPLIT))
    torch.testing.assert_close(o, fo, atol=0, rtol=0)
    torch.testing.assert_close(l, fl, atol=0, rtol=0)


@interp
def test_kernel_topk_length_noncontiguous_q_and_sinks():
    case = make_case(T=4, H=6, topk=37, seed=4, sinks="mixed")
    base = torch.randn(4, 12, D_QK).to(torch.bfloat16)
    case["q"] = base[:, ::2]  # head stride 2 * 576
    tl_ = torch.tensor([37, 20, 5, 0], dtype=torch.int32)
    check(*run_kernel(case, topk_length=tl_, **UNSPLIT))
    check(*run_kernel(case, topk_length=tl_, **SPLIT))
    for sink in (float("inf"), float("-inf")):
        case["sinks"] = torch.full((6,), sink)
        o, l, ro, rl = run_kernel(case, **SPLIT)
        check(o, l, ro, rl)
        if sink > 0:
            assert (o == 0).all()


@interp
def test_kernel_empty_rows_and_ids_past_the_pool():
    case = make_case(T=3, H=4, topk=16, seed=5)
    case["indices"][0] = torch.tensor([-1, -7, 96, 97, 2 ** 31 - 1] + [-1] * 11, dtype=torch.int32)
    o, l, ro, rl = run_kernel(case, **SPLIT)
    check(o, l, ro, rl)
    for t in (0, 2):  # no valid id: out 0, lse -inf
        assert (o[t] == 0).all() and torch.isneginf(l[t]).all()


@interp
@pytest.mark.parametrize("bad_scale", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_a_nonfinite_scale_in_a_referenced_row_makes_the_token_nan(bad_scale, split):
    """An inf or NaN tile scale in a row some id references: the reference decodes that tile to inf / NaN
    (0 x inf = NaN), so the score is NaN and the token's out and lse are NaN on every head (README,
    non-finite scores), as the kernel gives them; the other tokens are untouched by it."""
    from mla_sink.core.reference import sparse_mla_decode_reference
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    case = make_case(T=4, H=3, topk=24, seed=13, sinks=None)
    cache, idx = case["kv_cache"], case["indices"].clone()
    row = int(idx[3, 5])
    idx[0][idx[0] == row] = -1  # token 0 never references the row
    cache[row, 512 + 4 * 2: 516 + 4 * 2] = torch.tensor([bad_scale], dtype=torch.float32).view(torch.uint8)
    kw = SPLIT if split else UNSPLIT
    o, l = sparse_mla_decode_triton(case["q"], cache, idx, None, SM_SCALE, **kw)
    ro, rl = sparse_mla_decode_reference(case["q"], cache, idx, None, SM_SCALE)
    hit = (idx == row).any(dim=1)
    assert torch.isnan(rl[hit]).all() and torch.isnan(l[hit]).all() and torch.isnan(o[hit]).all()
    assert not torch.isnan(l[~hit]).any()
    check(o[~hit], l[~hit], ro[~hit], rl[~hit])


@interp
def test_kernel_on_a_cache_written_byte_by_byte():
    """Hand-chosen float32 scales (not powers of two, tiny and huge) written with struct, e4m3 codes chosen
    by hand: the kernel decodes them as the dequantiser does (each scale exactly, as float32)."""
    g = torch.Generator().manual_seed(6)
    scales = [0.013, 3.7, 1e-30, 2.5e25]
    rows = []
    for r in range(24):
        codes = torch.randint(0, 256, (512,), generator=g)
        codes[(codes & 0x7F) == 0x7F] = 0x3C  # referenced rows hold finite codes (1.5)
        s = [scales[(r + i) % 4] * (1 + r / 64) for i in range(4)]
        rope = (torch.randn(64, generator=g) * 2).tolist()
        rows.append(write_row(codes.tolist(), s, rope))
    cache = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).reshape(24, ROW).clone()
    idx = torch.randint(0, 20, (3, 24), generator=g, dtype=torch.int32)
    idx[0, 5] = -1
    poison_unreferenced(cache, torch.arange(24) < 20)
    # q spans the tile scales: each 128-column block of q divided by its tile's typical scale
    q = torch.randn(3, 5, D_QK, generator=g)
    for i in range(4):
        q[..., 128 * i: 128 * (i + 1)] /= max(scales[i], 1e-3) * 64
    case = dict(q=q.to(torch.bfloat16), kv_cache=cache, indices=idx, sinks=torch.randn(5))
    o, l, ro, rl = run_kernel(case, sm_scale=0.05, **UNSPLIT)
    # out spans 1e-30 .. 1e25 column by column: compare each tile relative to its own magnitude
    for i in range(4):
        cols = slice(128 * i, 128 * (i + 1))
        mag = ro[..., cols].abs().amax().item()
        torch.testing.assert_close(o[..., cols].double() / mag, ro[..., cols] / mag, atol=8e-3, rtol=8e-3)
    torch.testing.assert_close(l, rl, atol=LSE_TOL[0], rtol=LSE_TOL[1])


@interp
def test_scale_is_read_as_float32_exactly():
    """Each tile scale is read as the float32 it is (FlashMLA's sm90 kernel rounds it to bf16): a scale
    of 1 + 2^-20 (no bf16 value) with q picking one column gives the score 448 * (1 + 2^-20), not 448: the
    kernel multiplies each tile's exact e4m3 products by the scale in fp32 (the GPU as the interpreter)."""
    s = 1.0 + 2.0 ** -20
    row = write_row([0x7E] * 512, [s, s, s, s], [0.0] * 64)  # 0x7E = 448
    cache = torch.frombuffer(bytearray(row * 2), dtype=torch.uint8).reshape(2, ROW).clone()
    q = torch.zeros(1, 1, D_QK, dtype=torch.float16)
    q[0, 0, 0] = 1.0
    idx = torch.tensor([[0]], dtype=torch.int32)
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    _, lse = sparse_mla_decode_triton(q, cache, idx, sm_scale=1.0, config=_cfg(), num_kv_splits=1)
    exact = 448 * s  # lse of one id = its score
    assert abs(lse.item() - exact) <= exact * 2.0 ** -23
    assert lse.item() != 448.0  # what a bf16-rounded scale would give


@interp
@pytest.mark.parametrize("q_exp", [100, 120], ids=["inside", "past"])
def test_a_tile_product_past_fp32_overflows_before_its_scale(q_exp):
    """README, numeric limits ("V3.2 tile products"): each tile's ``q . codes`` is formed in fp32 before its scale
    multiplies it. One tile of codes 448 against q = 2^q_exp with a tile scale of 2^-126 (the score 448 * 128 *
    2^(q_exp - 126) is 896 at 2^120): at 2^100 the fp32 product (7e34) fits and the kernel gives the reference's
    lse; at 2^120 it is past fp32's largest (7.6e40), so the token is NaN where the reference is finite - the
    documented limit (break test of the forty-fifth session), not silent garbage."""
    row = write_row([0x7E] * 128 + [0] * 384, [2.0 ** -126, 1.0, 1.0, 1.0], [0.0] * 64)  # 0x7E = 448
    cache = torch.frombuffer(bytearray(row), dtype=torch.uint8).reshape(1, ROW).clone()
    q = torch.zeros(1, 1, D_QK, dtype=torch.bfloat16)
    q[0, 0, :128] = 2.0 ** q_exp
    idx = torch.zeros(1, 1, dtype=torch.int32)
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    _, lse = sparse_mla_decode_triton(q, cache, idx, sm_scale=SM_SCALE, config=_cfg(), num_kv_splits=1)
    _, ref = mla_sink.sparse_mla_decode_reference(q, cache, idx, sm_scale=SM_SCALE)
    assert torch.isfinite(ref).all()
    if q_exp == 100:
        torch.testing.assert_close(lse.double(), ref.double(), atol=LSE_TOL[0], rtol=LSE_TOL[1])
    else:
        assert torch.isnan(lse).all()


@interp
@pytest.mark.parametrize("ratio", [1e6, 1e8])
def test_fp16_weights_keep_small_scale_rows_beside_a_huge_one(ratio, monkeypatch):
    """With fp16 q the portable kernel rounds ``P * scale`` to fp16 for ``P V`` (kmath.ds_mla_pv). One row of the
    block has latent values ``ratio`` times the others' (so a scale ``ratio`` times theirs) and a score far below
    theirs (weight about 0): normalising by the block's largest scale sent every other row's weight below fp16's
    range (error 7.8e-3 at 1e6, 0.75 at 1e8); per head, by its largest ``|P * scale|``, they keep fp16's precision.
    The interpreter runs fp16 exactly once its fp32 upcast (``UPCAST``, which the bf16 tiles need on the CPU) is off,
    as the GPU computes."""
    from mla_sink.paths.triton import launch

    init = launch.InterpretedLaunch.__init__

    def gpu_rounding(self, name, grid, constexprs, dynamic, static):
        init(self, name, grid, dict(constexprs, UPCAST=False) if name == "portable" else constexprs, dynamic, static)

    monkeypatch.setattr(launch.InterpretedLaunch, "__init__", gpu_rounding)
    gen = torch.Generator().manual_seed(11)
    H, N = 16, 64
    kv = torch.randn(N, D_QK, generator=gen) * 0.5
    q1 = torch.randn(D_QK, generator=gen) * 0.5
    kv[0, :512] = -q1[:512].sign() * 0.5 * ratio  # huge values, a score far below the others'
    cache = quantize_kv_cache(kv, scale="amax")
    q = q1.expand(1, H, D_QK).to(torch.float16)
    idx = torch.arange(N, dtype=torch.int32)[None]
    o, _ = launch.sparse_mla_decode_triton(q, cache, idx, config=_cfg(block_n=64), num_kv_splits=1)
    ro, _ = mla_sink.sparse_mla_decode_reference(q, cache, idx)
    assert (o.double() - ro).abs().max() <= 2e-3 * ro.abs().max()


@interp
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_subnormal_tile_scales_give_finite_tiny_outputs(q_dtype):
    """Tile scales written as float32 subnormals (the quantiser never writes them; a writer may), so that a head's
    largest ``|P * scale|`` in a block is subnormal: its reciprocal would overflow and ``inf * 0`` give NaN
    (kmath.ds_mla_pv keeps the divisor at least fp32's smallest normal). The output is the reference's, tiny and
    finite."""
    gen = torch.Generator().manual_seed(5)
    N, H = 64, 4
    kv = torch.randn(N, D_QK, generator=gen)
    cache = quantize_kv_cache(kv, scale="amax")
    scales = cache[:, 512:528].view(torch.float32)  # the rows' bytes, in place
    scales.fill_(2.0 ** -130)  # a subnormal float32; the values (codes x scale) stay bf16 normals
    q = torch.randn(2, H, D_QK, generator=gen).to(q_dtype)
    idx = torch.randint(0, N, (2, 48), generator=gen, dtype=torch.int32)
    from mla_sink.paths.triton.launch import sparse_mla_decode_triton

    o, _ = sparse_mla_decode_triton(q, cache, idx, config=_cfg(), num_kv_splits=1)
    ro, _ = mla_sink.sparse_mla_decode_reference(q, cache, idx)
    assert torch.isfinite(o).all()
    # fp16 holds none of these outputs (all round to 0); bf16 holds them
    tiny = torch.finfo(q_dtype).smallest_normal * torch.finfo(q_dtype).eps
    assert (o.double() - ro).abs().max() <= 1e-2 * ro.abs().max() + tiny



# ---- plans: bf16 q on gluon_fp8 at H <= 32, else on the seesaw at 64-head blocks (the portable kernel
# recomputes what it flags) ----

@pytest.mark.parametrize("H", [1, 16, 17, 32, 33, 64, 128])
@pytest.mark.parametrize("T", [1, 2, 3, 64, 256])
def test_sm90_plans(H, T):
    from mla_sink.paths.triton.plan import plan_triton_launch

    for q in ("bf16", "fp16"):
        launch = plan_triton_launch(arch="sm90", q_dtype=q, kv_dtype="fp8_ds_mla", num_heads=H, num_tokens=T,
                                    topk=2048, logit_cap=0.0, gluon=True, num_sms=132)
        if q == "bf16" and H <= 16:
            # few heads, split or not: gluon_fp8, every tile scale applied exactly
            assert launch.kernel == "gluon_fp8" and launch.kernel_row == "sm90_ds_mla_gluon", launch
            # the split policy of bf16 q's own row (splits down to one 64-id block)
            # one or two tokens: splits down to one 64-id block; from three, sm90_ds_mla_h16's 128-id floor
            assert launch.tuning_row == ("sm90_ds_mla_h16_bf16_two_tokens" if T <= 2 else "sm90_ds_mla_h16")
        elif q == "bf16" and H <= 32:  # gluon_fp8's 32-head blocks on the column-split consumers, split or not
            assert launch.kernel == "gluon_fp8" and launch.kernel_row == "sm90_ds_mla_gluon_h32", launch
            # one token: splits down to one 64-id block; from two, the 128-id floor (thirty-first session)
            assert launch.tuning_row == "sm90_ds_mla_h32_bf16" + ("_one_token" if T <= 1 else "")
        elif q == "bf16":  # more heads, split or not: 64-head blocks
            # the seesaw decodes into bf16: exact for power-of-two scales, and it flags tokens with others
            assert launch.kernel == "gluon_seesaw" and launch.kernel_row == "sm90_ds_mla_gluon_seesaw", launch
            # the tiles and split policy of the recompute: the portable row of the head count
            assert launch.tuning_row == "sm90_ds_mla"
        else:  # fp16 tiles cannot hold e4m3 x 2^k exactly for FlashMLA's scales
            assert launch.kernel == "portable", launch  # the rows measured for the portable kernel
            assert launch.tuning_row == ("sm90_ds_mla_h16" if H <= 16 else "sm90_ds_mla_h32" if H <= 32
                                         else "sm90_ds_mla"), launch
        assert launch.fp8_f16 is False  # the split policy and the tiles of the gated recompute
        assert launch.num_kv_splits >= 1
        no_gluon = plan_triton_launch(arch="sm90", q_dtype=q, kv_dtype="fp8_ds_mla", num_heads=H, num_tokens=T,
                                      topk=2048, logit_cap=0.0, gluon=False, num_sms=132)
        assert no_gluon.kernel == "portable"
    capped = plan_triton_launch(arch="sm90", q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=H, num_tokens=T,
                                topk=2048, logit_cap=30.0, gluon=True, num_sms=132)
    assert capped.kernel == "portable"  # no soft cap in the Gluon kernels


@pytest.mark.parametrize("H,T,q,splits,ids", [
    (16, 2, "bf16", 32, 64),  # sm90_ds_mla_h16_bf16_two_tokens: one 64-id Gluon block a split (14.3 us against 15.8 at 16)
    (16, 2, "fp16", 16, 128),  # the portable kernel keeps its measured 128-id floor
    (32, 64, "bf16", 2, 1024),  # sm90_ds_mla_h32_bf16: two splits (on the seesaw 67.3 us against 75.7 at 3)
    (32, 1, "bf16", 32, 64),  # sm90_ds_mla_h32_bf16_one_token: one 64-id block a split, two 16-head CTAs each
    # T=2: 16 two-block splits of two 16-head CTAs each (thirty-first session: 12.6-12.7 us against 13.5 in 32)
    (32, 2, "bf16", 16, 128),
    # from T=3 128-id splits again (twenty-seventh session: H=32 T=4 16.1 us against 19.1 in 64-id splits)
    (32, 3, "bf16", 16, 128),
    (32, 4, "bf16", 16, 128),
    (16, 4, "bf16", 16, 128),
    (16, 1, "bf16", 32, 64),
])
def test_sm90_ds_mla_split_counts(H, T, q, splits, ids):
    """The split counts the H200 A/Bs of the fourteenth and sixteenth sessions chose (tables/triton_tuning.yaml)."""
    from mla_sink.paths.triton.plan import plan_triton_launch

    launch = plan_triton_launch(arch="sm90", q_dtype=q, kv_dtype="fp8_ds_mla", num_heads=H, num_tokens=T,
                                topk=2048, logit_cap=0.0, gluon=True, num_sms=132)
    assert (launch.num_kv_splits, launch.ids_per_split) == (splits, ids), launch


@pytest.mark.parametrize("arch", ["cpu", "gfx942", "gfx950", "sm100", "sm89"])
def test_other_archs_plan_the_portable_kernel(arch):
    from mla_sink.paths.triton.plan import plan_triton_launch

    launch = plan_triton_launch(arch=arch, q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=64, num_tokens=4,
                                topk=2048, logit_cap=0.0, gluon=True, num_sms=80)
    assert launch.kernel == "portable"

# ---- every entry point ---------------------------------------------------------------------------

def small(T=3, H=5, topk=24, N=64, seed=7, **kw):
    return make_case(T=T, H=H, topk=topk, N=N, seed=seed, **kw)


def ref_of(case, **kw):
    from mla_sink.core.reference import sparse_mla_decode_reference

    return sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"], **kw)


def close(out, lse, r_out, r_lse):
    atol, rtol = OUT_TOL[out.dtype]
    torch.testing.assert_close(out.double(), r_out, atol=atol, rtol=rtol)
    if lse is not None:
        torch.testing.assert_close(lse, r_lse, atol=LSE_TOL[0], rtol=LSE_TOL[1])


@pytest.mark.parametrize("platform", [pytest.param(mla_sink.Platform("cpu"), marks=interp),
                                      mla_sink.Platform("cpu", triton=False)], ids=["triton", "reference"])
@pytest.mark.parametrize("paged", [False, True], ids=["flat", "paged"])
def test_function_and_layer(platform, paged):
    case = small(block_size=8 if paged else None)
    out, lse = mla_sink.sparse_mla_decode(case["q"], case["kv_cache"], case["indices"], case["sinks"],
                                          sm_scale=SM_SCALE, platform=platform)
    close(out, lse, *ref_of(case, sm_scale=SM_SCALE))
    layer = mla_sink.SparseMLADecode(num_heads=5, q_dtype="bf16", kv_dtype="fp8_ds_mla", topk=24, sinks=case["sinks"],
                                     sm_scale=SM_SCALE, platform=platform)
    assert layer.spec.kv_dtype == "fp8_ds_mla" and layer.plan.path == ("triton" if platform.triton else "reference")
    out2, lse2 = layer(case["q"], case["kv_cache"], case["indices"])
    close(out2, lse2, *ref_of(case, sm_scale=SM_SCALE))
    buf = torch.full_like(out, float("nan"))
    out3, _ = layer(case["q"], case["kv_cache"], case["indices"], out=buf)
    assert out3.data_ptr() == buf.data_ptr() and torch.equal(out3, out2)


@interp
def test_run_and_describe():
    case = small(q_dtype=torch.float16)
    spec, platform = mla_sink.describe(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    assert (spec.q_dtype, spec.kv_dtype) == ("fp16", "fp8_ds_mla") and str(spec).startswith("fp16+kv_fp8_ds_mla")
    x = mla_sink.DecodeInputs(case["q"], case["kv_cache"], case["indices"], SM_SCALE, sinks=case["sinks"])
    assert x.num_kv_rows == 64
    out, lse = mla_sink.run(spec, x)
    close(out, lse, *ref_of(case, sm_scale=SM_SCALE))
    paged = small(q_dtype=torch.float16, block_size=16)
    xp = x._replace(kv_cache=paged["kv_cache"])
    assert xp.num_kv_rows == 64
    out_p, lse_p = mla_sink.run(spec, {"q": x.q, "kv_cache": paged["kv_cache"], "indices": x.indices,
                                       "sinks": x.sinks, "sm_scale": SM_SCALE})
    torch.testing.assert_close(out_p, out, atol=0, rtol=0)  # the same rows, paged
    wrong = mla_sink.CallSpec(q_dtype="fp16", kv_dtype="fp8_e4m3", num_heads=5, topk=24, sinks=True)
    with pytest.raises(ValueError, match="'kv_cache' gives kv_dtype='fp8_ds_mla' but spec.kv_dtype='fp8_e4m3'"):
        mla_sink.run(wrong, x)
    # the other way round, without a kv_scale: the cache's dtype is named, not the missing kv_scale
    e4m3 = torch.zeros(64, 576, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'kv_cache' gives kv_dtype='fp8_e4m3' but spec.kv_dtype='fp8_ds_mla'"):
        mla_sink.run(spec, x._replace(kv_cache=e4m3))


def _op_args(case, path):
    return (case["q"], case["kv_cache"], case["indices"], case["sinks"], SM_SCALE, None, None, None, True, 0.0, path)


@pytest.mark.parametrize("path", ["reference", pytest.param("triton", marks=interp)])
def test_operators_and_opcheck(path):
    case = small(T=2, H=3, topk=8, N=32)
    out, lse = torch.ops.mla_sink.sparse_mla_decode(*_op_args(case, path))
    close(out, lse, *ref_of(case, sm_scale=SM_SCALE))
    torch.library.opcheck(torch.ops.mla_sink.sparse_mla_decode.default, _op_args(case, path))
    buf = torch.empty(2, 3, D_V, dtype=torch.bfloat16)
    a = _op_args(case, path)
    torch.library.opcheck(torch.ops.mla_sink.sparse_mla_decode_out.default, (*a[:8], buf, *a[8:]))
    paged = small(T=2, H=3, topk=8, N=32, block_size=8)
    torch.library.opcheck(torch.ops.mla_sink.sparse_mla_decode.default, _op_args(paged, path))


def test_meta_shapes_and_compile_fullgraph():
    case = small(T=2, H=3, topk=8, N=32)
    q, kv, idx, s = case["q"], case["kv_cache"], case["indices"], case["sinks"]
    m_out, m_lse = mla_sink.sparse_mla_decode(q.to("meta"), kv.to("meta"), idx.to("meta"), s.to("meta"))
    assert m_out.device.type == "meta" and m_out.shape == (2, 3, D_V) and m_lse.shape == (2, 3)
    spec = mla_sink.CallSpec(q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=3, topk=8, sinks=True)

    def step(q, kv, idx, s):
        out, lse = mla_sink.run(spec, mla_sink.DecodeInputs(q, kv, idx, SM_SCALE, sinks=s), path="reference")
        return out.float() * 2, lse

    out, lse = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kv, idx, s)
    e_out, e_lse = step(q, kv, idx, s)
    torch.testing.assert_close(out, e_out)
    torch.testing.assert_close(lse, e_lse)
    bad = torch.compile(lambda q, kv, i: mla_sink.sparse_mla_decode(q, kv, i, kv_scale=torch.ones(1)),
                        fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="'kv_scale' must be None with a fp8_ds_mla kv_cache"):
        bad(q, kv, idx)


def test_misaligned_view_is_refused_while_tracing():
    """A view at a byte offset that is not a multiple of 4 is refused on meta tensors and while torch.compile
    traces (the view's storage offset), as a bad row stride is, not first at run time (break test, fifteenth
    session)."""
    case = small(T=2, H=3, topk=8, N=32)
    q, kv, idx = case["q"], case["kv_cache"], case["indices"]
    meta = torch.zeros(32 * ROW + 4, dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match=r"must start at a multiple of 4 bytes: .* \(got a view at byte offset 2 of "
                                         r"its storage\)"):
        mla_sink.sparse_mla_decode(q.to("meta"), meta[2:2 + 32 * ROW].view(32, ROW), idx.to("meta"))
    ok, _ = mla_sink.sparse_mla_decode(q.to("meta"), meta[4:4 + 32 * ROW].view(32, ROW), idx.to("meta"))
    assert ok.shape == (2, 3, D_V)
    pool = torch.zeros(32 * ROW + 4, dtype=torch.uint8)
    pool[2:2 + 32 * ROW] = kv.reshape(-1)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, kv, i: mla_sink.sparse_mla_decode(q, kv, i, path="reference"), fullgraph=True,
                       backend="aot_eager")
    with pytest.raises(Exception, match="byte offset 2 of its storage"):
        fn(q, pool[2:2 + 32 * ROW].view(32, ROW), idx)


def test_reference_decodes_only_the_gathered_rows(monkeypatch):
    """The reference dequantises the rows it gathers, never the whole pool (a pool beyond 2^31 bytes)."""
    seen = []
    real = kv_layout.dequantize_kv_cache

    def spy(cache, layout="fp8_ds_mla"):
        seen.append(cache.shape[0])
        return real(cache, layout)

    monkeypatch.setattr(kv_layout, "dequantize_kv_cache", spy)
    case = small(T=2, H=3, topk=8, N=64)
    ref_of(case)
    assert seen and max(seen) <= 2 * 8


# ---- validation ----------------------------------------------------------------------------------

def _good():
    case = small(T=2, H=4, topk=8, N=32)
    return dict(q=case["q"], kv_cache=case["kv_cache"], indices=case["indices"])


def _uint8_pool(rows, row_bytes, offset=0):
    return torch.zeros(rows * row_bytes + offset, dtype=torch.uint8)[offset:].view(rows, row_bytes)


BAD = [
    # (what, mutation of the good call, message)
    ("wrong last dim", lambda x: x.update(kv_cache=torch.zeros(32, 576, dtype=torch.uint8)),
     r"'kv_cache' of dtype torch.uint8 must have a last dimension of 656 \(fp8_ds_mla\) bytes \(got shape \(32, 576\)\)"),
    ("wrong last dim paged", lambda x: x.update(kv_cache=torch.zeros(4, 8, 657, dtype=torch.uint8)),
     r"last dimension of 656"),
    ("row bytes not contiguous", lambda x: x.update(kv_cache=torch.zeros(32, 2 * ROW, dtype=torch.uint8)[:, ::2]),
     r"'kv_cache' \(fp8_ds_mla\) must have the 656 bytes of a row contiguous \(stride\(-1\) == 1; got strides \(1312, 2\)\)"),
    ("rows of a block not contiguous", lambda x: x.update(kv_cache=torch.zeros(4, 8, 660, dtype=torch.uint8)[..., :ROW]),
     r"must have the rows of a block contiguous \(stride\(1\) == 656; got strides \(5280, 660, 1\)\)"),
    ("bad block stride", lambda x: x.update(kv_cache=torch.zeros(4 * (8 * ROW + 2), dtype=torch.uint8).as_strided(
        (4, 8, ROW), (8 * ROW + 2, ROW, 1))),
     r"must have a block stride that is a multiple of 4 bytes \(its float32 scales are read in place; got strides \(5250, 656, 1\)\)"),
    ("bad row stride", lambda x: x.update(kv_cache=_uint8_pool(32, ROW + 2)[:, :ROW]),
     r"must have a row stride that is a multiple of 4 bytes"),
    ("misaligned pointer", lambda x: x.update(kv_cache=_uint8_pool(32, ROW, offset=2)),
     r"'kv_cache' \(fp8_ds_mla\) must start at a multiple of 4 bytes"),
    ("empty pool", lambda x: x.update(kv_cache=torch.zeros(0, 8, ROW, dtype=torch.uint8)), r"must hold N >= 1 rows"),
    ("4-d", lambda x: x.update(kv_cache=torch.zeros(2, 2, 8, ROW, dtype=torch.uint8)),
     r"must be uint8 \[N, 656\] or \[num_blocks, block_size, 656\] \(got shape \(2, 2, 8, 656\)\)$"),
    ("FlashMLA's 4-d k_cache", lambda x: x.update(kv_cache=torch.zeros(2, 8, 1, ROW, dtype=torch.uint8)),
     r"\(got shape \(2, 8, 1, 656\)\); a \[num_blocks, block_size, 1, 656\] cache of one KV head \(FlashMLA's "
     r"k_cache\) is passed as kv_cache.squeeze\(2\)"),
    ("kv_scale given", lambda x: x.update(kv_scale=torch.ones(1)),
     r"'kv_scale' must be None with a fp8_ds_mla kv_cache: its scales are in the rows"),
    ("656-byte rows of another dtype", lambda x: x.update(kv_cache=torch.zeros(32, ROW, dtype=torch.float8_e4m3fn)),
     r"656-byte rows are the fp8_ds_mla layout: pass them as torch.uint8"),
    ("fp8 q", lambda x: x.update(q=x["q"].to(torch.float8_e4m3fn), q_scale=torch.ones(1)),
     r"\(q dtype, kv_cache dtype\) must be one of .* \(got \('fp8_e4m3', 'fp8_ds_mla'\)\); a fp8_ds_mla kv_cache takes "
     r"q in \['bf16', 'fp16'\] only"),
]


@pytest.mark.parametrize("mutate,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validation_errors(mutate, message):
    x = _good()
    mutate(x)
    with pytest.raises(ValueError, match=message):
        mla_sink.sparse_mla_decode(**x)
    with pytest.raises(ValueError, match=message):  # the operator (real and fake) checks the same
        torch.ops.mla_sink.sparse_mla_decode(x["q"], x["kv_cache"], x["indices"], None, SM_SCALE, None,
                                             x.get("q_scale"), x.get("kv_scale"), False, 0.0, "")


@pytest.mark.parametrize("path", [pytest.param(None, marks=interp), "reference"])
def test_misaligned_pointer_is_refused_on_a_prepared_call(path):
    """The pointer's alignment is no part of a call's signature: a later call with the same shapes and strides
    but a misaligned view is refused by the runner, before the kernel (the reference runner too: it read the
    shifted scales as NaN when an aligned call had prepared it, a break test, forty-fourth session)."""
    x = _good()
    pool = torch.zeros(32 * ROW + 4, dtype=torch.uint8)
    aligned = pool[:32 * ROW].view(32, ROW)
    aligned.copy_(x["kv_cache"])
    mla_sink.sparse_mla_decode(x["q"], aligned, x["indices"], platform=mla_sink.Platform("cpu"), path=path)
    shifted = pool[2:2 + 32 * ROW].view(32, ROW)
    assert shifted.stride() == aligned.stride()
    from mla_sink.core.validate import check_ds_mla_pointer

    with pytest.raises(ValueError, match="must start at a multiple of 4 bytes"):
        check_ds_mla_pointer(shifted)
    from mla_sink.api import execute
    from mla_sink.core.inputs import DecodeInputs

    with pytest.raises(ValueError, match="must start at a multiple of 4 bytes"):
        execute(DecodeInputs(x["q"], shifted, x["indices"], SM_SCALE), spec=None, need_lse=False,
                platform=mla_sink.Platform("cpu"), path=path)


def test_layer_and_records_name_the_layout():
    with pytest.raises(ValueError, match=r"'kv_dtype' must be in \(.*'fp8_ds_mla'\) or the torch dtype of one"):
        mla_sink.SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype=torch.uint8, topk=8,
                                 platform=mla_sink.Platform("cpu"))
    with pytest.raises(ValueError, match="fp8_ds_mla kv_cache takes q in"):
        mla_sink.SparseMLADecode(num_heads=4, q_dtype="fp8_e4m3", kv_dtype="fp8_ds_mla", topk=8,
                                 platform=mla_sink.Platform("cpu"))


# ---- CLI -----------------------------------------------------------------------------------------

def test_cli_explain_info_and_demo(capsys):
    from mla_sink.tools.cli import main

    assert main(["explain", "--arch", "sm90", "--kv-dtype", "fp8_ds_mla", "--heads", "128", "--sinks",
                 "--tokens", "256", "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "bf16+kv_fp8_ds_mla-h128-sm90-sinks-dcp1"
    assert "→ triton   (row triton_portable)" in out and "kernel gluon_seesaw" in out and "row sm90_ds_mla " in out
    assert "kernel: row sm90_ds_mla_gluon_seesaw" in out and "recomputes exactly the flagged programs" in out
    assert "recompute: a second gluon_seesaw launch of the same grid" in out
    assert "programmatic dependent" not in out  # T=256: one split, launched plainly
    assert "kv_dtype=fp8_ds_mla, needs" in out
    assert main(["explain", "--arch", "sm90", "--kv-dtype", "fp8_ds_mla", "--heads", "128", "--sinks",
                 "--tokens", "2", "--sms", "132"]) == 0
    recompute = [ln for ln in capsys.readouterr().out.splitlines() if "recompute:" in ln]
    assert len(recompute) == 1 and recompute[0].endswith("launched as a programmatic dependent of the first (split "
                                                         "launch)")
    assert main(["explain", "--arch", "gfx950", "--aiter", "0.1.20", "--kv-dtype", "fp8_ds_mla", "--heads", "64",
                 "--sinks", "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == "triton"
    assert main(["explain", "--arch", "sm80", "--kv-dtype", "fp8_ds_mla"]) == 2
    assert "sm89" in capsys.readouterr().out
    assert main(["explain", "--q-dtype", "fp8_e4m3", "--kv-dtype", "fp8_ds_mla"]) == 2
    assert "fp8_ds_mla kv_cache takes q in" in capsys.readouterr().err
    assert main(["explain", "--matrix", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gfx950-aiter0.1.20-triton"]["bf16/fp8_ds_mla"]["h64+s"] == "triton"
    assert main(["info"]) == 0
    assert "fp8_ds_mla" in capsys.readouterr().out
    assert main(["demo", "--device", "cpu", "--kv-dtype", "fp8_ds_mla", "--tokens", "2", "--topk", "32",
                 "--pool", "64"]) == 0
    out = capsys.readouterr().out
    assert "bf16+kv_fp8_ds_mla" in out and "NaN in out: False" in out


# ---- DCP: shards of a 656-byte pool over 2 gloo processes ----------------------------------------

DCP_W = 2
DCP_N = 61  # prime: the shards differ in size


def _dcp_case():
    case = make_case(T=4, H=5, topk=24, N=DCP_N, seed=11, scale="amax")
    return case


def _dcp_worker(rank: int, store_path: str, out_dir: str) -> None:
    import os
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, DCP_W), rank=rank, world_size=DCP_W,
                                timeout=timedelta(seconds=60))
        from mla_sink.core.dcp import shard_kv_cache

        case = _dcp_case()
        spec = mla_sink.CallSpec(q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=5, topk=24, sinks=True,
                                 dcp_world_size=DCP_W)
        res = {}
        for layout in ("interleaved", "contiguous"):
            shard = shard_kv_cache(case["kv_cache"], DCP_W, rank, layout, copy=True)
            assert shard.shape[1] == ROW and shard.dtype == torch.uint8
            for path in ("triton", "reference"):
                x = {"q": case["q"], "kv_cache": shard, "indices": case["indices"], "sinks": case["sinks"],
                     "sm_scale": SM_SCALE}
                res[(layout, path)] = mla_sink.run(spec, x, path=path, dcp_group=dist.group.WORLD, dcp_layout=layout,
                                                   num_kv_rows=DCP_N)
            layer = mla_sink.SparseMLADecode(num_heads=5, q_dtype="bf16", kv_dtype="fp8_ds_mla", topk=24,
                                             sinks=case["sinks"], sm_scale=SM_SCALE, dcp_world_size=DCP_W,
                                             dcp_group=dist.group.WORLD, dcp_layout=layout, num_kv_rows=DCP_N)
            res[(layout, "layer")] = layer(case["q"], shard, case["indices"])
        dist.barrier()
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise


@interp
def test_dcp_two_ranks_match_the_full_pool_reference(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dcp_worker, args=(r, str(tmp_path / "store"), str(tmp_path))) for r in range(DCP_W)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join(5)
    errs = [(tmp_path / f"rank{r}.err").read_text() for r in range(DCP_W) if (tmp_path / f"rank{r}.err").exists()]
    assert not hung and not errs and all(p.exitcode == 0 for p in procs), "\n".join(errs)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(DCP_W)]
    case = _dcp_case()
    r_out, r_lse = ref_of(case, sm_scale=SM_SCALE)
    for key, (out, lse) in ranks[0].items():
        for other in ranks[1:]:  # every rank returns the same result
            assert torch.equal(other[key][0], out) and torch.equal(other[key][1], lse), key
        assert out.dtype == torch.bfloat16 and not out.isnan().any(), key
        close(out, lse, r_out, r_lse)
        assert (out[2] == 0).all() and torch.isneginf(lse[2]).all()  # the empty row


def test_quantizer_refuses_values_the_layout_cannot_hold_and_meta_tensors():
    """Finite input whose decoded value would overflow (bf16 RoPE beyond 3.39e38) is refused, not written as
    inf; a latent value near the float32 maximum, whose nearest code times its power-of-two scale would overflow
    (3.3e38 / 2^120 rounds to the code 256), takes the next code toward zero (240: within an e4m3 step, 1/16),
    under both conventions (a fresh user's break test, twenty-fifth session: pow2 refused what amax held); meta
    tensors (no values to derive scales from, nothing to decode) are refused with the argument's name."""
    import mla_sink

    kv = torch.zeros(2, 576)
    kv[1, 512 + 10] = 3.4e38  # a RoPE column
    with pytest.raises(ValueError, match="'kv' holds values too large for the fp8_ds_mla layout"):
        mla_sink.quantize_kv_cache(kv, layout="fp8_ds_mla", scale="pow2")
    fmax = torch.finfo(torch.float32).max
    for value in (3.3e38, 3.4e38, -fmax, fmax):
        for scale in ("pow2", "amax"):
            kv = torch.zeros(2, 576)
            kv[1, 200] = value
            kv[1, 201] = value / 2
            back = mla_sink.dequantize_kv_cache(mla_sink.quantize_kv_cache(kv, layout="fp8_ds_mla", scale=scale))
            # finite in float32, where the kernels decode (the code 256 times 2^120 is 2^128: finite in float64,
            # inf in float32; a mutation audit, forty-seventh session, found the float64 check could not fail)
            assert torch.isfinite(back.float()).all(), (value, scale)
            for col, x in ((200, value), (201, value / 2)):
                got = float(back[1, col])
                assert got * x > 0 and abs(got - x) <= abs(x) / 16 * (1 + 1e-6), (value, scale, col, got)
    big = torch.full((2, 576), 1e38)  # large but representable: decodes finite, within e4m3 rounding
    back = mla_sink.dequantize_kv_cache(mla_sink.quantize_kv_cache(big, layout="fp8_ds_mla"))
    assert torch.isfinite(back).all() and ((back - 1e38).abs() <= 1e38 / 16).all()
    with pytest.raises(ValueError, match="'kv' must hold data"):
        mla_sink.quantize_kv_cache(torch.empty(4, 576, device="meta", dtype=torch.bfloat16))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:  # a FakeTensor has no values either (its isfinite check raised inside torch)
        fake = mode.from_tensor(torch.randn(4, 576, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="'kv' must hold data \\(got a FakeTensor\\)"):
            mla_sink.quantize_kv_cache(fake)
    # the dequantiser has no value to find: a cache without data gives one of the output's shape (a meta cache was
    # refused while a FakeTensor was decoded: a break test, forty-third session)
    shape_only = mla_sink.dequantize_kv_cache(torch.empty(4, 656, device="meta", dtype=torch.uint8))
    assert (shape_only.device.type, shape_only.shape, shape_only.dtype) == ("meta", (4, 576), torch.float64)


@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "fp8_e4m3"])
def test_forcing_the_triton_path_keeps_the_fp8_refusal_below_sm89(kv_dtype, capsys):
    """Ampere has no fp8 conversions Triton can use (tables/mla_decode.yaml row fp8_needs_sm89, which binds the
    triton path): forcing ``path="triton"`` is refused as the unforced call is, by the plan, the layer's
    constructor and the CLI; forcing the float64 reference is not (found by a fresh user's break test)."""
    from mla_sink import NoKernelError, Platform, SparseMLADecode, plan_call
    from mla_sink.tools.cli import main

    spec = CallSpec(q_dtype="bf16", kv_dtype=kv_dtype, num_heads=16, topk=2048)
    sm80 = Platform("sm80", num_sms=108)
    for path in (None, "triton"):
        with pytest.raises(NoKernelError, match="sm89"):
            plan_call(spec, sm80, path=path)
    with pytest.raises(NoKernelError, match="sm89"):
        SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype=kv_dtype, topk=2048, platform=sm80, path="triton")
    assert plan_call(spec, sm80, path="reference").path == "reference"
    assert main(["explain", "--arch", "sm80", "--kv-dtype", kv_dtype, "--path", "triton"]) == 2
    assert "refused: fp8 KV needs sm89" in capsys.readouterr().out


def test_messages_name_the_v32_rows_where_they_apply():
    """The DCP shard of a paged V3.2 pool names the 656-byte rows and how to shard a paged pool; the layer's q_dtype
    error does not mention uint8 layouts (those name a kv_dtype only); a misaligned pool's message does not call an
    offset of 2 odd (break test, twenty-fourth session)."""
    from mla_sink.core.dcp import shard_kv_cache
    from mla_sink.core.validate import check_ds_mla_pointer

    paged = torch.zeros(2, 64, ROW, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"uint8 \[N, 656\].*reshape\(-1, 656\)"):
        shard_kv_cache(paged, 2, 0, "interleaved")
    with pytest.raises(ValueError, match="'q_dtype' must be in \\('bf16'") as e:
        mla_sink.SparseMLADecode(num_heads=16, q_dtype=torch.float32, kv_dtype="fp8_ds_mla", topk=64)
    assert "uint8" not in str(e.value)
    pool = torch.zeros(8 * ROW + 2, dtype=torch.uint8)[2:].view(8, ROW)
    with pytest.raises(ValueError, match="modulo 4") as e:
        check_ds_mla_pointer(pool)
    assert "odd" not in str(e.value)


@pytest.mark.parametrize("arch", ["sm30", "sm35", "sm37", "sm50", "sm61", "sm62", "sm70", "sm72", "sm75", "sm81", "sm86",
                                  "sm87", "sm88", "sm88a"])
def test_every_nvidia_arch_below_sm89_refuses_fp8_kv(arch):
    """Every NVIDIA compute capability below 8.9 is refused fp8 KV (row fp8_needs_sm89), Jetson's 7.2 included: the
    row once listed only sm70 / 75 / 80 / 86 / 87, and an sm72 call reached the portable kernel, whose fp8e4nv tiles
    Triton does not compile there (twenty-fourth session's audit), and Kepler's were missing until a second break
    test (twenty-fifth session); since the thirty-seventh session's break test (sm88, which one source lists as a
    CUDA 13 target, and made-up ones such as sm81 were served) the row compares the compute capability as a number
    (``Platform.cuda_arch``); sm89 and newer are served."""
    from mla_sink import NoKernelError, Platform, plan_call

    for kv_dtype in ("fp8_e4m3", "fp8_ds_mla"):
        spec = CallSpec(q_dtype="bf16", kv_dtype=kv_dtype, num_heads=16, topk=2048)
        with pytest.raises(NoKernelError, match="sm89"):
            plan_call(spec, Platform(arch, num_sms=8))
        for served in ("sm89", "sm90a", "sm100", "sm120"):
            assert plan_call(spec, Platform(served, num_sms=8)).path == "triton"


def test_sparse_and_nested_tensors_are_refused_by_the_quantiser_the_decoder_and_the_reference():
    """A sparse (COO, CSR) or nested ``kv``, ``kv_cache``, ``q``, ``indices``, ``sinks`` or ``topk_length`` gets the
    library's ``ValueError`` naming the argument and the layout, as the decode's entry points give it, not the error
    of the first torch op that does not take it (thirty-ninth session's break test)."""
    import mla_sink
    from mla_sink.core.reference import sparse_mla_decode_reference as reference

    x = torch.randn(8, 576)
    cache = mla_sink.quantize_kv_cache(x)
    for bad in (x.to_sparse(), x.to_sparse_csr(), torch.nested.nested_tensor([x[:3], x[:5]])):
        with pytest.raises(ValueError, match=r"'kv' must be a dense strided tensor \(got layout"):
            mla_sink.quantize_kv_cache(bad)
    with pytest.raises(ValueError, match=r"'kv_cache' must be a dense strided tensor \(got layout torch.sparse_coo"):
        mla_sink.dequantize_kv_cache(cache.to_sparse())
    q = torch.randn(1, 2, 576).bfloat16()
    idx = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"'kv_cache' must be a dense strided tensor \(got layout torch.sparse_coo"):
        reference(q, cache.to_sparse(), idx)
    with pytest.raises(ValueError, match=r"'q' must be a dense strided tensor \(got layout torch.sparse_coo"):
        reference(q.float().to_sparse(), cache, idx)
    with pytest.raises(ValueError, match=r"'indices' must be a dense strided tensor"):
        reference(q, cache, idx.to_sparse())
    with pytest.raises(ValueError, match=r"'sinks' must be a dense strided tensor"):
        reference(q, cache, idx, sinks=torch.zeros(2).to_sparse())
    with pytest.raises(ValueError, match=r"'topk_length' must be a dense strided tensor"):
        reference(q, cache, idx, topk_length=torch.ones(1, dtype=torch.int32).to_sparse())
    with pytest.raises(ValueError, match=r"'kv_scale' must be a dense strided tensor"):
        reference(q, x.to(torch.float8_e4m3fn), idx, kv_scale=torch.ones(1).to_sparse())
    out, lse = reference(q, cache, idx)  # the dense call still runs
    assert out.shape == (1, 2, D_V) and lse.shape == (1, 2)
    # the layer's head count, run()'s dtype check and a dense call's prepared signature came before the refusal
    qh = torch.randn(2, 16, 576).bfloat16()
    kv = torch.randn(64, 576).bfloat16()
    ids = torch.randint(0, 64, (2, 8), dtype=torch.int32)
    layer = mla_sink.SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=8)
    with pytest.raises(ValueError, match=r"'q' must be a dense strided tensor \(got layout torch.strided, nested"):
        layer(torch.nested.nested_tensor(list(qh)), kv, ids)
    spec = mla_sink.CallSpec(q_dtype="bf16", kv_dtype="fp8_ds_mla", num_heads=16, topk=8)
    nested_cache = torch.nested.nested_tensor([cache, cache])
    with pytest.raises(ValueError, match=r"'kv_cache' must be a dense strided tensor \(got layout torch.strided, nested"):
        mla_sink.run(spec, dict(q=qh, kv_cache=nested_cache, indices=ids))
    sinks = torch.randn(16)
    mla_sink.sparse_mla_decode(qh, kv, ids, sinks=sinks)  # prepares the dense signature
    with pytest.raises(ValueError, match=r"'sinks' must be a dense strided tensor \(got layout torch._mkldnn"):
        mla_sink.sparse_mla_decode(qh, kv, ids, sinks=sinks.to_mkldnn())


def test_a_dynamic_trace_names_the_bad_stride_as_a_number():
    """Under ``torch.compile(dynamic=True)`` a refused stride is shown as the number it stands for in the call
    (``658``), not as the trace's symbol (``s32``) (thirty-ninth session's break test)."""
    import mla_sink

    op = torch.ops.mla_sink.sparse_mla_decode
    torch._dynamo.reset()
    f = torch.compile(lambda q, c, i: op(q, c, i, None, 576 ** -0.5, None, None, None, True, 0.0, ""),
                      fullgraph=True, dynamic=True, backend="aot_eager")
    kv = mla_sink.quantize_kv_cache(torch.randn(64, 576))
    bad = torch.as_strided(torch.zeros(65 * ROW, dtype=torch.uint8), (64, ROW), (ROW + 2, 1))
    bad.copy_(kv)
    with torch.no_grad(), pytest.raises(Exception, match=r"got strides \(658, 1\)"):
        f(torch.randn(2, 4, 576).bfloat16(), bad, torch.zeros(2, 8, dtype=torch.int32))
    with torch.no_grad():  # a good call traces and runs; a later bad one is refused (the guards), its shape a number
        f(torch.randn(2, 4, 576).bfloat16(), kv, torch.zeros(2, 8, dtype=torch.int32))
        with pytest.raises(Exception, match=r"got strides \(658, 1\)"):
            f(torch.randn(3, 4, 576).bfloat16(), bad, torch.zeros(3, 8, dtype=torch.int32))
        with pytest.raises(Exception, match=r"got torch.uint8 shape \(64, 657\)|got shape \(64, 657\)"):
            f(torch.randn(2, 4, 576).bfloat16(), torch.zeros(64, 657, dtype=torch.uint8),
              torch.zeros(2, 8, dtype=torch.int32))
