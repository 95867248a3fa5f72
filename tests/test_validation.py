"""Every malformed call is a ValueError naming the argument, raised before any kernel runs."""

from __future__ import annotations

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
    (lambda x: x.update(sinks=torch.zeros(8)[::2]), "sinks"),
    (lambda x: x.update(sinks=torch.zeros(4, device="meta")), "sinks"),
    (lambda x: x.update(q=torch.randn(2, 4, 512).bfloat16()), "q"),
    (lambda x: x.update(q=torch.randn(2, 576).bfloat16()), "q"),
    (lambda x: x.update(q=torch.randn(2, 4, 576)), "q"),
    (lambda x: x.update(q=torch.randn(2, 4, 576 * 2).bfloat16()[..., ::2]), "q"),
    (lambda x: x.update(kv_cache=torch.randn(32, 1, 576).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(32, 512).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(0, 576).bfloat16()), "kv_cache"),
    (lambda x: x.update(kv_cache=torch.randn(32, 576).half()), "kv_cache dtype"),
    (lambda x: x.update(indices=x["indices"].long()), "indices"),
    (lambda x: x.update(indices=x["indices"][0]), "indices"),
    (lambda x: x.update(indices=x["indices"][:1]), "indices"),
    (lambda x: x.update(indices=torch.zeros(2, 0, dtype=torch.int32)), "indices"),
    (lambda x: x.update(indices=x["indices"].to("meta")), "indices"),
    (lambda x: x.update(sm_scale=0.0), "sm_scale"),
    (lambda x: x.update(sm_scale=float("inf")), "sm_scale"),
    (lambda x: x.update(topk_length=torch.zeros(2, dtype=torch.int64)), "topk_length"),
    (lambda x: x.update(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length"),
    (lambda x: x.update(kv_scale=torch.ones(1)), "kv_scale"),
    (lambda x: x.update(out=torch.empty(2, 4, 512)), "out"),
    (lambda x: x.update(out=torch.empty(2, 4, 576, dtype=torch.bfloat16)), "out"),
]


@pytest.mark.parametrize("mutate,arg", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_argument(mutate, arg):
    x = good()
    mutate(x)
    with pytest.raises(ValueError, match=f"'?{arg}") as info:
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
    (dict(sm_scale="0.1"), "'sm_scale' must be a finite float >= 2\\^-126"),
    (dict(sm_scale=1e-40), "'sm_scale' must be a finite float >= 2\\^-126"),
    (dict(path=["triton"]), "'path' must be"),
])
def test_scalar_options_are_named_as_passed(kw, message):
    with pytest.raises(ValueError, match=message):
        sparse_mla_decode(**good(), **kw)


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
    with pytest.raises(ValueError, match="'sinks' must be contiguous"):
        prepare(s, Platform("cpu"), sinks=torch.zeros(8)[::2])
    with pytest.raises(ValueError, match="spec.sinks is False"):
        prepare(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8), Platform("cpu"), sinks=torch.zeros(4))
    assert prepare(s, Platform("cpu", triton=False), sinks=torch.zeros(4)).path == "reference"


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
