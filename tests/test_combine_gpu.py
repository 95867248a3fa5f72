"""The fused merge + sink kernel compiled for a CUDA GPU (value columns split over programs there)
against merge_states + apply_sink; the CPU interpreter version is tests/test_combine.py."""

from __future__ import annotations

import math

import pytest
import torch

from mla_sink.paths.triton.merge import combine_states_triton
from mla_sink.core.lse import apply_sink, merge_states

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("R,T,H", [(1, 1, 1), (2, 3, 5), (4, 2, 17), (8, 64, 128), (16, 2, 128), (5, 3, 24)])
def test_combine_matches_merge_then_sink_on_gpu(R, T, H):
    g = torch.Generator(device="cuda").manual_seed(R * 100 + H)
    buf = torch.randn(R, T * H * 512 + 8, generator=g, device="cuda")
    parts = buf[:, : T * H * 512].reshape(R, T, H, 512)
    lses = torch.randn(R, T, H, generator=g, device="cuda") * 3
    lses[0, 0, :] = -math.inf
    parts[0, 0] = float("nan")  # a part without valid ids: contributes nothing
    lses[:, -1, 0] = -math.inf  # a row empty in every part
    sinks = torch.linspace(-3, 3, H, device="cuda")
    if H > 2:
        sinks[1], sinks[2] = math.inf, -math.inf
    out = torch.full((T, H, 512), float("nan"), device="cuda")
    lse = torch.full((T, H), float("nan"), device="cuda")
    combine_states_triton(parts, lses, sinks, out=out, lse=lse)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    assert (out[-1, 0] == 0).all() and torch.isneginf(lse[-1, 0])
    assert not out.isnan().any()


def test_combine_a_part_with_lse_plus_inf_gives_what_merge_states_gives_on_gpu():
    """The GPU twin of tests/test_combine.py's: a part whose LSE is ``+inf`` makes its row's LSE ``+inf`` and its
    output NaN (ex2.approx and lg2.approx keep the infinities); the other rows keep their values."""
    R, T, H = 3, 2, 5
    g = torch.Generator(device="cuda").manual_seed(7)
    parts = torch.randn(R, T, H, 512, generator=g, device="cuda")
    lses = torch.randn(R, T, H, generator=g, device="cuda")
    lses[0, 0, 0] = math.inf
    lses[:, 0, 1] = math.inf
    lses[1, 0, 2], lses[2, 0, 2] = math.inf, -math.inf
    parts[2, 0, 2] = float("nan")
    lses[0, 0, 3], parts[0, 0, 3] = math.inf, 0.0
    sinks = torch.tensor([0.0, -math.inf, 1.0, 30.0, 0.5], device="cuda")
    out = torch.full((T, H, 512), 7.0, device="cuda")
    lse = torch.full((T, H), 7.0, device="cuda")
    combine_states_triton(parts, lses, sinks, out=out, lse=lse)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    assert torch.isposinf(ref_lse[0, :4]).all() and ref_out[0, :4].isnan().all()
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert torch.isfinite(lse[1]).all() and torch.isfinite(out[1]).all() and torch.isfinite(out[0, 4]).all()
