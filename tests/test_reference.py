"""The float64 reference against hand-computed values and the LSE algebra it must satisfy."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_sink.core.lse import apply_sink, merge_states
from mla_sink.core.kv_layout import quantize_kv_cache
from mla_sink.core.reference import sparse_mla_decode_reference as ref


def one_head_two_keys():
    """q.k1 = 2, q.k2 = 0 with sm_scale 1; v1 = 1, v2 = 3 in column 0."""
    q = torch.zeros(1, 1, 576, dtype=torch.float16)
    q[0, 0, 0] = 1.0
    kv = torch.zeros(3, 576, dtype=torch.float16)
    kv[0, 0] = 2.0   # k1 . q = 2, v1[0] = 2
    kv[1, 1] = 3.0   # k2 . q = 0, v2[1] = 3
    kv[2] = float("nan")  # never referenced
    idx = torch.tensor([[0, 1]], dtype=torch.int32)
    return q, kv, idx


def test_hand_computed_without_sink():
    q, kv, idx = one_head_two_keys()
    out, lse = ref(q, kv, idx, sm_scale=1.0)
    z = math.exp(2) + 1.0
    assert lse.item() == pytest.approx(math.log(z), abs=1e-6)
    assert out[0, 0, 0].item() == pytest.approx(2 * math.exp(2) / z, rel=1e-12)
    assert out[0, 0, 1].item() == pytest.approx(3 * 1 / z, rel=1e-12)
    assert not out.isnan().any()


def test_any_real_sm_scale_and_logit_cap():
    """The reference takes every real the library takes for ``sm_scale`` and ``logit_cap`` (a Fraction, a numpy
    scalar) as the float it is (a fresh user's break test: ``Tensor * Fraction`` raised a TypeError)."""
    from fractions import Fraction

    import numpy as np

    q, kv, idx = one_head_two_keys()
    want_out, want_lse = ref(q, kv, idx, sm_scale=0.5, logit_cap=0.75)
    for sm_scale, cap in ((Fraction(1, 2), Fraction(3, 4)), (np.float32(0.5), np.float64(0.75))):
        out, lse = ref(q, kv, idx, sm_scale=sm_scale, logit_cap=cap)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("kw,name", [(dict(sm_scale=float("nan")), "sm_scale"), (dict(sm_scale=-0.125), "sm_scale"),
                                     (dict(sm_scale=0.0), "sm_scale"), (dict(sm_scale=float("inf")), "sm_scale"),
                                     (dict(sm_scale="0.125"), "sm_scale"), (dict(sm_scale=10 ** 400), "sm_scale"),
                                     (dict(logit_cap=float("inf")), "logit_cap"), (dict(logit_cap=True), "logit_cap"),
                                     (dict(logit_cap=None), "logit_cap"), (dict(logit_cap=float("nan")), "logit_cap")])
def test_scalars_the_library_refuses_are_refused_by_name(kw, name):
    """The reference checks ``sm_scale`` and ``logit_cap`` as the library does (a second break test: it returned
    NaN for an infinite cap or a NaN scale, and took a string or a bool), before anything is gathered."""
    q, kv, idx = one_head_two_keys()
    with pytest.raises(ValueError, match=f"'{name}' must be"):
        ref(q, kv, idx, **kw)


def test_hand_computed_with_known_sink():
    q, kv, idx = one_head_two_keys()
    sink = 1.5
    out, lse = ref(q, kv, idx, torch.tensor([sink]), sm_scale=1.0)
    z = math.exp(2) + 1.0
    denom = z + math.exp(sink)
    assert lse.item() == pytest.approx(math.log(z), abs=1e-6)  # sink excluded from the LSE
    assert out[0, 0, 0].item() == pytest.approx(2 * math.exp(2) / denom, rel=1e-12)
    assert out[0, 0, 1].item() == pytest.approx(3 / denom, rel=1e-12)


@pytest.mark.parametrize("sink,factor", [(float("-inf"), 1.0), (float("inf"), 0.0)])
def test_infinite_sinks(sink, factor):
    q, kv, idx = one_head_two_keys()
    base, _ = ref(q, kv, idx, sm_scale=1.0)
    out, _ = ref(q, kv, idx, torch.tensor([sink]), sm_scale=1.0)
    torch.testing.assert_close(out, base * factor, rtol=0, atol=0)


@pytest.mark.parametrize("sink", [float("-inf"), 0.0, float("inf")])
def test_empty_rows_give_zero_and_neg_inf(sink):
    q, kv, idx = one_head_two_keys()
    idx = torch.tensor([[-1, 3]], dtype=torch.int32)  # -1 and an id == N
    out, lse = ref(q, kv, idx, torch.tensor([sink]), sm_scale=1.0)
    assert torch.isneginf(lse).all()
    assert (out == 0).all()


def test_invalid_ids_anywhere_are_skipped_and_nan_rows_never_leak():
    torch.manual_seed(0)
    q = torch.randn(3, 2, 576).half()
    kv = torch.randn(16, 576).half()
    kv[7] = float("nan")
    kv[0] = float("nan")  # row 0 too: an invalid id's slot must not gather it unmasked (a mutation audit,
    # forty-seventh session: the reference's invalid slots gather row 0 before their weight is zeroed)
    messy = torch.tensor([[-1, 1, 2, 16], [1, -5, 2, 3], [1, 2**31 - 1, -1, 2]], dtype=torch.int32)
    out, lse = ref(q, kv, messy)
    assert not out.isnan().any()
    for t, ids in enumerate(([1, 2], [1, 2, 3], [1, 2])):
        o1, l1 = ref(q[t:t + 1], kv, torch.tensor([ids], dtype=torch.int32))
        torch.testing.assert_close(out[t:t + 1], o1)
        torch.testing.assert_close(lse[t:t + 1], l1)


def test_topk_length_uses_leading_ids_only():
    torch.manual_seed(1)
    q = torch.randn(2, 3, 576).half()
    kv = torch.randn(20, 576).half()
    idx = torch.randint(0, 20, (2, 6), dtype=torch.int32)
    out, lse = ref(q, kv, idx, topk_length=torch.tensor([4, 0], dtype=torch.int32))
    o4, l4 = ref(q[:1], kv, idx[:1, :4])
    torch.testing.assert_close(out[:1], o4)
    torch.testing.assert_close(lse[:1], l4)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()


def test_logit_cap_bounds_scores():
    q, kv, idx = one_head_two_keys()
    out, lse = ref(q, kv, idx, sm_scale=1.0, logit_cap=1.0)
    z = math.exp(math.tanh(2.0)) + 1.0
    assert lse.item() == pytest.approx(math.log(z), abs=1e-6)
    # a cap other than 1, where cap * tanh(s / cap) differs from tanh(s), cap * tanh(s) and tanh(s / cap) (at cap 1
    # they coincide: a mutation audit, forty-seventh session)
    out, lse = ref(q, kv, idx, sm_scale=1.0, logit_cap=5.0)
    z = math.exp(5.0 * math.tanh(2.0 / 5.0)) + 1.0
    assert lse.item() == pytest.approx(math.log(z), abs=1e-6)


def test_fp8_scales_dequantise():
    torch.manual_seed(2)
    q = torch.randn(2, 2, 576).half()
    kv32 = torch.randn(10, 576)
    kv8 = (kv32 / 0.05).to(torch.float8_e4m3fn)
    idx = torch.randint(0, 10, (2, 5), dtype=torch.int32)
    out, lse = ref(q, kv8, idx, kv_scale=torch.tensor([0.05]))
    out_h, lse_h = ref(q, (kv8.double() * 0.05), idx)
    torch.testing.assert_close(out, out_h)
    torch.testing.assert_close(lse, lse_h)


def test_merge_known_numbers():
    """Normalisers 2 and 8, outputs 0 and 10 merge to 8 (a base-2 mix-up gives about 7.23)."""
    outs = [torch.tensor([[0.0]]), torch.tensor([[10.0]])]
    lses = [torch.tensor([math.log(2)]), torch.tensor([math.log(8)])]
    out, lse = merge_states(outs, lses)
    assert out.item() == pytest.approx(8.0, abs=1e-6)
    assert lse.item() == pytest.approx(math.log(10), abs=1e-6)


def test_merge_of_empty_parts():
    nan_out = torch.full((1, 2), float("nan"))
    out, lse = merge_states([nan_out, torch.ones(1, 2)], [torch.tensor([-math.inf]), torch.tensor([0.0])])
    torch.testing.assert_close(out, torch.ones(1, 2))
    out, lse = merge_states([nan_out, nan_out], [torch.tensor([-math.inf])] * 2)
    assert (out == 0).all() and torch.isneginf(lse).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), topk=st.integers(1, 24), heads=st.integers(1, 5),
       split=st.integers(0, 24), sink=st.one_of(st.none(), st.floats(-30, 30)))
def test_merge_property_split_ids_equals_whole(seed, topk, heads, split, sink):
    """Splitting a row's ids into two sets and merging the two (out, lse) by LSE equals the whole."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, 576, generator=g).half()
    kv = torch.randn(32, 576, generator=g).half()
    idx = torch.randint(-2, 34, (2, topk), generator=g, dtype=torch.int32)
    cut = min(split, topk)
    a, b = idx.clone(), idx.clone()
    a[:, cut:] = -1
    b[:, :cut] = -1
    whole_out, whole_lse = ref(q, kv, idx)
    (oa, la), (ob, lb) = ref(q, kv, a), ref(q, kv, b)
    out, lse = merge_states([oa, ob], [la, lb])
    torch.testing.assert_close(lse, whole_lse, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.double(), whole_out, atol=1e-5, rtol=1e-5)
    if sink is not None:
        sinks = torch.full((heads,), sink)
        ws, _ = ref(q, kv, idx, sinks)
        torch.testing.assert_close(apply_sink(out.double(), lse, sinks), ws, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case,match", [
    ("ds_width", r"'kv_cache' must be uint8 \[N, 656\].*shape \(64, 655\)"),
    ("tokens", r"'indices' must be integer \[T=2, topk\].*shape \(1, 16\)"),
    ("sinks", r"'sinks' must be None or a \[H=16\] tensor \(got \(3,\)\)"),
    ("kv_width", r"'kv_cache' must be \[N, 576\].*shape \(64, 512\)"),
    ("float_ids", r"'indices' must be integer.*torch.float32"),
    ("q_2d", r"'q' must be \[T, H, d_qk\] \(got shape \(16, 576\)\)"),
    ("topk_length", r"'topk_length' must be None or a \[T=2\] tensor"),
    ("kv_meta", r"'kv_cache' must be on q's device cpu \(got meta\)"),  # torch's error named no argument
    ("sinks_meta", r"'sinks' must be on q's device cpu \(got meta\)"),
    ("kv_scale_meta", r"'kv_scale' must be on q's device cpu \(got meta\)"),
])
def test_bad_shapes_name_the_argument_before_any_gather(case, match):
    """The reference is public: a shape that does not fit raises a ValueError naming the argument and the
    shape it got (not a reshape error, nor the shape of the gathered rows)."""
    q = torch.randn(2, 16, 576)
    kv = torch.randn(64, 576)
    idx = torch.randint(0, 64, (2, 16), dtype=torch.int32)
    sinks = torch.randn(16)
    args = dict(q=q, kv_cache=kv, indices=idx, sinks=sinks)
    kwargs = {}
    if case == "ds_width":
        args["kv_cache"] = torch.zeros(64, 655, dtype=torch.uint8)
    elif case == "tokens":
        args["indices"] = idx[:1]
    elif case == "sinks":
        args["sinks"] = sinks[:3]
    elif case == "kv_width":
        args["kv_cache"] = kv[:, :512]
    elif case == "float_ids":
        args["indices"] = idx.float()
    elif case == "q_2d":
        args["q"] = q[0]
    elif case == "kv_scale_meta":
        args["kv_cache"] = kv.to(torch.float8_e4m3fn)
        kwargs["kv_scale"] = torch.ones(1, device="meta")
    elif case.endswith("_meta"):
        name = {"kv": "kv_cache", "sinks": "sinks"}[case[:-5]]
        args[name] = args[name].to("meta")
    else:
        kwargs["topk_length"] = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        ref(args["q"], args["kv_cache"], args["indices"], args["sinks"], **kwargs)


@pytest.mark.parametrize("kwargs,text", [
    (dict(d_v=-1), "'d_v' must be an int in [1, 576]"), (dict(d_v=577), "'d_v' must be an int in [1, 576]"),
    (dict(d_v=0), "'d_v' must be an int in [1, 576]"),
    (dict(compute_dtype=torch.int32), "'compute_dtype' must be torch.float64 (the reference) or torch.float32"),
    (dict(compute_dtype=None), "'compute_dtype' must be torch.float64"),
    (dict(compute_dtype=torch.float8_e4m3fn), "'compute_dtype' must be torch.float64"),
    (dict(q_scale=torch.ones(1, 1)), "'q_scale' must be None or a one-element tensor, shape [1] or []"),
    (dict(out_dtype=torch.int64), "'out_dtype' must be None or a floating-point torch dtype"),
    (dict(q_scale=torch.ones(2)), "'q_scale' must be None or a one-element tensor"),
    (dict(kv_scale=1.0), "'kv_scale' must be None or a one-element tensor"),
    (dict(chunk_bytes=0), "'chunk_bytes' must be an int >= 1"),
])
def test_reference_refuses_bad_extra_arguments(kwargs, text):
    """``d_v=-1`` returned 575 columns, ``compute_dtype=torch.int32`` raised from ``torch.finfo`` and a two-element
    ``q_scale`` a reshape error (break test, thirty-second session): each is a ValueError naming the argument."""
    q = torch.randn(1, 2, 576).bfloat16()
    kv = torch.randn(8, 576).bfloat16()
    idx = torch.tensor([[0, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape(text)):
        ref(q, kv, idx, **kwargs)


def test_reference_takes_numpy_integers_and_both_compute_dtypes():
    """The new argument checks keep what worked: numpy integers for ``d_v`` and ``chunk_bytes`` (a third break test
    found them refused for a while), float32 compute (the fallback path's), scales of shape ``[1]`` and ``[]``."""
    import numpy as np

    q = torch.randn(1, 2, 576).bfloat16()
    kv = torch.randn(8, 576).bfloat16()
    idx = torch.tensor([[0, 3]], dtype=torch.int32)
    a, la = ref(q, kv, idx, d_v=np.int64(512), chunk_bytes=np.int64(4096))
    b, lb = ref(q, kv, idx, compute_dtype=torch.float32)
    assert torch.allclose(a.float(), b.float(), atol=1e-5) and torch.allclose(la, lb, atol=1e-5)
    q8, k8 = q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn)
    c, _ = ref(q8, k8, idx, q_scale=torch.ones(1), kv_scale=torch.tensor(1.0))
    assert c.shape == (1, 2, 512) and c.isfinite().all()
    # any float8 dtype takes its scale, those the library refuses too (e5m2: a fourth break test)
    d, _ = ref(q.to(torch.float8_e5m2), k8, idx, q_scale=torch.tensor([0.5]), kv_scale=torch.tensor(1.0))
    assert d.shape == (1, 2, 512) and d.isfinite().all()


@pytest.mark.parametrize("shape,dtype", [((0, 656), torch.uint8), ((0, 64, 656), torch.uint8),
                                         ((5, 0, 656), torch.uint8), ((0, 576), torch.bfloat16)],
                         ids=["ds_flat", "ds_no_blocks", "ds_block_size_0", "bf16"])
def test_reference_serves_a_pool_of_no_rows(shape, dtype):
    """An empty pool (an empty DCP shard) gathered row 0 as every invalid id's placeholder and raised IndexError or
    ZeroDivisionError (break test, thirty-third session): every id is invalid, so every row is empty."""
    q = torch.randn(2, 3, 576).bfloat16()
    idx = torch.tensor([[-1, 0, 7], [5, -1, -1]], dtype=torch.int32)
    out, lse = ref(q, torch.zeros(shape, dtype=dtype), idx)
    assert out.shape == (2, 3, 512) and (out == 0).all() and torch.isneginf(lse).all()
    out, lse = ref(q, torch.zeros(shape, dtype=dtype), idx, torch.tensor([0.5, -float("inf"), float("inf")]))
    assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("case,text", [
    ("ds_kv_scale", "'kv_scale' must be None with a fp8_ds_mla kv_cache: its scales are in the rows"),
    ("bf16_q_scale", "'q_scale' must be None with q in torch.bfloat16 (scales apply to the float8 dtypes only)"),
    ("bf16_kv_scale", "'kv_scale' must be None with kv_cache in torch.bfloat16"),
    ("bool_ids", "'indices' must be integer [T=1, topk] (got torch.bool"),
    ("complex_ids", "'indices' must be integer [T=1, topk] (got torch.complex64"),
])
def test_reference_refuses_calls_the_library_refuses(case, text):
    """A kv_scale beside a V3.2 cache was applied (a result no library call returns), and bool or complex ids were
    read as 0 / 1 or their real part (break test, thirty-third session)."""
    q = torch.randn(1, 2, 576).bfloat16()
    kv = torch.randn(8, 576).bfloat16()
    idx = torch.tensor([[0, 3]], dtype=torch.int32)
    kwargs = {}
    if case == "ds_kv_scale":
        kv, kwargs = quantize_kv_cache(kv.float()), dict(kv_scale=torch.ones(1))
    elif case == "bf16_q_scale":
        kwargs = dict(q_scale=torch.ones(1))
    elif case == "bf16_kv_scale":
        kwargs = dict(kv_scale=torch.ones(1))
    elif case == "bool_ids":
        idx = idx > 1
    else:
        idx = idx.to(torch.complex64)
    with pytest.raises(ValueError, match=re.escape(text)):
        ref(q, kv, idx, **kwargs)


@pytest.mark.parametrize("paged", [False, True], ids=["bf16", "fp8_ds_mla-paged"])
def test_fake_tensors_outside_their_mode_get_fake_outputs_of_the_call_shapes(paged):
    """FakeTensors used after their ``FakeTensorMode`` was left: the reference enters it and infers the shapes (its
    own zeros and ids were real tensors beside them: PyTorch's "Please convert all Tensors" AssertionError)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(2, 3, 576, dtype=torch.bfloat16)
        kv = torch.zeros(2, 64, 656, dtype=torch.uint8) if paged else torch.randn(16, 576, dtype=torch.bfloat16)
        idx, sinks, length = torch.zeros(2, 4, dtype=torch.int32), torch.zeros(3), torch.ones(2, dtype=torch.int32)
    out, lse = ref(q, kv, idx, sinks, topk_length=length, out_dtype=torch.bfloat16)
    assert isinstance(out, FakeTensor) and isinstance(lse, FakeTensor)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((2, 3, 512), torch.bfloat16, (2, 3), torch.float32)


CASES_OF_KINDS = ("fake q, real kv_cache", "real q, fake indices", "two fake modes", "meta q, real sinks")


@pytest.mark.parametrize("case", CASES_OF_KINDS)
def test_tensors_with_and_without_data_are_not_mixed(case):
    """Every tensor of q's kind - with data, meta, or fake in q's mode - else a ValueError naming the first that is
    not, on the reference and the function alike (a break test, forty-sixth session: PyTorch's "Please convert all
    Tensors to FakeTensors" or "Mixing fake modes" AssertionError). A meta tensor beside a real q, or the reverse, is
    also a device mismatch, which either check may name first."""
    import mla_sink
    from torch._subclasses.fake_tensor import FakeTensorMode

    def call(mode=None, device=None):
        with mode if mode is not None else torch.device(device or "cpu"):
            return [torch.randn(2, 3, 576).bfloat16(), torch.randn(16, 576).bfloat16(),
                    torch.zeros(2, 4, dtype=torch.int32), torch.zeros(3)]

    fake, other, real = call(FakeTensorMode()), call(FakeTensorMode()), call()
    args, message = {
        "fake q, real kv_cache": ([fake[0], real[1], fake[2], fake[3]], r"'kv_cache' must be a FakeTensor of q's "
                                  r"FakeTensorMode like q \(got a tensor with data"),
        "real q, fake indices": ([real[0], real[1], fake[2], real[3]],
                                 r"'indices' must (be a tensor with data|hold data) like q \(got a FakeTensor"),
        "two fake modes": ([fake[0], other[1], fake[2], fake[3]], r"'kv_cache' must be a FakeTensor of q's "
                           r"FakeTensorMode like q \(got a FakeTensor of another FakeTensorMode"),
        "meta q, real sinks": (call(device="meta")[:3] + [real[3]], r"'sinks' must (be a meta tensor like q \(got a "
                               r"tensor with data|be on q's device meta)"),
    }[case]
    for fn in (ref, mla_sink.sparse_mla_decode):
        with pytest.raises(ValueError, match=message):
            fn(*args)
