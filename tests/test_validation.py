"""Every malformed call is a ValueError naming the argument, raised before any kernel runs."""

from __future__ import annotations

import decimal
import re

import pytest
import torch

from mla_sink import CallSpec, Platform, SparseMLADecode, prepare, sparse_mla_decode
from mla_sink.core.validate import check_inputs


def good(T=2, H=4, N=32, topk=8, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16):
    q = torch.randn(T, H, 576).to(q_dtype)
    kv = torch.randn(N, 576).to(kv_dtype)
    idx = torch.randint(0, N, (T, topk), dtype=torch.int32)
    return dict(q=q, kv_cache=kv, indices=idx)


BAD = [
    # (mutation, argument named in the message)
    (lambda x: x.update(sinks=torch.zeros(4, dtype=torch.bfloat16)), "sinks"),
    (lambda x: x.update(sinks=torch.zeros(4, 1)), "sinks"),
    (lambda x: x.update(sinks=torch.zeros(5)), "sinks"),
    (lambda x: x.update(sinks=torch.zeros(4, device="meta")), "sinks"),
    (lambda x: x.update(q=torch.randn(2, 4, 512).bfloat16()), "q"),
    (lambda x: x.update(q=torch.randn(2, 576).bfloat16()), "q"),
    (lambda x: x.update(q=torch.randn(2, 4, 576)), "q"),
    (lambda x: x.update(q=torch.randn(2, 4, 576 * 2).bfloat16()[..., ::2]), "q"),
    (lambda x: x.update(kv_cache=torch.randn(32, 1, 576).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(32, 512).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(0, 576).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(32, 576).half()), "(q dtype, kv_cache dtype)"),
    (lambda x: x.update(indices=x["indices"].long()), "indices"),
    (lambda x: x.update(indices=x["indices"][0]), "indices"),
    (lambda x: x.update(indices=x["indices"][:1]), "indices"),
    (lambda x: x.update(indices=torch.zeros(2, 0, dtype=torch.int32)), "indices"),
    (lambda x: x.update(indices=x["indices"].to("meta")), "indices"),
    (lambda x: x.update(sm_scale=0.0), "sm_scale"),
    (lambda x: x.update(sm_scale=float("inf")), "sm_scale"),
    (lambda x: x.update(topk_length=torch.zeros(2, dtype=torch.int64)), "topk_length"),
    (lambda x: x.update(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length"),
    (lambda x: x.update(topk_length=[8, 8]), "topk_length"),
    (lambda x: x.update(kv_scale=torch.ones(1)), "kv_scale"),
    (lambda x: x.update(out=torch.empty(2, 4, 512)), "out"),
    (lambda x: x.update(out=torch.empty(2, 4, 576, dtype=torch.bfloat16)), "out"),
]


@pytest.mark.parametrize("mutate,arg", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_argument(mutate, arg):
    x = good()
    mutate(x)
    name = re.escape(arg) if arg.startswith("(") else f"'{arg}'"  # a pair as written, else the name in quotes (an
    # optional quote let any message holding the letter q pass for q: a mutation audit, forty-seventh session)
    with pytest.raises(ValueError, match=name) as info:
        sparse_mla_decode(**x)
    assert "got" in str(info.value)


def test_fp8_without_scales_is_rejected():
    x = good(kv_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'kv_scale' is required"):
        sparse_mla_decode(**x)
    x = good(q_dtype=torch.float8_e4m3fn, kv_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'q_scale' is required"):
        sparse_mla_decode(**x, kv_scale=torch.ones(1))
    for bad in (torch.ones(2), torch.ones(1, 1), torch.ones(1, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"'kv_scale' must be float32 of shape \[1\] or \[\]"):
            sparse_mla_decode(**x, q_scale=torch.ones(1), kv_scale=bad)


def test_zero_dim_scales_are_accepted():
    from mla_sink.core.reference import sparse_mla_decode_reference as ref

    x = good(kv_dtype=torch.float8_e4m3fn)
    got, _ = sparse_mla_decode(**x, kv_scale=torch.tensor(0.5), path="reference")
    want, _ = ref(x["q"], x["kv_cache"], x["indices"], kv_scale=torch.tensor([0.5]))
    torch.testing.assert_close(got.double(), want, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("kw,message", [
    (dict(return_lse=None), "'return_lse' must be a bool"),
    (dict(logit_cap="5"), "'logit_cap' must be a finite float"),
    (dict(logit_cap=float("nan")), "'logit_cap' must be a finite float"),
    (dict(sm_scale="0.1"), "'sm_scale' must be a finite float in \\[2\\^-126, 2\\^126\\]"),
    (dict(sm_scale=1e-40), "'sm_scale' must be a finite float in \\[2\\^-126, 2\\^126\\]"),
    (dict(sm_scale=3e38), "'sm_scale' must be a finite float in \\[2\\^-126, 2\\^126\\]"),
    (dict(logit_cap=3.5e38), "'logit_cap' must be <= 0 \\(no cap\\) or in \\[2\\^-126, 2\\^126\\]"),
    (dict(path=["triton"]), "'path' must be"),
])
def test_scalar_options_are_named_as_passed(kw, message):
    with pytest.raises(ValueError, match=message):
        sparse_mla_decode(**good(), **kw)


@pytest.mark.parametrize("name", ["sm_scale", "logit_cap"])
@pytest.mark.parametrize("value,kind", [(decimal.Decimal("0.04"), "decimal.Decimal"), ("0.1", "str"), (True, "bool"),
                                        (torch.tensor(0.1), "torch.Tensor")])
def test_a_scalar_option_of_a_refused_type_names_its_type(name, value, kind):
    """A finite ``Decimal`` read as "must be a finite float (got Decimal('0.04'))" alone, as if its value were the
    trouble: the error names the type that is refused and what to pass (a break test, sixty-ninth session)."""
    with pytest.raises(ValueError, match=rf"^'{name}' must be a finite float.*, a {kind}: pass a Python or numpy "
                                         rf"int or float\)$"):
        sparse_mla_decode(**good(), **{name: value})


def test_a_refused_real_value_names_no_type():
    with pytest.raises(ValueError, match=r"got 1e-40\)$"):
        sparse_mla_decode(**good(), sm_scale=1e-40)


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    x = good()
    a, _ = sparse_mla_decode(**x, sm_scale=np.float32(0.05), logit_cap=np.float64(4.0), path="reference")
    b, _ = sparse_mla_decode(**x, sm_scale=0.05, logit_cap=4.0, path="reference")
    torch.testing.assert_close(a, b)


def test_non_tensor_is_rejected():
    x = good()
    x["q"] = x["q"].tolist()
    with pytest.raises(ValueError, match="'q' must be a torch.Tensor"):
        check_inputs(**x)


def test_non_contiguous_q_with_unit_inner_stride_is_accepted():
    x = good()
    x["q"] = torch.randn(4, 2, 576).bfloat16().transpose(0, 1)  # [T=2, H=4, 576], non-contiguous
    check_inputs(**x)


def test_prepare_checks_sinks_without_call_tensors():
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8, sinks=True)
    with pytest.raises(ValueError, match="'sinks' must be float32"):
        prepare(s, Platform("cpu"), sinks=torch.zeros(4, dtype=torch.float16))
    assert prepare(s, Platform("cpu"), sinks=torch.zeros(8)[::2]).path  # any stride (forty-second session)
    with pytest.raises(ValueError, match="spec.sinks is False"):
        prepare(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8), Platform("cpu"), sinks=torch.zeros(4))
    assert prepare(s, Platform("cpu", triton=False), sinks=torch.zeros(4)).path == "reference"


@pytest.mark.parametrize("sinks", [[0.0] * 4, 0.0, (0.0,) * 4])
def test_sinks_that_are_not_a_tensor_are_refused_before_the_platform_is_detected(sinks):
    """Without a platform, ``prepare`` and the layer detect it from the sinks' device; sinks that are not a tensor are
    refused by name first (a break test, forty-eighth session: ``AttributeError: 'list' object has no attribute
    'device'``)."""
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8, sinks=True)
    kind = type(sinks).__name__
    with pytest.raises(ValueError, match=rf"'sinks' must be a torch.Tensor \(got {kind}\)"):
        prepare(s, sinks=sinks)
    with pytest.raises(ValueError, match=rf"'sinks' must be a torch.Tensor \(got {kind}\)"):
        SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=sinks)


def test_layer_rejects_at_construction():
    with pytest.raises(ValueError, match="'sinks' must have num_heads=8"):
        SparseMLADecode(num_heads=8, q_dtype="bf16", kv_dtype="bf16", topk=64, sinks=torch.zeros(4),
                        platform=Platform("cpu"))
    with pytest.raises(ValueError, match="'num_heads'"):
        SparseMLADecode(num_heads=0, q_dtype="bf16", kv_dtype="bf16", topk=64, platform=Platform("cpu"))
    from mla_sink import NoKernelError

    with pytest.raises(NoKernelError, match="sm89"):
        SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="fp8_e4m3", topk=64, platform=Platform("sm80"))


def test_spec_tensor_mismatch_is_rejected():
    from mla_sink import DecodeInputs, run

    x = good()
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=8, topk=8)
    with pytest.raises(ValueError, match="num_heads=4"):
        run(s, DecodeInputs(sm_scale=0.1, **x))


def test_platform_must_describe_the_tensors_device():
    from mla_sink import DecodeInputs, run

    x = good()
    s = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8)
    with pytest.raises(ValueError, match="'platform' describes arch 'gfx942'"):
        run(s, DecodeInputs(sm_scale=0.1, **x), platform=Platform("gfx942", "0.1.20"))


def test_logit_cap_of_spec_and_inputs_must_agree():
    from mla_sink import DecodeInputs, run
    from mla_sink.core.reference import sparse_mla_decode_reference as ref

    x = good(q_dtype=torch.float16, kv_dtype=torch.float16)
    s = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=8, logit_cap=5.0)
    out, _ = run(s, dict(x), path="reference")  # the spec's cap is used when the inputs give none
    r_out, _ = ref(x["q"], x["kv_cache"], x["indices"], logit_cap=5.0)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)
    with pytest.raises(ValueError, match="disagrees with spec.logit_cap"):
        run(s, DecodeInputs(sm_scale=0.04, logit_cap=3.0, **x))


def test_out_sharing_memory_with_an_input_is_rejected():
    x = good()
    kv2 = torch.randn(64, 576).bfloat16()
    x["kv_cache"] = kv2
    x["indices"] = torch.randint(0, 64, (2, 8), dtype=torch.int32)
    bad_out = kv2[:8].view(2, 4, 576)[..., :512]
    with pytest.raises(ValueError, match="'out' must not share memory with 'kv_cache'"):
        sparse_mla_decode(**x, out=bad_out)


@pytest.mark.parametrize("make", [
    lambda T, H: torch.zeros(1, H, 512).bfloat16().expand(T, H, 512),  # every token the same row
    lambda T, H: torch.zeros(T, 1, 512).bfloat16().expand(T, H, 512),  # every head the same row
    lambda T, H: torch.zeros(T * H * 256 + 256).bfloat16().as_strided((T, H, 512), (H * 256, 256, 1)),
], ids=["expand_tokens", "expand_heads", "half_overlap"])
def test_out_overlapping_itself_is_rejected(make):
    x = good()
    T, H = x["q"].shape[:2]
    with pytest.raises(ValueError, match="'out' must not overlap itself"):
        sparse_mla_decode(**x, out=make(T, H))


def test_out_sharing_memory_with_a_scale_is_rejected():
    x = good(kv_dtype=torch.float8_e4m3fn)
    T, H = x["q"].shape[:2]
    buf = torch.zeros(T * H * 512, dtype=torch.bfloat16)
    kv_scale = buf[:2].view(torch.float32)
    kv_scale.fill_(0.5)
    with pytest.raises(ValueError, match="'out' must not share memory with 'kv_scale'"):
        sparse_mla_decode(**x, kv_scale=kv_scale, out=buf.view(T, H, 512))


def test_q_and_out_side_by_side_in_one_workspace_are_accepted():
    x = good()
    T, H = x["q"].shape[:2]
    ws = torch.empty(T * H * 576 + T * H * 512, dtype=torch.bfloat16)
    q = ws[: T * H * 576].view(T, H, 576)
    q.copy_(x["q"])
    out = ws[T * H * 576:].view(T, H, 512)
    got, _ = sparse_mla_decode(**{**x, "q": q}, out=out, path="reference")
    want, _ = sparse_mla_decode(**x, path="reference")
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, want)


def test_out_requiring_grad_is_rejected():
    x = good()
    T, H = x["q"].shape[:2]
    out = torch.zeros(T, H, 512, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="'out' must not require grad"):
        sparse_mla_decode(**x, out=out)


def test_out_with_permuted_dims_is_accepted():
    x = good()
    T, H = x["q"].shape[:2]
    out = torch.empty(H, T, 512).bfloat16().transpose(0, 1)
    got, _ = sparse_mla_decode(**x, out=out, path="reference")
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got.float()).all()


def test_sinks_requiring_grad_are_rejected():
    x = good()
    with pytest.raises(ValueError, match="require grad"):
        sparse_mla_decode(**x, sinks=torch.zeros(4, requires_grad=True))


@pytest.mark.parametrize("kwargs,text", [
    (dict(dcp_world_size=2, num_kv_rows=32), "'dcp_group' is required"),
    (dict(dcp_world_size=2, dcp_group="world", num_kv_rows=32), "torch.distributed"),
    (dict(dcp_world_size=2, dcp_group=object(), num_kv_rows=-5), "'num_kv_rows'"),
    (dict(dcp_layout="interleave"), "'dcp_layout' must be in"),
    (dict(num_kv_rows=32), "dcp_world_size == 1"),
])
def test_dcp_arguments_rejected_at_layer_construction(kwargs, text):
    with pytest.raises(ValueError, match=text):
        SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, platform=Platform("cpu"), **kwargs)


# ---- out overlap: exact enough for interleaved views, never blind to a real overlap ----


def _interleaved(T=2, H=4):
    """q and out as disjoint column blocks of one bf16 [T, H, 1088] buffer (one row pitch, 2176 bytes)."""
    b = torch.zeros(T, H, 1088, dtype=torch.bfloat16)
    return b, b[..., :576], b[..., 576:]


def test_out_interleaved_with_q_in_one_buffer_is_accepted():
    x = good()
    b, q, out = _interleaved()
    q.copy_(x["q"])
    for path in ("reference", "triton"):
        got, _ = sparse_mla_decode(**{**x, "q": q}, out=out, path=path)
        want, _ = sparse_mla_decode(**x, path=path)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(b[..., :576], x["q"])  # q was not written


@pytest.mark.parametrize("make_out", [
    lambda b: b[:2, :, 575:1087],  # one column into q's block
    lambda b: b[:2, :, 64:576],  # q's own columns
    lambda b: b.view(-1)[1088 * 3:1088 * 3 + 2 * 4 * 512].view(2, 4, 512),  # contiguous, across q's rows
    lambda b: b.view(-1).as_strided((2, 4, 512), (4 * 1088, 1088, 1), 1088 * 5 - 100),  # rows wrap into q's block
], ids=["one_column", "q_columns", "contiguous_across_rows", "strided_wrapping"])
def test_out_overlapping_q_in_one_buffer_is_refused(make_out):
    x = good()
    b = torch.zeros(4, 4, 1088, dtype=torch.bfloat16)
    q = b[:2, :, :576]
    q.copy_(x["q"])
    with pytest.raises(ValueError, match="'out' must not share memory with 'q'"):
        sparse_mla_decode(**{**x, "q": q}, out=make_out(b))


def test_interleaved_out_overlapping_itself_is_refused():
    x = good()
    b, q, _ = _interleaved()
    q.copy_(x["q"])
    out = b.view(-1)[576:].as_strided((2, 4, 512), (1088, 272, 1))  # rows of out overlap each other
    with pytest.raises(ValueError, match="'out' must not overlap itself"):
        sparse_mla_decode(**{**x, "q": q}, out=out)


def test_overlap_check_never_misses_a_shared_byte():
    """Against the exact answer (the byte sets of both tensors) on random strided views of one buffer:
    every real overlap is reported; the interleaved column blocks are not."""
    from mla_sink.core.validate import _memory_overlaps

    def byte_set(t):
        elt = t.element_size()
        offs = torch.zeros((), dtype=torch.long)
        for size, stride in zip(t.shape, t.stride()):
            offs = offs.unsqueeze(-1) + torch.arange(size) * stride * elt
        base = t.data_ptr()
        return {base + int(o) + k for o in offs.reshape(-1) for k in range(elt)}

    from mla_sink.core.validate import _byte_range

    g = torch.Generator().manual_seed(0)
    buf = torch.zeros(384, dtype=torch.bfloat16)
    reported = separated = 0
    for _ in range(600):
        views = []
        pitch = int(torch.randint(4, 24, (1,), generator=g))  # often a shared row pitch
        for _ in range(2):
            shape = tuple(int(v) for v in torch.randint(1, 4, (2,), generator=g)) + (int(torch.randint(1, 9, (1,), generator=g)),)
            p = pitch if bool(torch.rand(1, generator=g) < 0.7) else int(torch.randint(shape[2], 24, (1,), generator=g))
            p = max(p, shape[2])
            strides = (p * shape[1] * int(torch.randint(1, 3, (1,), generator=g)), p, 1)
            span = sum((n - 1) * st for n, st in zip(shape, strides)) + 1
            off = int(torch.randint(0, 384 - span, (1,), generator=g))
            views.append(buf.as_strided(shape, strides, off))
        a, b = views
        truth = bool(byte_set(a) & byte_set(b))
        got = _memory_overlaps(a, b)
        assert got or not truth, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(), b.storage_offset())
        reported += got
        (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
        separated += (a0 < b1 and b0 < a1) and not got  # byte ranges meet, yet proven disjoint
    assert reported > 100 and separated > 20  # the grid exercises both answers
    b, q, out = _interleaved()
    assert not _memory_overlaps(out, q) and not _memory_overlaps(q, out)


# ---- meta tensors: shape inference through the operators ----


@pytest.mark.parametrize("q_dtype,kv_dtype,out_dtype", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float8_e4m3fn, torch.float16),
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16),
])
@pytest.mark.parametrize("with_sinks,return_lse", [(False, False), (False, True), (True, False)])
def test_operators_infer_shapes_on_meta_tensors(q_dtype, kv_dtype, out_dtype, with_sinks, return_lse):
    import mla_sink  # noqa: F401  (registers torch.ops.mla_sink.*)

    T, H, N, topk = 3, 5, 10, 8
    meta = dict(device="meta")
    q = torch.empty(T, H, 576, dtype=q_dtype, **meta)
    kv = torch.empty(N, 576, dtype=kv_dtype, **meta)
    idx = torch.empty(T, topk, dtype=torch.int32, **meta)
    sinks = torch.empty(H, **meta) if with_sinks else None
    q_scale = torch.empty(1, **meta) if q_dtype.itemsize == 1 else None
    kv_scale = torch.empty(1, **meta) if kv_dtype.itemsize == 1 else None
    lse_heads = H if (with_sinks or return_lse) else 0
    out, lse = torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, sinks, 0.1, None, q_scale, kv_scale, return_lse, 0.0, "")
    assert out.device.type == "meta" and out.shape == (T, H, 512) and out.dtype == out_dtype
    assert lse.device.type == "meta" and lse.shape == (T, lse_heads) and lse.dtype == torch.float32
    buf = torch.empty(T, H, 512, dtype=out_dtype, **meta)
    lse = torch.ops.mla_sink.sparse_mla_decode_out(q, kv, idx, sinks, 0.1, None, q_scale, kv_scale, buf, return_lse,
                                                   0.0, "")
    assert lse.device.type == "meta" and lse.shape == (T, lse_heads) and lse.dtype == torch.float32
    with pytest.raises(ValueError, match="'indices' must be on meta"):  # still validated: one device for all
        torch.ops.mla_sink.sparse_mla_decode(q, kv, torch.zeros(T, topk, dtype=torch.int32), sinks, 0.1, None,
                                             q_scale, kv_scale, return_lse, 0.0, "")


def test_meta_tensors_infer_shapes_and_are_refused_where_a_kernel_would_run():
    q = torch.empty(2, 4, 576, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(8, 576, dtype=torch.bfloat16, device="meta")
    idx = torch.empty(2, 8, dtype=torch.int32, device="meta")
    out, lse = sparse_mla_decode(q, kv, idx, return_lse=True)  # through the operator's fake implementation
    assert out.device.type == "meta" and out.shape == (2, 4, 512) and lse.shape == (2, 4)
    with pytest.raises(ValueError, match="'q' must be on a cpu or cuda"):
        check_inputs(q, kv, idx, allow_meta=False)
    check_inputs(q, kv, idx)  # what the operators' fake implementations run


def test_layer_sinks_on_the_meta_device_are_refused_by_name():
    from mla_sink import SparseMLADecode

    with pytest.raises(ValueError, match="'sinks' must be on a cpu or cuda"):
        SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=16, sinks=torch.randn(4, device="meta"))


@pytest.mark.parametrize("arg", ["sm_scale", "logit_cap"])
@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400)])
def test_a_huge_int_scalar_is_named_briefly(arg, value):
    """An int no float holds is refused with its leading digits and its length, not all of them (``10**400`` put
    401 digits in the message: a break test, forty-third session)."""
    from mla_sink.core.validate import check_logit_cap, check_sm_scale

    check = check_sm_scale if arg == "sm_scale" else check_logit_cap
    with pytest.raises(ValueError, match=rf"'{arg}' must be .*got -?100000\.\.\. \(an int of 401 digits\)\)") as e:
        check(value)
    assert len(str(e.value)) < 400


@pytest.mark.parametrize("arg", ["sinks", "topk_length"])
def test_a_zero_tensor_after_a_call_of_its_signature_is_refused(arg):
    """A call's signature records whether a tensor is a zero tensor (``torch._efficientzerotensor``), so a zero
    tensor after a good call of the same shapes is refused by name as on a first call, not sent to the launch
    prepared for the good one (it met Triton's "invalid python storage" RuntimeError there: a break test,
    sixty-second session)."""
    x = dict(good(), sinks=torch.zeros(4))
    x["topk_length"] = torch.full((x["q"].shape[0],), x["indices"].shape[1], dtype=torch.int32)
    sparse_mla_decode(**x)
    x[arg] = torch._efficientzerotensor(x[arg].shape, dtype=x[arg].dtype)
    with pytest.raises(ValueError, match=rf"'{arg}' must not be a zero tensor"):
        sparse_mla_decode(**x)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated", "ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("entry", ["function", "layer"])
def test_torch_jit_trace_is_refused_with_what_to_use_instead(entry):
    """torch.jit.trace recorded the tensors' sizes as tensors, which the checks met as "'num_heads' must be an int
    (got tensor(8))" (a break test, sixty-third session); a prepared call's launch is not an op it can record."""
    from mla_sink import SparseMLADecode

    x = good()
    q, kv, idx = x["q"], x["kv_cache"], x["indices"]
    layer = SparseMLADecode(num_heads=q.shape[1], q_dtype=q.dtype, kv_dtype=kv.dtype, topk=idx.shape[1])
    call = (lambda a, b, c: sparse_mla_decode(a, b, c)) if entry == "function" else (lambda a, b, c: layer(a, b, c))
    for _ in range(2):  # a first call of the signature, then a prepared one
        with pytest.raises(ValueError, match=r"cannot be traced by torch.jit.trace .* use torch.compile or "
                                             r"torch.export"):
            torch.jit.trace(call, (q, kv, idx), check_trace=False)
        call(q, kv, idx)


@pytest.mark.parametrize("arg", ["q", "kv_cache", "indices"])
def test_a_torch_func_vmap_tensor_is_refused_by_name(arg):
    """vmap's BatchedTensor met PyTorch's NotImplementedError ("Cannot access storage of BatchedTensorImpl") in the
    storage check (a break test, sixty-third session); refused by name, on a first call and after a prepared one."""
    x = good()
    for _ in range(2):
        def one(t):
            return sparse_mla_decode(**dict(x, **{arg: t}))[0]

        with pytest.raises(ValueError, match=rf"'{arg}' is a torch.func transform's tensor \(vmap, grad, jvp\)"):
            torch.func.vmap(one)(x[arg][None].expand(2, *x[arg].shape))
        sparse_mla_decode(**x)


@pytest.mark.parametrize("offset", [0, 1], ids=["at its storage's start", "a row into its storage"])
@pytest.mark.parametrize("arg", ["q", "kv_cache", "indices", "sinks", "topk_length", "out"])
def test_a_new_freed_tensor_after_a_call_of_its_signature_is_refused(arg, offset):
    """A new tensor whose storage was freed (a null storage pointer) has the metadata of a good call's, so it skipped
    to the launch prepared for that call and read from address 0, or from the view's offset (garbage, NaN; on a GPU
    an illegal address: two break tests, sixty-third session). Later calls of a signature test the storage's pointer,
    so it is refused by name as on a first call."""
    x = dict(good(), sinks=torch.zeros(4))
    x["topk_length"] = torch.full((x["q"].shape[0],), x["indices"].shape[1], dtype=torch.int32)
    x["out"] = torch.empty(x["q"].shape[0], x["q"].shape[1], 512, dtype=x["q"].dtype)
    sparse_mla_decode(**x)
    x = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}  # new tensors, same metadata
    if offset:  # a view one row into a larger storage: its own data pointer is not null once the storage is freed
        base = torch.empty((x[arg].shape[0] + 1, *x[arg].shape[1:]), dtype=x[arg].dtype)
        x[arg] = base[1:].copy_(x[arg])
    x[arg].untyped_storage().resize_(0)
    with pytest.raises(ValueError, match=rf"'{arg}' reaches byte \d+ of its storage, which holds 0 bytes"):
        sparse_mla_decode(**x)


@pytest.mark.parametrize("arg", ["q", "kv_cache", "indices", "sinks"])
@pytest.mark.parametrize("how", ["freed storage", "one element short", "zero tensor"])
def test_a_tensor_without_the_storage_it_reaches_is_refused_by_name(arg, how):
    """A storage freed by ``untyped_storage().resize_(0)`` was read (NaN; the interpreter grew it back), and a zero
    tensor (``torch._efficientzerotensor``) met PyTorch's "invalid python storage" RuntimeError inside Triton (a
    break test, forty-sixth session): both are refused by name before any kernel runs, on every path."""
    from mla_sink import sparse_mla_decode_reference

    x = dict(good(), sinks=torch.zeros(4))
    if how in ("freed storage", "one element short"):  # a storage shrunk by one element is caught at its last byte
        x[arg] = x[arg].clone()
        keep = 0 if how == "freed storage" else x[arg].untyped_storage().nbytes() - x[arg].element_size()
        x[arg].untyped_storage().resize_(keep)
        message = rf"'{arg}' reaches byte \d+ of its storage, which holds {keep} bytes"
    else:
        x[arg] = torch._efficientzerotensor(x[arg].shape, dtype=x[arg].dtype)
        message = rf"'{arg}' must not be a zero tensor"
    for path in (None, "reference"):
        with pytest.raises(ValueError, match=message):
            sparse_mla_decode(x["q"], x["kv_cache"], x["indices"], x["sinks"], path=path)
    if how != "zero tensor":
        with pytest.raises(ValueError, match=message):
            sparse_mla_decode_reference(x["q"], x["kv_cache"], x["indices"], x["sinks"])
