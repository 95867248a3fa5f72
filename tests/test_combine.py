"""The fused merge + sink kernel (used by DCP on GPUs) against merge_states + apply_sink."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_sink.core.dcp import _stack_view
from mla_sink.paths.triton.merge import combine_states_triton
from mla_sink.core.lse import apply_sink, merge_states

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("R,T,H,tile", [(1, 1, 1, None), (2, 3, 5, None), (4, 2, 17, None),
                                         (5, 2, 17, (16, 128)), (16, 1, 20, (16, 32)), (16, 1, 3, (16, 128))])
def test_combine_matches_merge_then_sink(R, T, H, tile):
    """``tile``: a GPU tile (many programs); 5 splits leave a partly masked group of four."""
    g = torch.Generator().manual_seed(R * 100 + H)
    buf = torch.randn(R, T * H * 512 + 8, generator=g)  # parts as strided views of one buffer
    parts = buf[:, : T * H * 512].reshape(R, T, H, 512)
    lses = torch.randn(R, T, H, generator=g) * 3
    lses[0, 0, :] = -math.inf
    parts[0, 0] = float("nan")  # a part without valid ids: contributes nothing
    lses[:, -1, 0] = -math.inf  # a row empty in every part
    sinks = torch.linspace(-3, 3, H)
    if H > 2:
        sinks[1], sinks[2] = math.inf, -math.inf
    out = torch.full((T, H, 512), float("nan"))
    lse = torch.full((T, H), float("nan"))
    combine_states_triton(parts, lses, sinks, out=out, lse=lse, tile=tile)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    assert (out[-1, 0] == 0).all() and torch.isneginf(lse[-1, 0])
    assert not out.isnan().any()


def test_merge_beyond_the_grid_token_limit_runs_in_token_ranges(monkeypatch):
    """More tokens than the grid's y dimension holds (65535 on CUDA; lowered to 2 here): the merge runs per
    token range (2 + 2 + 1) and equals one launch over all five tokens, bit for bit."""
    import mla_sink.paths.triton.merge as merge_mod

    R, T, H = 3, 5, 17
    g = torch.Generator().manual_seed(5)
    parts = torch.randn(R, T, H, 512, generator=g)
    lses = torch.randn(R, T, H, generator=g) * 3
    lses[1, 2, :] = -math.inf
    sinks = torch.linspace(-3, 3, H)
    results = []
    real, launches = merge_mod._merge_launch, []  # each launch's grid, (head blocks, tokens, column blocks)
    monkeypatch.setattr(merge_mod, "_merge_launch", lambda *a: launches.append(a[1]) or real(*a))
    for limit in (None, 2):
        if limit is not None:
            monkeypatch.setattr(merge_mod, "MAX_GRID_TOKENS", limit)
        out, lse = torch.full((T, H, 512), float("nan")), torch.full((T, H), float("nan"))
        launches.clear()
        combine_states_triton(parts, lses, sinks, out=out, lse=lse)
        assert [grid[1] for grid in launches] == ([T] if limit is None else [2, 2, 1])
        results.append((out, lse))
    torch.testing.assert_close(results[1][0], results[0][0], atol=0, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=0, rtol=0)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    torch.testing.assert_close(results[1][0], apply_sink(ref_out, ref_lse, sinks), atol=1e-5, rtol=1e-5)


def test_combine_known_numbers():
    """Normalisers 2 and 8 with outputs 0 and 10 merge to 8 (a base-2 mix-up gives about 7.23)."""
    parts = torch.stack([torch.zeros(1, 1, 512), torch.full((1, 1, 512), 10.0)])
    lses = torch.tensor([[[math.log(2)]], [[math.log(8)]]])
    out, lse = torch.empty(1, 1, 512), torch.empty(1, 1)
    combine_states_triton(parts, lses, None, out=out, lse=lse)
    assert out[0, 0, 0].item() == pytest.approx(8.0, abs=1e-5)
    assert lse.item() == pytest.approx(math.log(10), abs=1e-6)


@pytest.mark.parametrize("lse0", [1e4, 1e6, 1e8, -1e8, 3e38])
def test_merge_states_and_the_combine_at_large_lse(lse0):
    """Parts at a large |lse| merge to the convex combination of their outputs: two equal parts of output 1 give 1,
    a part ``log 3`` above the other weighs 3/4 (within fp32's rounding of ``lse0 + log 3``). merge_states divided
    by ``exp(lse)`` with the fp32 merged lse, whose ulp swallowed ``log 2`` from about 1e7 (a second break test,
    twenty-seventh session: 2.0 at 1e8); the combine kernel divides by its weights' sum."""
    ones = torch.ones(1, 1, 512)
    out, lse = merge_states([ones, ones], [torch.tensor([[lse0]])] * 2)
    torch.testing.assert_close(out, ones, atol=0, rtol=0)
    assert lse.item() == pytest.approx(lse0 + math.log(2), abs=abs(lse0) * 2 ** -23 + 1e-6)
    lo, hi = torch.tensor([[lse0]]).float(), torch.tensor([[lse0]]).float() + math.log(3)
    w_hi = 1 / (1 + math.exp(-(hi - lo).item()))  # the weight the fp32 inputs really give
    out, _ = merge_states([torch.zeros(1, 1, 512), ones], [lo, hi])
    assert out[0, 0, 0].item() == pytest.approx(w_hi, rel=1e-6)
    parts, lses = torch.stack([torch.zeros(1, 1, 512), ones]), torch.stack([lo, hi])
    k_out, k_lse = torch.empty(1, 1, 512), torch.empty(1, 1)
    if abs(lse0) < 1e38:  # the combine keeps base-2 LSEs in fp32: above about 2.36e38 they overflow (documented)
        combine_states_triton(parts, lses, None, out=k_out, lse=k_lse)
        # each LSE rounded once more to fp32 in base 2 moves a weight by about |lse| 2^-24 (3e-4 at 1e6)
        assert k_out[0, 0, 0].item() == pytest.approx(w_hi, rel=1e-6 + abs(lse0) * 2 ** -24)


@pytest.mark.parametrize("tile", [None, (16, 32)])
def test_combine_a_part_with_lse_plus_inf_gives_what_merge_states_gives(tile):
    """A part whose LSE is ``+inf`` (an fp32 overflow, a peer's convention) makes its row's LSE ``+inf`` and its
    output NaN, as merge_states + apply_sink give (its weight ``exp(inf - inf)`` has no value); the combine
    took the LSE's max as its shift and wrote NaN for the LSE. The other rows keep their values."""
    R, T, H = 3, 2, 5
    g = torch.Generator().manual_seed(7)
    parts = torch.randn(R, T, H, 512, generator=g)
    lses = torch.randn(R, T, H, generator=g)
    lses[0, 0, 0] = math.inf  # one part among finite ones
    lses[:, 0, 1] = math.inf  # every part
    lses[1, 0, 2], lses[2, 0, 2] = math.inf, -math.inf  # beside a part without valid ids (NaN partial)
    parts[2, 0, 2] = float("nan")
    lses[0, 0, 3], parts[0, 0, 3] = math.inf, 0.0  # with a zero partial
    sinks = torch.tensor([0.0, -math.inf, 1.0, 30.0, 0.5])
    out = torch.full((T, H, 512), 7.0)
    lse = torch.full((T, H), 7.0)
    combine_states_triton(parts, lses, sinks, out=out, lse=lse, tile=tile)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    assert torch.isposinf(ref_lse[0, :4]).all() and ref_out[0, :4].isnan().all()  # the reference's answer
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert torch.isfinite(lse[1]).all() and torch.isfinite(out[1]).all() and torch.isfinite(out[0, 4]).all()


@pytest.mark.parametrize("tile", [None, (16, 32)])
def test_combine_a_part_with_lse_nan_gives_nan_as_merge_states(tile):
    """A part whose LSE is NaN (a NaN score in that split) makes its row's LSE and output NaN, as merge_states
    gives, also beside parts without valid ids (the max over the splits skipped the NaN there and the row came
    out empty: out 0, LSE -inf). Rows without NaN keep their values."""
    R, T, H = 3, 2, 3
    g = torch.Generator().manual_seed(11)
    parts = torch.randn(R, T, H, 512, generator=g)
    lses = torch.randn(R, T, H, generator=g)
    lses[0, 0, 0], lses[1:, 0, 0] = math.nan, -math.inf  # beside empty parts only
    lses[1, 0, 1] = math.nan  # beside finite parts
    lses[:, 0, 2] = -math.inf  # a row empty in every part stays empty
    out = torch.full((T, H, 512), 7.0)
    lse = torch.full((T, H), 7.0)
    combine_states_triton(parts, lses, None, out=out, lse=lse, tile=tile)
    ref_out, ref_lse = merge_states(list(parts), list(lses))
    assert ref_lse[0, :2].isnan().all() and ref_out[0, :2].isnan().all()  # the reference's answer
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6, equal_nan=True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert torch.isneginf(lse[0, 2]) and (out[0, 2] == 0).all() and torch.isfinite(lse[1]).all()


def _merge_args(**over):
    g = torch.Generator().manual_seed(3)
    args = dict(part_out=torch.randn(3, 2, 5, 512, generator=g), part_lse=torch.randn(3, 2, 5, generator=g),
                sinks=None, out=torch.empty(2, 5, 512), lse=torch.empty(2, 5))
    args.update(over)
    return args


@pytest.mark.parametrize("over,message", [
    (dict(out=torch.empty(2, 5, 256)), r"'out' must be \[2, 5, 512\]"),  # was a segfault
    (dict(out=torch.empty(2, 4, 512)), r"'out' must be \[2, 5, 512\]"),  # was heap corruption
    (dict(out=torch.empty(2, 5, 1024)[..., ::2]), "'out' must have innermost stride 1"),  # was silently wrong
    (dict(out=torch.empty(2, 5, 512, dtype=torch.int32)), "'out' must be torch.float32"),  # was truncated
    (dict(lse=torch.empty(2)), r"'lse' must be \[2, 5\]"),
    (dict(lse=torch.empty(2, 5, dtype=torch.float16)), "'lse' must be torch.float32"),
    (dict(sinks=torch.zeros(4)), "'sinks' must have num_heads=5 entries"),  # was read past its end
    (dict(part_lse=torch.zeros(3, 2, 5, dtype=torch.int64)), "'part_lse' must be a floating dtype"),
    (dict(part_out=torch.randn(3, 2, 512)), r"'part_out' must be \[R, T, H, 512\]"),
    (dict(out=[0.0]), "'out' must be a torch.Tensor"),
])
def test_merge_refuses_bad_buffers_before_its_kernel(over, message):
    """Every tensor of the fused merge is checked before the kernel runs (a fresh user's break test, twenty-sixth
    session: a wrong out or sinks crashed the process or read out of bounds)."""
    with pytest.raises(ValueError, match=message):
        combine_states_triton(**_merge_args(**over))


@pytest.mark.parametrize("tile", [(16,), (16, 128, 1), (16.0, 128), ("16", 128), 16, (2 ** 20, 512), (32, 128),
                                  (16, 1024), (True, 128), (8, 128), (16, 48)])
def test_merge_refuses_bad_tiles(tile):
    """A tile is a pair: heads None or a power of two from 16 to the padded head count (16 at H=5), columns a power
    of two dividing 512; anything else is the tile's ValueError, not a TypeError or a kernel failure."""
    with pytest.raises(ValueError, match="'tile' must be \\(heads, value columns\\)"):
        combine_states_triton(**_merge_args(), tile=tile)


def test_merge_refuses_outputs_that_overlap_what_it_reads():
    """out / lse written while the parts and sinks are read: a shifted view of the parts, sinks inside lse and a
    broadcast out or lse gave silently wrong values (a fresh user's second break test, twenty-sixth session)."""
    a = _merge_args(sinks=torch.randn(5))
    shifted = a["part_out"].view(-1)[512:512 + 2 * 5 * 512].view(2, 5, 512)
    with pytest.raises(ValueError, match="'out' must not overlap 'part_out'"):
        combine_states_triton(**dict(a, out=shifted))
    lse_buf = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="'lse' must not overlap 'sinks'"):
        combine_states_triton(**dict(a, sinks=lse_buf[0], lse=lse_buf))
    with pytest.raises(ValueError, match="'out' must not overlap itself"):
        combine_states_triton(**dict(a, out=torch.zeros(1, 5, 512).expand(2, 5, 512)))
    with pytest.raises(ValueError, match="'lse' must not overlap itself"):
        combine_states_triton(**dict(a, lse=torch.zeros(1, 5).expand(2, 5)))
    with pytest.raises(ValueError, match="'sinks' must be on cpu, like part_out"):
        combine_states_triton(**dict(a, sinks=torch.zeros(5, device="meta")))
    with pytest.raises(ValueError, match="'part_out' must be on a cpu or cuda"):
        combine_states_triton(**_merge_args(part_out=torch.empty(3, 0, 5, 512, device="meta")))


def test_merge_tile_heads_none_means_every_head():
    a, b = _merge_args(), _merge_args()
    combine_states_triton(**a, tile=(None, 128))
    combine_states_triton(**b, tile=(16, 128))
    assert torch.equal(a["out"], b["out"]) and torch.equal(a["lse"], b["lse"])


def test_stack_view_over_gather_buffer():
    buf = torch.arange(3 * 20, dtype=torch.float32).view(3, 20)
    parts = [buf[r, :12].view(2, 6) for r in range(3)]
    view = _stack_view(parts)
    assert view is not None and view.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(view, torch.stack(parts))
    assert _stack_view([parts[0], parts[2], parts[1]]) is None




@settings(max_examples=12, deadline=None)
@given(R=st.integers(1, 11), H=st.integers(1, 20), tile=st.sampled_from([None, (16, 32), (16, 128)]),
       seed=st.integers(0, 2 ** 16), empty_frac=st.sampled_from([0.0, 0.3, 1.0]))
def test_combine_property(R, H, tile, seed, empty_frac):
    """Any split count (groups of four with a masked tail), any head count, parts without valid ids (LSE
    ``-inf``, partial NaN) anywhere: the combine equals merge_states + apply_sink."""
    g = torch.Generator().manual_seed(seed)
    T = 2
    parts = torch.randn(R, T, H, 512, generator=g)
    lses = torch.randn(R, T, H, generator=g) * 4
    empty = torch.rand(R, T, H, generator=g) < empty_frac
    lses[empty] = -math.inf
    parts[empty] = float("nan")
    sinks = torch.randn(H, generator=g) * 2
    out = torch.full((T, H, 512), float("nan"))
    lse = torch.full((T, H), float("nan"))
    combine_states_triton(parts, lses, sinks, out=out, lse=lse, tile=tile)
    clean = torch.where(empty[..., None], torch.zeros(()), parts)  # the reference multiplies by weight 0
    ref_out, ref_lse = merge_states(list(clean), list(lses))
    ref_out = apply_sink(ref_out, ref_lse, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
    assert not out.isnan().any()


@pytest.mark.parametrize("splits,tile,group", [(32, (16, 32), 16), (16, (16, 32), 16), (5, (16, 32), 8),
                                               (32, (16, 64), 8), (16, (16, 128), 4), (2, (16, 128), 4),
                                               (3, (64, 512), 4), (1, (16, 32), 4)])
def test_the_combine_loads_as_many_splits_together_as_its_tile_allows(splits, tile, group):
    """Splits whose loads a combine program issues together: 4, 8 or 16, as many as 8192 fp32 tile values hold
    (64 registers a thread), at most the padded split count (at least 4); the tests above run each size
    (a (16, 32) tile with 5-16 parts takes groups of 8 and 16)."""
    from mla_sink.kernels.triton.combine import combine_constexprs

    assert combine_constexprs(splits, True, *tile)["GROUP"] == group
