"""Calls of more tokens than a CUDA grid's y / z dimension holds (65535): the library runs them as launches over
token ranges (:func:`mla_sink.paths.triton.plan.token_ranges`); every kernel path here (the sm90 seesaw
and fp8 kernels, the portable kernel, the DCP merge) is checked on the tokens on either side of each range's
edge against the float64 reference (GPU marker: run on the device).

Budget: ``out`` elementwise ``abs <= 1e-2 or rel <= 2/128`` (bf16 output: two bf16 ulps), ``lse`` within 1e-5,
as tests/test_cuda_graph_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from mla_sink import quantize_kv_cache, sparse_mla_decode
from mla_sink.core.lse import apply_sink, merge_states
from mla_sink.core.reference import sparse_mla_decode_reference as ref
from mla_sink.paths.triton.launch import MAX_GRID_TOKENS, sparse_mla_decode_triton
from mla_sink.paths.triton.merge import combine_states_triton
from mla_sink.paths.triton.plan import token_ranges

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

T = MAX_GRID_TOKENS + 3  # ranges of 65532 and 6 tokens
EDGE = token_ranges(T)[0][1]
#: the tokens checked: the first, either side of the range edge, the last
CHECKED = [0, 1, EDGE - 1, EDGE, EDGE + 1, T - 1]


def _inputs(H: int, kv_dtype: str, N: int = 4096, topk: int = 64):
    g = torch.Generator(device="cuda").manual_seed(H)
    q = torch.randn(T, H, 576, device="cuda", generator=g).bfloat16()
    kv = torch.randn(N, 576, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, N, (T, topk), device="cuda", dtype=torch.int32, generator=g)
    idx[EDGE, :5] = -1  # the second range's first row: skipped ids
    idx[T - 1] = -1  # a row with no valid id, in the last range
    sinks = torch.randn(H, device="cuda", generator=g) + 1.0
    if kv_dtype == "fp8_e4m3":
        return q, kv.to(torch.float8_e4m3fn), idx, sinks, torch.ones(1, device="cuda")
    if kv_dtype == "fp8_ds_mla":
        return q, quantize_kv_cache(kv, scale="pow2"), idx, sinks, None
    return q, kv, idx, sinks, None


def _check(o, l, q, kv, idx, sinks, kv_scale):
    rows = torch.tensor(CHECKED, device="cuda")
    ro, rl = ref(q[rows], kv, idx[rows], sinks, kv_scale=kv_scale)
    torch.testing.assert_close(o[rows].double(), ro, atol=1e-2, rtol=2 / 128)
    torch.testing.assert_close(l[rows].double(), rl.double(), atol=1e-5, rtol=1e-5)
    assert (o[T - 1] == 0).all() and torch.isneginf(l[T - 1]).all()


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3", "fp8_ds_mla"])
@pytest.mark.parametrize("H", [16, 32, 64])
def test_decode_beyond_the_grid_token_limit(H, kv_dtype):
    q, kv, idx, sinks, kv_scale = _inputs(H, kv_dtype)
    o, l = sparse_mla_decode(q, kv, idx, sinks, kv_scale=kv_scale, return_lse=True)
    torch.cuda.synchronize()
    _check(o, l, q, kv, idx, sinks, kv_scale)


def test_portable_kernel_split_beyond_the_grid_token_limit():
    """The portable kernel, forced to split (its combine also puts the tokens on a grid dimension)."""
    q, kv, idx, sinks, kv_scale = _inputs(8, "bf16")
    o, l = sparse_mla_decode_triton(q, kv, idx, sinks, kernel="portable", num_kv_splits=2)
    torch.cuda.synchronize()
    _check(o, l, q, kv, idx, sinks, kv_scale)


def test_dcp_merge_beyond_the_grid_token_limit():
    R, H = 2, 16
    g = torch.Generator(device="cuda").manual_seed(3)
    parts = torch.randn(R, T, H, 512, device="cuda", generator=g)
    lses = torch.randn(R, T, H, device="cuda", generator=g)
    sinks = torch.randn(H, device="cuda", generator=g)
    out, lse = torch.empty(T, H, 512, device="cuda"), torch.empty(T, H, device="cuda")
    combine_states_triton(parts, lses, sinks, out=out, lse=lse)
    rows = torch.tensor(CHECKED, device="cuda")
    r_out, r_lse = merge_states(list(parts[:, rows]), list(lses[:, rows]))
    torch.testing.assert_close(out[rows], apply_sink(r_out, r_lse, sinks), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[rows], r_lse, atol=1e-5, rtol=1e-5)
