"""The fused merge + sink kernel (used by DCP on GPUs) against merge_states + apply_sink."""

from __future__ import annotations

import math

import pytest
import torch

from mla_sink.core.dcp import _stack_view
from mla_sink.paths.triton.launch import combine_states_triton
from mla_sink.core.lse import apply_sink, merge_states

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("R,T,H", [(1, 1, 1), (2, 3, 5), (4, 2, 17)])
def test_combine_matches_merge_then_sink(R, T, H):
    g = torch.Generator().manual_seed(R * 100 + H)
    buf = torch.randn(R, T * H * 512 + 8, generator=g)  # parts as strided views of one buffer
    parts = buf[:, : T * H * 512].reshape(R, T, H, 512)
    lses = torch.randn(R, T, H, generator=g) * 3
    lses[0, 0, :] = -math.inf
    parts[0, 0] = float("nan")  # a part without valid ids: never read
    lses[:, -1, 0] = -math.inf  # a row empty in every part
    sinks = torch.linspace(-3, 3, H)
    if H > 2:
        sinks[1], sinks[2] = math.inf, -math.inf
    out = torch.full((T, H, 512), float("nan"))
    lse = torch.full((T, H), float("nan"))
    combine_states_triton(parts, lses, sinks, out=out, lse=lse)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    assert (out[-1, 0] == 0).all() and torch.isneginf(lse[-1, 0])
    assert not out.isnan().any()


def test_combine_known_numbers():
    """Normalisers 2 and 8 with outputs 0 and 10 merge to 8 (a base-2 mix-up gives about 7.23)."""
    parts = torch.stack([torch.zeros(1, 1, 512), torch.full((1, 1, 512), 10.0)])
    lses = torch.tensor([[[math.log(2)]], [[math.log(8)]]])
    out, lse = torch.empty(1, 1, 512), torch.empty(1, 1)
    combine_states_triton(parts, lses, None, out=out, lse=lse)
    assert out[0, 0, 0].item() == pytest.approx(8.0, abs=1e-5)
    assert lse.item() == pytest.approx(math.log(10), abs=1e-6)


def test_stack_view_over_gather_buffer():
    buf = torch.arange(3 * 20, dtype=torch.float32).view(3, 20)
    parts = [buf[r, :12].view(2, 6) for r in range(3)]
    view = _stack_view(parts)
    assert view is not None and view.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(view, torch.stack(parts))
    assert _stack_view([parts[0], parts[2], parts[1]]) is None


@pytest.mark.parametrize("R,block_d", [(5, 32), (16, 32), (7, 128), (32, 32)])
def test_combine_loads_splits_in_chunks(R, block_d):
    """GPU tiles (16 heads x 32 or 128 columns) load several splits per memory round trip (CHUNK_S up to
    16): the result is the split-by-split merge, parts with LSE -inf are never read (NaN there), split
    counts that are not a multiple of the chunk are masked, and 32 splits take two chunks."""
    from mla_sink.kernels.triton.combine import chunk_splits
    from mla_sink.kernels.triton.interpreter import interpreted, interpreter_stdlib

    T, H = 2, 20
    g = torch.Generator().manual_seed(R * 7 + block_d)
    part_out = torch.randn(T, R, H, 512, generator=g)
    lse_nat = torch.randn(T, R, H, generator=g) * 2
    lse_nat[0, 1:3, :5] = -math.inf
    part_out[0, 1:3, :5] = float("nan")
    lse_nat[1, :, 7] = -math.inf  # empty in every split
    part_lse2 = lse_nat / math.log(2)  # the kernel keeps base 2
    sinks = torch.linspace(-2, 2, H)
    out = torch.full((T, H, 512), float("nan"))
    lse = torch.full((T, H), float("nan"))
    block_s = 1 << max(0, (R - 1).bit_length())
    chunk = chunk_splits(block_s, 16, block_d)
    assert chunk == min(block_s, 16 if block_d == 32 else 4)
    with interpreter_stdlib():
        interpreted("combine")[(-(-H // 16), T, 512 // block_d)](
            part_out, part_lse2, sinks, out, lse, H, R,
            part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse2.stride(0), part_lse2.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            BLOCK_H=16, BLOCK_D=block_d, BLOCK_S=block_s, CHUNK_S=chunk, HAS_SINKS=True)
    ref_out, ref_lse = merge_states(list(part_out.transpose(0, 1)), list(lse_nat.transpose(0, 1)))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert (out[1, 7] == 0).all() and torch.isneginf(lse[1, 7]) and not out.isnan().any()
