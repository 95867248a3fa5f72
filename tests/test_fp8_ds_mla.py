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
from mla_sink.core.dtypes import ALLOWED_DTYPE_PAIRS, kv_dtype_key
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
    assert ("bf16", "fp8_ds_mla") in ALLOWED_DTYPE_PAIRS and ("fp16", "fp8_ds_mla") in ALLOWED_DTYPE_PAIRS
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
    with pytest.raises(ValueError, match=r"'kv_cache' must be uint8 \[N, 656\]"):
        dequantize_kv_cache(torch.zeros(4, D_QK, dtype=torch.uint8))


def test_public_api_exports():
    assert mla_sink.quantize_kv_cache is quantize_kv_cache
    assert mla_sink.dequantize_kv_cache is dequantize_kv_cache
