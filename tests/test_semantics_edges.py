"""Edges of the semantics, on every path that runs on the CPU: duplicated ids, huge scores, non-finite
scores, the bounds of ``sm_scale`` and ``logit_cap``, ``T = 0``.

The float64 reference defines the answer (:mod:`mla_sink.core.reference`); the ``triton`` path runs
through Triton's interpreter; the AITER paths through the contract model of ``tests/aiter_contract.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from mla_sink import CallSpec, DecodeInputs, Platform, SparseMLADecode, prepare, run, sparse_mla_decode
from mla_sink.core.plan import build_plan
from mla_sink.core.reference import sparse_mla_decode_reference as ref
from mla_sink.paths.aiter import AiterWorkspace, launch_aiter
from mla_sink.paths.triton.launch import sparse_mla_decode_triton, triton_plan_for

from aiter_contract import AiterContractFake

INF, NAN = float("inf"), float("nan")
interpreter = pytest.mark.interpreter


# --------------------------------------------------------------------------------------------
# Duplicated ids
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sm_scale", [1e14, 1e16, 1e30])
def test_reference_duplicate_ids_at_huge_scores_are_exact(sm_scale):
    """ids [2, 2] attend to row 2 alone: out is exactly v[2] at any score (normalising by exp(-logsumexp)
    gave 2 v at 1e16 and 1.0057 v at 1e14), lse = s + log 2."""
    q = torch.ones(1, 1, 576, dtype=torch.bfloat16)
    kv = torch.randn(4, 576).bfloat16()
    kv[2] = torch.linspace(0.01, 0.02, 576).bfloat16()  # q.k = 8.6: scores of 8.6e14 to 8.6e30
    out, lse = ref(q, kv, torch.tensor([[2, 2]], dtype=torch.int32), sm_scale=sm_scale)
    assert torch.equal(out[0, 0], kv[2, :512].double())
    s = sm_scale * (q[0, 0].double() @ kv[2].double())
    assert lse[0, 0].item() == pytest.approx(float(s) + math.log(2.0), rel=1e-6)


def _duplicate_case(q_dtype=torch.bfloat16):
    """Row 2 duplicated in the ids ``[2, 2, 5, -1]`` against a pool where the duplicate is a distinct row
    (``[2, 6, 5, -1]`` with row 6 = row 2): both mean the same call."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, 576, generator=g).to(q_dtype)
    kv = torch.randn(8, 576, generator=g).to(q_dtype)
    kv[6] = kv[2]
    dup = torch.tensor([[2, 2, 5, -1], [2, 2, 2, 2], [1, 7, 1, 7]], dtype=torch.int32)
    distinct = torch.tensor([[2, 6, 5, -1], [2, 6, 2, 6], [1, 7, 3, 4]], dtype=torch.int32)
    kv[3], kv[4] = kv[1], kv[7]
    sinks = torch.tensor([0.0, 1.0, -INF, 2.0])
    return q, kv, dup, distinct, sinks


def test_reference_duplicate_id_counts_once_per_occurrence():
    q, kv, dup, distinct, sinks = _duplicate_case()
    a_out, a_lse = ref(q, kv, dup, sinks)
    b_out, b_lse = ref(q, kv, distinct, sinks)
    torch.testing.assert_close(a_out, b_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(a_lse, b_lse)
    single_out, single_lse = ref(q, kv, torch.tensor([[2, 5, -1, -1]] * 3, dtype=torch.int32), sinks)
    assert not torch.allclose(a_lse[0], single_lse[0])  # the duplicate really weighs twice


@interpreter
@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_triton_duplicate_ids_match_the_reference(num_kv_splits):
    q, kv, dup, _, sinks = _duplicate_case()
    dup = _spread(dup) if num_kv_splits > 1 else dup  # 192 ids: the requested splits really split
    assert _splits_used(q, kv, dup, num_kv_splits) == num_kv_splits
    out, lse = sparse_mla_decode_triton(q, kv, dup, sinks, num_kv_splits=num_kv_splits)
    r_out, r_lse = ref(q, kv, dup, sinks)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(lse, r_lse, atol=1e-5, rtol=1e-5)
    q1 = torch.ones(1, 1, 576, dtype=torch.bfloat16)
    kv1 = torch.full((4, 576), 0.01, dtype=torch.bfloat16)
    kv1[2] = torch.linspace(0.01, 0.02, 576).bfloat16()
    out1, _ = sparse_mla_decode_triton(q1, kv1, torch.tensor([[2, 2]], dtype=torch.int32), sm_scale=1e16)
    assert torch.equal(out1[0, 0], kv1[2, :512])  # the average of a row with itself, at a huge score


def _aiter_contract_run(path, arch, q, kv, idx, sinks):
    """``(out, lse, fake)``: a bf16 call with sinks forced onto AITER path ``path`` on ``arch``, planned from the
    table's row for that path (its params and the AITER call) and launched on the contract model ``fake``."""
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=q.shape[1], topk=idx.shape[1], sinks=True)
    fake = AiterContractFake(arch=arch)
    plan = build_plan(spec, Platform(arch=arch, aiter_version="0.1.20"), num_tokens=q.shape[0], path=path,
                      aiter_impl=fake)
    assert plan.path == path and plan.launch is not None
    x = DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=576 ** -0.5, sinks=sinks)
    out, lse = launch_aiter(plan, x, impl=fake, workspace=AiterWorkspace())
    return out, lse, fake


@pytest.mark.parametrize("path,arch", [("aiter_lse", "gfx942"), ("aiter_persistent", "gfx950")])
def test_aiter_contract_duplicate_ids_match_the_reference(path, arch):
    q, kv, dup, _, sinks = _duplicate_case()
    q, kv, sinks = q[:, :4].repeat(1, 4, 1), kv, sinks.repeat(4)  # 16 heads: AITER's smallest bucket
    out, lse, fake = _aiter_contract_run(path, arch, q, kv, dup, sinks)
    r_out, r_lse = ref(q, kv, dup, sinks)
    torch.testing.assert_close(out.double(), r_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, r_lse, atol=2e-3, rtol=1e-4)
    assert len(fake.calls) == 1


# --------------------------------------------------------------------------------------------
# Non-finite scores: +inf / NaN make the row NaN, all -inf is an empty row
# --------------------------------------------------------------------------------------------


def _spread(idx: torch.Tensor, width: int = 192) -> torch.Tensor:
    """``idx`` ``[T, k]`` placed every ``width // k`` columns of ``[T, width]`` (``-1`` between), so that a
    requested split count of 2 or 3 really splits (one split per 64 ids at most, ``split_plan``) and every split
    holds some of the ids."""
    out = torch.full((idx.shape[0], width), -1, dtype=idx.dtype)
    out[:, :: width // idx.shape[1]][:, : idx.shape[1]] = idx
    return out


def _splits_used(q, kv, idx, requested, **kw):
    """The split count the triton path's plan gives a call with ``num_kv_splits=requested``."""
    return triton_plan_for(q, kv, idx, num_kv_splits=requested, **kw).launch.num_kv_splits


def _non_finite_case():
    """Column 5 of every KV row is > 0, so q[..., 5] = -inf gives every score -inf, +inf gives +inf."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 3, 576, generator=g).half()
    kv = torch.randn(16, 576, generator=g).half()
    kv[:, 5] = kv[:, 5].abs() + 0.1
    idx = torch.randint(0, 16, (5, 8), generator=g, dtype=torch.int32)
    idx[4] = -1
    q[0, 0, 5] = INF  # every score +inf: NaN
    q[0, 1, 5] = -INF  # every score -inf: an empty row
    q[0, 2, 7] = NAN  # NaN scores: NaN
    q[1, 0, 5] = -INF
    q[1, 1, 5], q[1, 1, 6] = INF, -INF  # inf - inf inside the dot product: NaN
    q[4, 0, 5] = NAN  # no valid id: the NaN is never used, an empty row
    return q, kv, idx


def test_reference_non_finite_scores():
    q, kv, idx = _non_finite_case()
    out, lse = ref(q, kv, idx)
    nan_rows = {(0, 0), (0, 2), (1, 1)}
    empty_rows = {(0, 1), (1, 0)} | {(4, h) for h in range(3)}
    for t in range(5):
        for h in range(3):
            if (t, h) in nan_rows:
                assert math.isnan(lse[t, h]) and out[t, h].isnan().all(), (t, h)
            elif (t, h) in empty_rows:
                assert lse[t, h] == -INF and (out[t, h] == 0).all(), (t, h)
            else:
                assert math.isfinite(lse[t, h]) and out[t, h].isfinite().all(), (t, h)


@interpreter
@pytest.mark.parametrize("num_kv_splits", [1, 3])
@pytest.mark.parametrize("sinks", [None, "mixed"])
@pytest.mark.parametrize("logit_cap", [0.0, 5.0])
def test_triton_non_finite_scores_match_the_reference(num_kv_splits, sinks, logit_cap):
    """Same NaN / -inf / finite pattern and values as the reference, with and without sinks, the soft cap
    (which maps +-inf scores to +-cap) and split-KV (the combine kernel: the ids spread over three splits)."""
    q, kv, idx = _non_finite_case()
    if num_kv_splits > 1:
        idx = _spread(idx)
        assert _splits_used(q, kv, idx, num_kv_splits) == num_kv_splits
    s = None if sinks is None else torch.tensor([0.0, INF, -1.0])
    out, lse = sparse_mla_decode_triton(q, kv, idx, s, logit_cap=logit_cap, num_kv_splits=num_kv_splits)
    r_out, r_lse = ref(q, kv, idx, s, logit_cap=logit_cap)
    assert torch.equal(lse.isnan(), r_lse.isnan()) and torch.equal(lse.isneginf(), r_lse.isneginf())
    assert torch.equal(out.isnan(), r_out.isnan())
    assert not lse.isposinf().any()
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2, equal_nan=True)
    torch.testing.assert_close(lse.double(), r_lse.double(), atol=1e-4, rtol=1e-5, equal_nan=True)
    if logit_cap == 0.0:
        assert r_lse.isnan().any() and (r_lse == -INF).any()  # the case exercises both rules


def _nan_sink_case(num_heads):
    """bf16 ``q [3, num_heads, 576]``, ``kv [64, 576]``, ``idx [3, 32]`` with token 1 empty (all ``-1``), and fp32
    sinks with head 1's NaN (head 0 finite, head 2 ``-inf`` where there are three heads, the rest 0)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, num_heads, 576, generator=g).bfloat16()
    kv = torch.randn(64, 576, generator=g).bfloat16()
    idx = torch.randint(0, 64, (3, 32), generator=g, dtype=torch.int32)
    idx[1] = -1  # an empty row
    sinks = torch.zeros(num_heads)
    sinks[:3] = torch.tensor([0.5, NAN, -INF])[:num_heads]
    return q, kv, idx, sinks


@interpreter
@pytest.mark.parametrize("num_kv_splits", [1, 2])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_ds_mla"])
def test_a_nan_sink_gives_what_the_docstring_says(num_kv_splits, kv_dtype):
    """A NaN sink is not checked (that would read the sinks back from the device): its head's ``out`` is NaN on
    rows with a valid id and 0 on empty rows, its ``lse`` (sink excluded) unaffected, the other heads untouched -
    as on the reference (``sparse_mla_decode``'s docstring, README; break test, sixty-eighth session)."""
    from mla_sink import quantize_kv_cache

    q, kv, idx, sinks = _nan_sink_case(3)
    if kv_dtype == "fp8_ds_mla":
        kv = quantize_kv_cache(kv, layout="fp8_ds_mla", scale="amax")
    if num_kv_splits > 1:
        idx = _spread(idx, 256)
        assert _splits_used(q, kv, idx, num_kv_splits) == num_kv_splits
    out, lse = sparse_mla_decode_triton(q, kv, idx, sinks, num_kv_splits=num_kv_splits)
    r_out, r_lse = ref(q, kv, idx, sinks)
    assert r_out[[0, 2], 1].isnan().all() and (r_out[1] == 0).all()  # the reference's answer, as documented
    assert out[[0, 2], 1].isnan().all() and (out[1] == 0).all()
    assert out[:, [0, 2]].isfinite().all() and lse.isfinite()[[0, 2]].all() and (lse[1] == -INF).all()
    # bf16 out under the interpreter: its final rounding plus fp32 sums (tests/test_fp8_ds_mla.py's OUT_TOL)
    torch.testing.assert_close(out.double(), r_out, atol=8e-3, rtol=8e-3, equal_nan=True)
    torch.testing.assert_close(lse.double(), r_lse.double(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("path,arch", [("aiter_lse", "gfx942"), ("aiter_persistent", "gfx950")])
def test_aiter_contract_nan_sink_gives_what_the_docstring_says(path, arch):
    """The AITER paths apply the sink after the kernel (``finalize_aiter``): a NaN sink gives the same NaN / 0
    pattern as the reference, its ``lse`` unaffected (contract model, 16 heads: AITER's smallest bucket)."""
    q, kv, idx, sinks = _nan_sink_case(16)
    out, lse, _ = _aiter_contract_run(path, arch, q, kv, idx, sinks)
    r_out, r_lse = ref(q, kv, idx, sinks)
    assert out[[0, 2], 1].isnan().all() and (out[1] == 0).all() and torch.equal(out.isnan(), r_out.isnan())
    assert torch.equal(lse.isneginf(), r_lse.isneginf()) and lse.isfinite()[[0, 2]].all()
    torch.testing.assert_close(out.double(), r_out, atol=2e-2, rtol=2e-2, equal_nan=True)  # AITER contract bf16 budget


@interpreter
@pytest.mark.parametrize("logit_cap", [0.0, 2.0])
@pytest.mark.parametrize("which", ["q_scale", "kv_scale"])
def test_a_nan_per_tensor_scale_gives_nan_with_and_without_the_cap(which, logit_cap):
    """A NaN ``q_scale`` or ``kv_scale`` makes every referenced token's ``out`` and ``lse`` NaN on the portable
    kernel, as on the reference and as README says (NaN in scales propagates). With the soft cap the kernel clamped
    the scale ratio with Triton's default ``minimum``, which returns the non-NaN operand: every score became the cap
    and the output finite (break test, thirty-second session)."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 576, generator=g).to(torch.float8_e4m3fn)
    kv = torch.randn(16, 576, generator=g).to(torch.float8_e4m3fn)
    idx = torch.tensor([[0, 5, -1], [3, 3, 9]], dtype=torch.int32)
    scales = {"q_scale": torch.ones(1), "kv_scale": torch.ones(1)}
    scales[which] = torch.tensor([NAN])
    out, lse = sparse_mla_decode(q, kv, idx, return_lse=True, logit_cap=logit_cap, path="triton", **scales)
    r_out, r_lse = sparse_mla_decode(q, kv, idx, return_lse=True, logit_cap=logit_cap, path="reference", **scales)
    assert r_out.isnan().all() and r_lse.isnan().all()  # the reference's answer: the case is not vacuous
    assert out.isnan().all() and lse.isnan().all()


@interpreter
def test_public_function_non_finite_q_same_on_both_paths():
    q, kv, idx = _non_finite_case()
    a_out, a_lse = sparse_mla_decode(q, kv, idx, return_lse=True, path="triton")
    b_out, b_lse = sparse_mla_decode(q, kv, idx, return_lse=True, path="reference")
    assert torch.equal(a_lse.isnan(), b_lse.isnan()) and torch.equal(a_lse.isneginf(), b_lse.isneginf())
    torch.testing.assert_close(a_out, b_out, atol=2e-3, rtol=1e-2, equal_nan=True)


@interpreter
@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_nan_in_referenced_kv_gives_nan_without_warnings(num_kv_splits):
    """NaN in a referenced KV column gives NaN out, as the reference says, and the interpreter's numpy
    warnings ("All-NaN slice") stay inside the launch: under warnings-as-errors the call still returns."""
    import warnings

    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 16, 576, generator=g).bfloat16()
    kv = torch.randn(128, 576, generator=g).bfloat16()
    kv[:, 0] = NAN
    idx = torch.randint(0, 128, (3, 64), generator=g, dtype=torch.int32)
    if num_kv_splits > 1:
        idx = _spread(idx, 256)
        assert _splits_used(q, kv, idx, num_kv_splits) == num_kv_splits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = sparse_mla_decode_triton(q, kv, idx, num_kv_splits=num_kv_splits)
    r_out, r_lse = ref(q, kv, idx)
    assert torch.equal(out.isnan(), r_out.isnan()) and out.isnan().any()
    assert torch.equal(lse.isnan(), r_lse.isnan())


@interpreter
@pytest.mark.parametrize("num_kv_splits", [1, 2, 4])
def test_zero_weight_times_inf_value_is_nan_at_every_split_count(num_kv_splits):
    """An id whose score is -inf and whose value column is -inf gives that column NaN (0 * inf) at every split
    count, as the reference and the unsplit kernel do: token 0 holds it alone in one split beside finite ones (that
    split's LSE is -inf, its partial NaN), token 1 as its only valid id (every split empty but that one). Found by
    a fresh user's break test (twenty-seventh session): the combine dropped a split of weight 0 whatever its
    partial held."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16, 576, generator=g).bfloat16()
    q[..., 0] = 1.0
    kv = torch.randn(200, 576, generator=g).bfloat16()
    kv[7, 0] = -INF  # row 7: score -inf (q[..., 0] = 1) and value column 0 = -inf
    idx = torch.randint(8, 200, (2, 256), generator=g, dtype=torch.int32)
    idx[0, 64:128] = -1
    idx[0, 70] = 7
    idx[1] = -1
    idx[1, 3] = 7
    assert _splits_used(q, kv, idx, num_kv_splits) == num_kv_splits
    out, lse = sparse_mla_decode_triton(q, kv, idx, num_kv_splits=num_kv_splits)
    r_out, r_lse = ref(q, kv, idx)
    assert r_out[:, :, 0].isnan().all() and not r_out[:, :, 1:].isnan().any()
    assert torch.equal(out.isnan(), r_out.isnan())
    assert torch.equal(lse.isneginf(), r_lse.isneginf()) and lse[1].isneginf().all()
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2, equal_nan=True)


@interpreter
@pytest.mark.parametrize("logit_cap", [0.0, 5.0])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_infinite_q_with_a_per_tensor_fp8_cache_matches_the_reference(q_dtype, kv_dtype, logit_cap):
    """q = -inf in one column gives every score -inf: an empty row (or, capped, finite scores of -cap) as the
    reference gives. bf16 q over an e4m3 cache is scaled per head row into fp16 by a power of two from its largest
    |q|; an infinite largest |q| made the scale 0 and q * 0 NaN (a fresh user's break test, twenty-seventh
    session): the scale now comes from the largest finite |q|. A NaN in q stays NaN."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 576, generator=g)
    kv = torch.randn(16, 576, generator=g)
    kv[:, 5] = kv[:, 5].abs() + 0.5
    q[0, 0, 5] = -INF  # every score -inf
    q[0, 1, 9] = NAN  # NaN scores
    q[1, 2, 5] = -INF
    q[1, 2, 6] = 3e38 if q_dtype == torch.bfloat16 else 6e4  # the row's largest finite |q| beside the inf
    idx = torch.arange(8, dtype=torch.int32)[None].repeat(2, 1)
    kv_scale = torch.tensor([1.0])
    out, lse = sparse_mla_decode(q.to(q_dtype), kv.to(kv_dtype), idx, kv_scale=kv_scale, logit_cap=logit_cap,
                                 return_lse=True, path="triton")
    r_out, r_lse = ref(q.to(q_dtype), kv.to(kv_dtype), idx, kv_scale=kv_scale, logit_cap=logit_cap)
    assert torch.equal(lse.isnan(), r_lse.isnan()) and torch.equal(lse.isneginf(), r_lse.isneginf())
    assert torch.equal(out.isnan(), r_out.isnan())
    assert math.isnan(lse[0, 1]) and (math.isfinite(lse[0, 0]) if logit_cap else lse[0, 0] == -INF)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2, equal_nan=True)
    torch.testing.assert_close(lse.double(), r_lse.double(), atol=1e-4, rtol=1e-5, equal_nan=True)


# --------------------------------------------------------------------------------------------
# Bounds of sm_scale and logit_cap
# --------------------------------------------------------------------------------------------

TOO_BIG = [2.0 ** 126 * 1.0000001, 2.4e38, 3e38, 1e39]
TOO_SMALL = [2.0 ** -126 * 0.9999999, 1e-40]


def _small_call(T=2, H=4, N=16, topk=8):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(T, H, 576, generator=g).half(), torch.randn(N, 576, generator=g).half(),
            torch.randint(0, N, (T, topk), generator=g, dtype=torch.int32))


@pytest.mark.parametrize("value", TOO_BIG + TOO_SMALL)
def test_sm_scale_out_of_range_is_refused_everywhere(value):
    q, kv, idx = _small_call()
    with pytest.raises(ValueError, match=r"'sm_scale' must be a finite float in \[2\^-126, 2\^126\]"):
        sparse_mla_decode(q, kv, idx, sm_scale=value)
    with pytest.raises(ValueError, match=r"sm_scale'.*2\^126"):
        SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=8, sm_scale=value, platform=Platform("cpu"))
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=8)
    with pytest.raises(ValueError, match=r"sm_scale'.*2\^126"):
        run(spec, DecodeInputs(q, kv, idx, value))
    with pytest.raises(ValueError, match=r"sm_scale'.*2\^126"):
        prepare(spec, Platform("cpu"), sm_scale=value)
    with pytest.raises(ValueError, match=r"sm_scale'.*2\^126"):
        torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, None, value, None, None, None, False, 0.0, "")


@pytest.mark.parametrize("value", TOO_BIG + TOO_SMALL)
def test_positive_logit_cap_out_of_range_is_refused_everywhere(value):
    q, kv, idx = _small_call()
    match = r"'logit_cap' must be <= 0 \(no cap\) or in \[2\^-126, 2\^126\]"
    with pytest.raises(ValueError, match=match):
        sparse_mla_decode(q, kv, idx, logit_cap=value)
    with pytest.raises(ValueError, match=match):
        SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=8, logit_cap=value, platform=Platform("cpu"))
    with pytest.raises(ValueError, match=match):
        CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=8, logit_cap=value)
    with pytest.raises(ValueError, match=match):
        torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, None, 0.1, None, None, None, False, value, "")


def test_non_positive_logit_cap_means_no_cap_at_any_magnitude():
    for value in (0.0, -1.0, -1e300):
        assert CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=8, logit_cap=value).logit_cap == 0.0


@interpreter
def test_bounds_are_accepted_and_every_path_agrees_there():
    """At sm_scale = 2^126 (scores kept moderate by tiny q and k) and logit_cap = 2^126 or 2^-126, the
    Triton path (fp32 with log2(e) folded in) and the float64 reference give the same answer."""
    g = torch.Generator().manual_seed(2)
    q = (torch.randn(2, 4, 576, generator=g) * 2.0 ** -64).bfloat16()
    kv = (torch.randn(16, 576, generator=g) * 2.0 ** -60).bfloat16()
    idx = torch.randint(0, 16, (2, 8), generator=g, dtype=torch.int32)
    for sm_scale in (2.0 ** 126, 2.0 ** 120):
        a_out, a_lse = sparse_mla_decode(q, kv, idx, sm_scale=sm_scale, return_lse=True, path="triton")
        b_out, b_lse = sparse_mla_decode(q, kv, idx, sm_scale=sm_scale, return_lse=True, path="reference")
        assert a_lse.isfinite().all() and not a_out.isnan().any()
        torch.testing.assert_close(a_out, b_out, atol=2e-3, rtol=1e-2)
        torch.testing.assert_close(a_lse, b_lse, atol=1e-4, rtol=1e-5)
    q2, kv2, idx2 = _small_call()
    for cap in (2.0 ** 126, 2.0 ** -126, 30.0):
        a_out, a_lse = sparse_mla_decode(q2, kv2, idx2, logit_cap=cap, return_lse=True, path="triton")
        b_out, b_lse = sparse_mla_decode(q2, kv2, idx2, logit_cap=cap, return_lse=True, path="reference")
        assert a_lse.isfinite().all() and not a_out.isnan().any()
        torch.testing.assert_close(a_out, b_out, atol=2e-3, rtol=1e-2)
        torch.testing.assert_close(a_lse, b_lse, atol=1e-4, rtol=1e-5)
    b_out, _ = sparse_mla_decode(q, kv, idx, sm_scale=2.0 ** -126, path="reference")  # the lower bound runs
    assert b_out.isfinite().all()


@interpreter
@pytest.mark.parametrize("sm_scale,cap", [(2.0 ** 126, 2.0 ** 126), (2.0 ** 126, 2.0 ** -126), (2.0 ** 120, 2.0 ** 100),
                                          (2.0 ** -126, 2.0 ** 126)])
def test_soft_cap_keeps_scores_apart_where_the_scaled_product_overflows(sm_scale, cap):
    """``sm_scale * q.k`` beyond fp32 (5 * 2^126 and 30 * 2^126 here) with a cap that makes the scores finite: the
    kernel forms the cap's argument as ``q.k * (sm_scale / cap)``, so the two ids keep the reference's different
    weights (before: both overflowed to +inf, were capped to the same score and got half the weight each). With a
    ratio beyond fp32 (2^252) both ids reach the cap, as in the reference; at 2^-252 the scores are ~0, as there."""
    q = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    q[0, 0, 0] = 1.0
    kv = torch.zeros(3, 576, dtype=torch.bfloat16)
    kv[0, 0], kv[1, 0], kv[2, 0] = 5.0, 30.0, 0.0  # q.k = 5, 30 and 0 (a zero product stays finite)
    kv[0, 1], kv[1, 2], kv[2, 3] = 1.0, 1.0, 1.0  # the values tell the ids apart
    idx = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    a_out, a_lse = sparse_mla_decode(q, kv, idx, sm_scale=sm_scale, logit_cap=cap, return_lse=True, path="triton")
    b_out, b_lse = sparse_mla_decode(q, kv, idx, sm_scale=sm_scale, logit_cap=cap, return_lse=True, path="reference")
    assert a_out.isfinite().all() and a_lse.isfinite().all()
    torch.testing.assert_close(a_out.float(), b_out.float(), atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(a_lse, b_lse, atol=1e-4 * max(1.0, abs(float(b_lse))), rtol=1e-5)


FP8 = torch.float8_e4m3fn


@interpreter
@pytest.mark.parametrize("q_fp8,sm_scale,q_scale,kv_scale", [
    (True, 2.0 ** 126, 8.0, 2.0 ** -106),    # sm_scale * q_scale = 2^129 overflows fp32, the whole factor is 2^23
    (False, 2.0 ** 126, None, 8.0),          # the factor 2^129 overflows, q's row scale (tiny q) brings it back
])
def test_per_tensor_scales_fold_without_an_intermediate_overflow(q_fp8, sm_scale, q_scale, kv_scale):
    """fp8 inputs: the portable kernel folds ``sm_scale * q_scale * kv_scale`` (and, for bf16 q on an e4m3 cache,
    the inverse of q's power-of-two row scale) in float64 and rounds the factor to fp32 once. Folded in fp32 in
    that order, an intermediate product overflowed to inf (every ``out`` and ``lse`` NaN) where
    the whole factor is an ordinary fp32 number and the reference's scores are finite (a break test, fortieth
    session)."""
    g = torch.Generator().manual_seed(0)
    if q_fp8:
        q = torch.randn(2, 3, 576, generator=g).to(FP8)
    else:
        q = (torch.randn(2, 3, 576, generator=g) * 2.0 ** -126).bfloat16()  # bf16 subnormals: a tiny q row
    kv = torch.randn(16, 576, generator=g).to(FP8)
    idx = torch.randint(-2, 18, (2, 8), generator=g, dtype=torch.int32)
    kw = dict(sm_scale=sm_scale, kv_scale=torch.tensor([kv_scale]),
              q_scale=None if q_scale is None else torch.tensor([q_scale]))
    a_out, a_lse = sparse_mla_decode(q, kv, idx, return_lse=True, path="triton", **kw)
    b_out, b_lse = ref(q, kv, idx, **kw)
    assert b_lse.isfinite().all() and a_lse.isfinite().all() and a_out.isfinite().all()
    torch.testing.assert_close(a_lse.double(), b_lse.double(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(a_out.double(), b_out.double(), atol=2e-2 * float(b_out.abs().max()), rtol=1e-2)


# --------------------------------------------------------------------------------------------
# T = 0 (topk, N, H >= 1 are required; no token is fine)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["reference", pytest.param("triton", marks=interpreter)])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_zero_tokens(path, with_sinks):
    q = torch.empty(0, 4, 576, dtype=torch.bfloat16)
    kv = torch.randn(8, 576).bfloat16()
    idx = torch.empty(0, 16, dtype=torch.int32)
    sinks = torch.zeros(4) if with_sinks else None
    out, lse = sparse_mla_decode(q, kv, idx, sinks, return_lse=True, path=path)
    assert out.shape == (0, 4, 512) and out.dtype == torch.bfloat16 and lse.shape == (0, 4)
    buf = torch.empty(0, 4, 512, dtype=torch.bfloat16)
    out, lse = sparse_mla_decode(q, kv, idx, sinks, out=buf, path=path)
    assert out is buf and (lse is None) == (not with_sinks)
    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=16, sinks=sinks, path=path,
                            platform=Platform("cpu"))
    out, lse = layer(q, kv, idx)
    assert out.shape == (0, 4, 512) and (lse is None) == (not with_sinks) and (lse is None or lse.shape == (0, 4))


@pytest.mark.parametrize("q_shape,kv_shape,idx_shape,arg", [
    ((2, 0, 576), (8, 576), (2, 4), "'q'"),
    ((2, 4, 576), (0, 576), (2, 4), "'kv_cache'"),
    ((2, 4, 576), (8, 576), (2, 0), "'indices'"),
])
def test_zero_heads_rows_or_topk_are_refused(q_shape, kv_shape, idx_shape, arg):
    with pytest.raises(ValueError, match=arg):
        sparse_mla_decode(torch.zeros(q_shape, dtype=torch.bfloat16), torch.zeros(kv_shape, dtype=torch.bfloat16),
                          torch.zeros(idx_shape, dtype=torch.int32))
