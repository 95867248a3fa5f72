"""The one execute: validation and planning once per call signature, the plan record, guarded run(),
shape inference on fake and meta tensors, and the Gluon compile-failure fallback as planning data."""

from __future__ import annotations


import pytest
import torch

import mla_sink.api as api
from mla_sink import CallSpec, DecodeInputs, Platform, SparseMLADecode, run, sparse_mla_decode
from mla_sink.core import plan as plan_mod
from mla_sink.core.plan import build_plan
from mla_sink.core.reference import sparse_mla_decode_reference

pytestmark = pytest.mark.interpreter


def _case(T=2, H=4, N=64, topk=16, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 576, generator=g).to(dtype)
    kv = torch.randn(N, 576, generator=g).to(dtype)
    idx = torch.randint(-2, N + 3, (T, topk), generator=g, dtype=torch.int32)
    sinks = torch.randn(H, generator=g)
    return q, kv, idx, sinks


def test_a_signature_is_validated_and_planned_once(monkeypatch):
    q, kv, idx, sinks = _case(seed=1)
    api.forget_prepared_calls()
    calls = []
    real = api._prepare_call
    monkeypatch.setattr(api, "_prepare_call", lambda *a: calls.append(a) or real(*a))
    first = sparse_mla_decode(q, kv, idx, sinks)
    q2 = torch.randn_like(q.float()).to(q.dtype)  # same signature, new values
    second = sparse_mla_decode(q2, kv, idx, sinks)
    assert len(calls) == 1
    ref = sparse_mla_decode_reference(q2, kv, idx, sinks)
    torch.testing.assert_close(second[0].double(), ref[0], atol=2e-3, rtol=2e-3)
    assert not torch.equal(first[0], second[0])
    sparse_mla_decode(q[:1], kv, idx[:1], sinks)  # another T: another signature
    assert len(calls) == 2


def test_a_cached_signature_still_refuses_out_overlapping_an_input():
    q, kv, idx, sinks = _case(seed=2)
    out = torch.empty(2, 4, 512, dtype=torch.float16)
    sparse_mla_decode(q, kv, idx, sinks, out=out)
    ws = torch.empty(2 * 4 * 576 + 16, dtype=torch.float16)
    q_in_ws = ws[: 2 * 4 * 576].view(2, 4, 576).copy_(q)
    out_in_ws = ws[: 2 * 4 * 512].view(2, 4, 512)  # same shape/strides as `out`: the signature is cached
    with pytest.raises(ValueError, match="'out' must not share memory with 'q'"):
        sparse_mla_decode(q_in_ws, kv, idx, sinks, out=out_in_ws)


def test_the_plan_record_is_complete_and_cached():
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=128, topk=2048, sinks=True)
    sm90 = Platform("sm90", num_sms=132)
    plan = build_plan(spec, sm90, num_tokens=256)
    assert plan is build_plan(spec, sm90, num_tokens=256)
    assert plan.path == "triton" and plan.num_tokens == 256
    assert plan.launch.kernel == "gluon_seesaw" and plan.launch.num_kv_splits == 1
    small = build_plan(spec, sm90, num_tokens=2)
    assert small.launch.kernel == "gluon_seesaw" and small.launch.num_kv_splits > 1
    open_ = build_plan(spec, Platform("sm90"), num_tokens=2)  # SM count unknown: splits left open
    assert open_.launch.num_kv_splits is None


def test_a_gluon_compile_failure_is_planning_data(monkeypatch):
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=128, topk=2048, sinks=True)
    sm90 = Platform("sm90", num_sms=132)
    monkeypatch.setattr(plan_mod, "_FAILED_KERNELS", {})
    plan_mod._build_plan_cached.cache_clear()
    assert build_plan(spec, sm90, num_tokens=256).launch.kernel == "gluon_seesaw"
    plan_mod.mark_kernel_failed("gluon_seesaw", "CompilationError: no such op")
    after = build_plan(spec, sm90, num_tokens=256)
    assert after.launch.kernel == "portable"
    assert "gluon_seesaw" in after.launch.fallback and "no such op" in after.launch.fallback
    plan_mod._build_plan_cached.cache_clear()


def test_a_plan_built_while_a_kernel_is_marked_failed_is_not_served_later(monkeypatch):
    """A plan whose build read the failed kernels before another thread marked one failed must not outlive the mark:
    clearing the cache alone let that plan land in it afterwards, naming the failed kernel for the rest of the
    process (a break test, forty-third session). The mark bumps a generation that keys the cache."""
    from mla_sink.paths.triton import plan as triton_plan

    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=128, topk=2048, sinks=True)
    sm90 = Platform("sm90", num_sms=132)
    monkeypatch.setattr(plan_mod, "_FAILED_KERNELS", {})
    plan_mod._build_plan_cached.cache_clear()
    real = triton_plan.plan_triton_launch

    def marked_meanwhile(**kw):  # the other thread's mark lands after this build read the failed kernels
        launch = real(**kw)
        plan_mod.mark_kernel_failed("gluon_seesaw", "CompilationError: no such op")
        return launch

    monkeypatch.setattr(triton_plan, "plan_triton_launch", marked_meanwhile)
    assert build_plan(spec, sm90, num_tokens=256).launch.kernel == "gluon_seesaw"  # the build that raced
    monkeypatch.setattr(triton_plan, "plan_triton_launch", real)
    after = build_plan(spec, sm90, num_tokens=256)
    assert after.launch.kernel == "portable" and "no such op" in after.launch.fallback
    plan_mod._build_plan_cached.cache_clear()


def test_build_plan_takes_a_numpy_token_count():
    import numpy as np

    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    plan = build_plan(spec, Platform("cpu", num_sms=1), num_tokens=np.int64(4))
    assert plan.num_tokens == 4 and type(plan.num_tokens) is int
    with pytest.raises(ValueError, match=r"'num_tokens' must be None or an int in \[0, 2147483647\] \(got 2147483648\)"):
        build_plan(spec, Platform("cpu", num_sms=1), num_tokens=2 ** 31)  # the CLI's --tokens bound (a break test)
    assert build_plan(spec, Platform("cpu", num_sms=1), num_tokens=2 ** 31 - 1).num_tokens == 2 ** 31 - 1  # its edge


def test_a_plan_names_a_path_of_the_table():
    """A :class:`LaunchPlan` built by hand (a test's, a tool's) names a path of the rule table, or is refused with the
    paths it could name (a mutation audit, forty-seventh session: no test built one with another path)."""
    from mla_sink import LaunchPlan

    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
    for bad in ("bogus", "", None, "Triton"):
        with pytest.raises(ValueError, match=r"'path' must be one of \("):
            LaunchPlan(path=bad, params={}, spec=spec, platform=Platform("cpu"))
    assert LaunchPlan(path="reference", params={}, spec=spec, platform=Platform("cpu")).path == "reference"


@pytest.mark.parametrize("spec, inputs, match", [
    ({"q_dtype": "bf16"}, None, "'spec' must be a mla_sink.CallSpec"),
    (None, {"logit_cap": "3"}, "'inputs.logit_cap' must be a finite float"),
    (None, {"logit_cap": float("nan")}, "'inputs.logit_cap' must be a finite float"),
    (None, {"logit_cap": True}, "'inputs.logit_cap' must be a finite float"),
    (None, {"sm_scale": "0.1"}, "'inputs.sm_scale'"),
    # sinks passed in sm_scale's place, as sparse_mla_decode's 4th argument (sixty-third session's break test)
    (None, {"sm_scale": torch.zeros(4)}, r"'inputs.sm_scale' must be .* DecodeInputs takes \(q, kv_cache, indices, "
                                         r"sm_scale, sinks, \.\.\.\), sm_scale before sinks"),
])
def test_run_is_as_guarded_as_the_function(spec, inputs, match):
    q, kv, idx, sinks = _case(seed=3)
    good = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16, sinks=True)
    x = DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=0.05, sinks=sinks)
    if inputs:
        x = x._replace(**inputs)
    with pytest.raises(ValueError, match=match):
        run(spec if spec is not None else good, x)


def test_run_takes_a_mapping_and_the_layer_matches_the_function():
    q, kv, idx, sinks = _case(seed=4)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16, sinks=True)
    out, lse = run(spec, {"q": q, "kv_cache": kv, "indices": idx, "sinks": sinks})
    layer = SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=16, sinks=sinks)
    lo, ll = layer(q, kv, idx)
    fo, fl = sparse_mla_decode(q, kv, idx, sinks)
    assert torch.equal(out, lo) and torch.equal(out, fo) and torch.equal(lse, ll)


def test_layer_holds_parameter_sinks_detached_and_sees_later_loads():
    """Engines keep sinks as an nn.Parameter (requires grad): the layer runs with grad enabled, sees an
    in-place load of the weights made after construction, and the function refuses such sinks (no
    backward) with a message that names them."""
    q, kv, idx, sinks = _case(seed=5)
    param = torch.nn.Parameter(torch.zeros_like(sinks))
    layer = SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=16, sinks=param)
    with torch.no_grad():
        param.copy_(sinks)  # the weights are loaded after the layer is built
    assert torch.is_grad_enabled()
    lo, ll = layer(q, kv, idx)
    fo, fl = sparse_mla_decode(q, kv, idx, sinks)
    assert torch.equal(lo, fo) and torch.equal(ll, fl) and not lo.requires_grad
    with pytest.raises(ValueError, match="'sinks'.*require grad"):
        sparse_mla_decode(q, kv, idx, param)


def test_layer_sees_sinks_whose_storage_was_replaced():
    """``p.data = ...`` (and a module's ``.to()``) gives the parameter new storage: the layer kept using the old sinks,
    silently (break test, thirty-second session). It detaches the parameter again when its storage changed, and the
    call checks the new tensor."""
    q, kv, idx, sinks = _case(seed=7)
    param = torch.nn.Parameter(torch.zeros_like(sinks))
    layer = SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=16, sinks=param)
    layer(q, kv, idx)
    param.data = sinks.clone()
    lo, ll = layer(q, kv, idx)
    fo, fl = sparse_mla_decode(q, kv, idx, sinks)
    assert torch.equal(lo, fo) and torch.equal(ll, fl)
    param.data = torch.zeros(5)
    with pytest.raises(ValueError, match="'sinks' must have num_heads=4 entries"):
        layer(q, kv, idx)


def test_layer_sees_its_sinks_become_a_negated_view_of_the_same_memory():
    """``p.data = c.conj().imag`` keeps the pointer, shape, strides and dtype of ``c.imag`` and reads negated: the
    layer kept computing with the old sinks (a break test, forty-sixth session). It sees the change and the call
    refuses the lazily negated view, as building a layer with one is refused."""
    q, kv, idx, _ = _case(seed=7)
    c = torch.complex(torch.tensor([9.0, 8.0, 7.0, 6.0]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    param = torch.nn.Parameter(c.imag)
    layer = SparseMLADecode(num_heads=4, q_dtype="fp16", kv_dtype="fp16", topk=16, sinks=param)
    layer(q, kv, idx)
    param.data = c.conj().imag
    assert param.data.data_ptr() == c.imag.data_ptr() and param.data.is_neg()
    with pytest.raises(ValueError, match="'sinks' must not be a lazily negated or conjugated view"):
        layer(q, kv, idx)


def test_shape_inference_under_fake_tensor_mode_outside_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(3, 5, 576, dtype=torch.bfloat16)
        kv = torch.empty(100, 576, dtype=torch.bfloat16)
        idx = torch.empty(3, 32, dtype=torch.int32)
        sinks = torch.empty(5, dtype=torch.float32)
        out, lse = sparse_mla_decode(q, kv, idx, sinks)
        assert out.shape == (3, 5, 512) and out.dtype == torch.bfloat16 and lse.shape == (3, 5)
        out2, none = sparse_mla_decode(q, kv, idx)
        assert out2.shape == (3, 5, 512) and none is None


def test_shape_inference_on_the_meta_device():
    q = torch.empty(3, 5, 576, dtype=torch.float16, device="meta")
    kv = torch.empty(100, 576, dtype=torch.float16, device="meta")
    idx = torch.empty(3, 32, dtype=torch.int32, device="meta")
    out, lse = sparse_mla_decode(q, kv, idx, return_lse=True)
    assert out.device.type == "meta" and out.shape == (3, 5, 512) and lse.shape == (3, 5)


def test_a_layer_built_for_a_device_infers_shapes_on_meta():
    # a break test's finding: the layer (whose platform is its device's) refused meta tensors, naming 'platform'
    layer = SparseMLADecode(num_heads=5, q_dtype="fp16", kv_dtype="fp16", topk=32, return_lse=True)
    q = torch.empty(3, 5, 576, dtype=torch.float16, device="meta")
    kv = torch.empty(100, 576, dtype=torch.float16, device="meta")
    idx = torch.empty(3, 32, dtype=torch.int32, device="meta")
    out, lse = layer(q, kv, idx)
    assert out.device.type == "meta" and out.shape == (3, 5, 512) and lse.shape == (3, 5)
    with pytest.raises(ValueError, match="'q'"):  # the checks still run on meta: 4 heads against the layer's 5
        layer(q[:, :4], kv, idx)


def test_a_layer_with_sinks_infers_shapes_on_meta_and_fake_tensors():
    # a break test's finding: the layer's sinks (on its device) were refused next to meta q ("'sinks' must be on
    # meta, like q"), and under FakeTensorMode PyTorch asserted on the real sinks tensor
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    sinks = torch.tensor([0.5, -1.0, float("inf"), 2.0])
    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=sinks)
    meta = dict(device="meta")
    out, lse = layer(torch.empty(2, 4, 576, dtype=torch.bfloat16, **meta),
                     torch.empty(16, 576, dtype=torch.bfloat16, **meta), torch.empty(2, 8, dtype=torch.int32, **meta))
    assert out.device.type == "meta" and out.shape == (2, 4, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4) and lse.dtype == torch.float32
    with FakeTensorMode():
        out, lse = layer(torch.empty(3, 4, 576, dtype=torch.bfloat16), torch.empty(16, 576, dtype=torch.bfloat16),
                         torch.zeros(3, 8, dtype=torch.int32))
    assert isinstance(out, FakeTensor) and out.shape == (3, 4, 512) and lse.shape == (3, 4)
    with pytest.raises(ValueError, match="'q' has 3 heads"):  # the checks still run without data
        layer(torch.empty(2, 3, 576, dtype=torch.bfloat16, **meta), torch.empty(16, 576, dtype=torch.bfloat16, **meta),
              torch.empty(2, 8, dtype=torch.int32, **meta))
    g = torch.Generator().manual_seed(1)  # the same layer still computes on real tensors, with its sinks
    q = torch.randn(2, 4, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(16, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 16, (2, 8), generator=g, dtype=torch.int32)
    out, lse = layer(q, kv, idx)
    ref, ref_lse = sparse_mla_decode_reference(q, kv, idx, sinks)
    assert torch.allclose(out.double(), ref, atol=2e-2) and torch.allclose(lse.double(), ref_lse.double(), atol=1e-3)
    assert (out[:, 2] == 0).all()  # the +inf sink takes all of head 2's weight


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_layer_with_sinks_infers_shapes_on_meta(backend):
    # a second break test's finding: the compiled call passed the layer's real sinks next to meta q
    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=torch.zeros(4))
    f = torch.compile(lambda q, kv, idx: layer(q, kv, idx), fullgraph=True, backend=backend)
    out, lse = f(torch.empty(2, 4, 576, dtype=torch.bfloat16, device="meta"),
                 torch.empty(16, 576, dtype=torch.bfloat16, device="meta"),
                 torch.empty(2, 8, dtype=torch.int32, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 4, 512) and lse.shape == (2, 4)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_export_of_a_module_that_calls_a_layer_with_sinks(strict, dynamic):
    """``torch.export.export`` of a module whose forward calls a layer built with the module's sink parameter.
    Non-strict (the default) runs the forward on fake tensors while the layer holds the real parameter: the layer
    made a fake copy, whose fresh symbolic sizes that tracer did not know (a ``RuntimeError`` inside PyTorch;
    fortieth session's break test); it hands that mode, which takes real tensors, the real sinks, lifted as a
    constant sharing their storage, so the exported program sees a later in-place update of the weights."""
    g = torch.Generator().manual_seed(0)
    T, H, N, topk = 3, 4, 64, 16

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sinks = torch.nn.Parameter(torch.randn(H, generator=g))
            self.decode = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=topk, sinks=self.sinks)

        def forward(self, q, kv, idx):
            return self.decode(q, kv, idx)

    m = Attn()
    q = torch.randn(T, H, 576, generator=g).bfloat16()
    kv = torch.randn(N, 576, generator=g).bfloat16()
    idx = torch.randint(-1, N, (T, topk), generator=g, dtype=torch.int32)
    shapes = None
    if dynamic:
        t_dim = torch.export.Dim("T", min=2, max=64)
        shapes = ({0: t_dim}, None, {0: t_dim})
    with torch.no_grad():
        ep = torch.export.export(m, (q, kv, idx), strict=strict, dynamic_shapes=shapes)
        for t in ((T, 5) if dynamic else (T,)):
            args = (torch.randn(t, H, 576, generator=g).bfloat16(), kv,
                    torch.randint(-1, N, (t, topk), generator=g, dtype=torch.int32))
            out, lse = ep.module()(*args)
            ref, ref_lse = sparse_mla_decode_reference(*args, m.sinks.detach())
            assert out.shape == (t, H, 512)
            torch.testing.assert_close(out.double(), ref.double(), atol=2e-2, rtol=1e-2)
            torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-4, rtol=1e-5)
        m.sinks.add_(3.0)  # a later in-place load of the weights
        out, _ = ep.module()(q, kv, idx)
        torch.testing.assert_close(out.double(), sparse_mla_decode_reference(q, kv, idx, m.sinks.detach())[0].double(),
                                   atol=2e-2, rtol=1e-2)


def test_a_meta_call_checks_the_layers_current_sinks():
    # a second break test's finding: a meta call checked the sinks of the layer's last real call, not the tensor
    # the layer was given (whose storage may have been replaced since), so it accepted what a real call refuses
    p = torch.nn.Parameter(torch.zeros(4))
    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=p)
    p.data = torch.zeros(5)
    meta = dict(device="meta")
    with pytest.raises(ValueError, match="'sinks' must have num_heads=4 entries"):
        layer(torch.empty(2, 4, 576, dtype=torch.bfloat16, **meta), torch.empty(16, 576, dtype=torch.bfloat16, **meta),
              torch.empty(2, 8, dtype=torch.int32, **meta))


def test_cpu_bf16_output_is_rounded_to_nearest_like_the_gpu():
    # the kernel computes in fp32; rounding that to nearest gives the float64 answer's nearest bf16
    # except at near-ties, while truncation toward zero misses about half the elements
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(64, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 64, (2, 16), generator=g, dtype=torch.int32)
    out, _ = sparse_mla_decode(q, kv, idx, path="triton")
    ref, _ = sparse_mla_decode_reference(q, kv, idx)
    nearest = ref.float().to(torch.bfloat16)
    assert (out == nearest).float().mean().item() > 0.99


def test_the_operators_fake_implementation_checks_logit_cap():
    q = torch.empty(2, 4, 576, dtype=torch.float16, device="meta")
    kv = torch.empty(8, 576, dtype=torch.float16, device="meta")
    idx = torch.empty(2, 8, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="logit_cap"):
        torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, None, 0.05, None, None, None, False, float("inf"), "")


@pytest.mark.parametrize("where", ["kv", "q"])
def test_e4m3fn_nan_codes_in_referenced_data_give_nan_on_the_cpu_too(where):
    g = torch.Generator().manual_seed(7)
    kv = (torch.randn(50, 576, generator=g) * 0.5).to(torch.float8_e4m3fn)
    q = (torch.randn(2, 3, 576, generator=g) * 0.5).to(torch.float8_e4m3fn if where == "q" else torch.bfloat16)
    if where == "kv":
        kv.view(torch.uint8)[3, 0] = 0x7F  # a NaN code in a row token 0 references
    else:
        q.view(torch.uint8)[0, 1, 7] = 0xFF  # a NaN code in token 0, head 1
    idx = torch.full((2, 16), -1, dtype=torch.int32)
    idx[0, 0], idx[1, 0] = 3, 4
    one = torch.ones(1)
    kw = dict(kv_scale=one, q_scale=one if where == "q" else None, return_lse=True)
    out, lse = sparse_mla_decode(q, kv, idx, path="triton", **kw)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, idx, kv_scale=one, q_scale=kw["q_scale"])
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse)) and torch.isnan(lse).any()
    assert torch.equal(torch.isnan(out).all(-1), torch.isnan(ref_out).all(-1))
    assert not torch.isnan(out[1]).any()  # the other token is untouched


@pytest.mark.parametrize("kw", [dict(sm_scale=10 ** 400), dict(logit_cap=10 ** 400)])
def test_scalars_beyond_every_float_are_value_errors(kw):
    q, kv, idx, sinks = _case(seed=8)
    with pytest.raises(ValueError, match="sm_scale|logit_cap"):
        sparse_mla_decode(q, kv, idx, sinks, **kw)
    with pytest.raises(ValueError, match="logit_cap"):
        CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16, logit_cap=10 ** 400)


@pytest.mark.parametrize("cap", ["fraction", "longdouble"])
def test_a_positive_logit_cap_whose_float_is_zero_is_refused(cap):
    """A Fraction or numpy longdouble below fp64's range is positive, but its float is 0.0, which the function and
    the CallSpec read as no cap (a break test, sixty-third session): refused as any cap below 2^-126."""
    import fractions

    import numpy as np

    value = fractions.Fraction(1, 10 ** 400) if cap == "fraction" else np.longdouble("1e-4000")
    if cap == "longdouble" and value == 0:
        pytest.skip("this platform's longdouble is fp64: 1e-4000 is 0")
    q, kv, idx, sinks = _case(seed=8)
    with pytest.raises(ValueError, match=r"'logit_cap' must be <= 0 \(no cap\) or in \[2\^-126, 2\^126\]"):
        sparse_mla_decode(q, kv, idx, sinks, logit_cap=value)
    with pytest.raises(ValueError, match="'logit_cap' must be <= 0"):
        CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16, logit_cap=value)


def test_a_numpy_half_scale_is_checked_without_a_numpy_overflow_warning():
    import warnings

    import numpy as np

    q, kv, idx, sinks = _case(seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparse_mla_decode(q, kv, idx, sinks, sm_scale=np.float16(0.1))


def test_compile_with_dynamic_shapes_and_default_scalars():
    q, kv, idx, sinks = _case(seed=9)
    f = torch.compile(lambda q, kv, idx, s: sparse_mla_decode(q, kv, idx, s), fullgraph=True, dynamic=True)
    out, lse = f(q, kv, idx, sinks)
    ref, _ = sparse_mla_decode(q, kv, idx, sinks)
    torch.testing.assert_close(out, ref)


def test_compiled_refusals_with_dynamic_shapes_name_numbers_not_symbols():
    """Under ``torch.compile(dynamic=True)`` the refusals that compare two sizes named the symbols (``'sinks' must
    have num_heads=s34 entries (got s76)``); they show the numbers (fortieth session's break test)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16, 576, generator=g).bfloat16()
    kv = torch.randn(64, 576, generator=g).bfloat16()
    idx = torch.randint(-1, 64, (2, 32), generator=g, dtype=torch.int32)
    s = torch.randn(16, generator=g)
    f = torch.compile(lambda q, kv, idx, s, **kw: sparse_mla_decode(q, kv, idx, s, **kw), backend="eager",
                      fullgraph=True, dynamic=True)
    for args, kw, want in [
            ((q, kv, idx, s[:8]), {}, "'sinks' must have num_heads=16 entries (got 8)"),
            ((q, kv, idx[:1], s), {}, "'indices' must have T=2 rows like q (got 1)"),
            ((q, kv, idx, s), {"topk_length": torch.tensor([1, 2, 3], dtype=torch.int32)},
             "'topk_length' must be int32 [T=2] on cpu, like q (got torch.int32 shape (3,) on cpu)"),
            ((q, kv, idx, s), {"out": torch.empty(2, 16, 511, dtype=torch.bfloat16)},
             "'out' must be torch.bfloat16 [T=2, H=16, 512] (got torch.bfloat16 shape (2, 16, 511))")]:
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            f(*args, **kw)
        assert want in str(info.value), str(info.value)


def test_compile_with_dynamic_scalars_names_a_nan_or_infinite_scale():
    """Under ``torch.compile(dynamic=True)`` a float argument is symbolic, and comparing one whose value is NaN
    raised inside the tracer ("Invalid NaN comparison", found by a fresh user's break test): a NaN or infinite
    ``sm_scale`` / ``logit_cap`` is named by a ValueError, as in eager mode."""
    q, kv, idx, sinks = _case(seed=9)
    f = torch.compile(lambda q, kv, idx, s, sc, cap: sparse_mla_decode(q, kv, idx, s, sm_scale=sc, logit_cap=cap),
                      fullgraph=True, dynamic=True)
    out, _ = f(q, kv, idx, sinks, 0.05, 0.0)
    torch.testing.assert_close(out, sparse_mla_decode(q, kv, idx, sinks, sm_scale=0.05)[0])
    for sc, cap, name in ((float("nan"), 0.0, "sm_scale"), (float("inf"), 0.0, "sm_scale"),
                          (0.05, float("nan"), "logit_cap"), (0.05, float("inf"), "logit_cap")):
        with pytest.raises(ValueError, match=f"'{name}'") as info:
            f(q, kv, idx, sinks, sc, cap)
        assert "Invalid NaN comparison" not in str(info.value)


def test_layouts_views_and_records_that_cannot_be_computed_on_are_value_errors():
    from mla_sink import call_key, explain_call, plan_call, select

    q, kv, idx, sinks = _case(seed=10)
    with pytest.raises(ValueError, match="'kv_cache' must be a dense strided tensor"):
        sparse_mla_decode(q, kv.to_sparse(), idx, sinks)
    with pytest.raises(ValueError, match="'q' must not be a lazily negated"):
        sparse_mla_decode(torch._neg_view(q), kv, idx, sinks)
    scale = torch.ones(1, requires_grad=True)
    kv8 = kv.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="require grad"):
        sparse_mla_decode(q, kv8, idx, sinks, kv_scale=scale)
    with torch.no_grad():
        sparse_mla_decode(q, kv8, idx, sinks, kv_scale=scale)  # under no_grad it is just a value
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16)
    for fn in (select, plan_call, explain_call, call_key):
        with pytest.raises(ValueError, match="'spec' must be a mla_sink.CallSpec"):
            fn({"q_dtype": "fp16"}, Platform("cpu"))
        with pytest.raises(ValueError, match="'platform' must be a mla_sink.Platform"):
            fn(spec, "cpu")
    for bad in ("xyz", 5, "meta"):
        with pytest.raises(ValueError, match="'device'"):
            Platform.detect(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not on this machine"):
            Platform.detect("cuda")


def test_decode_inputs_default_to_the_default_scale():
    q, kv, idx, sinks = _case(seed=11)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=16, sinks=True)
    out, lse = run(spec, DecodeInputs(q, kv, idx, sinks=sinks))
    ref_out, ref_lse = sparse_mla_decode(q, kv, idx, sinks, sm_scale=576 ** -0.5)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_a_compiled_launch_hands_the_arguments_in_signature_order(monkeypatch):
    """The GPU fast path, with a stand-in for Triton's JITFunction and CompiledKernel: the first call goes
    through ``jit_fn[grid](...)``; later calls reach the compiled kernel's launcher with every argument
    (per-call ones, then the fixed ones and the constexprs) in signature order, on the current stream."""
    from mla_sink.paths.triton import launch as L

    calls = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def run(self, *a):
            calls.append(("run", a))

        def __getitem__(self, grid):
            return lambda *a: calls.append(("runner", a))

    class Jit:
        arg_names = ["X", "Y", "n", "s", "BLOCK"]

        def __getitem__(self, grid):
            def first(**kw):
                calls.append(("first", grid, kw))
                return Compiled()
            return first

    monkeypatch.setattr(L, "_current_stream", lambda index: 1234 + index)
    k = L.CompiledLaunch(Jit(), (2, 3), {"BLOCK": 64}, {"num_warps": 4}, ("X", "Y"), {"n": 7, "s": 0.5},
                         device_index=1)
    k(True, "x0", "y0")
    assert calls[0] == ("first", (2, 3, 1), {"X": "x0", "Y": "y0", "n": 7, "s": 0.5, "BLOCK": 64, "num_warps": 4})
    k(True, "x1", "y1")
    assert calls[1] == ("run", (2, 3, 1, 1235, "fn", "meta", None, None, None, "x1", "y1", 7, 0.5, 64))
    k(False, "x2", "y2")  # another alignment pattern: compiled (or looked up) by Triton again
    assert calls[2][0] == "first"


def test_a_registered_launch_hook_takes_tritons_runner(monkeypatch):
    from triton import knobs

    from mla_sink.paths.triton import launch as L

    assert L._no_launch_hooks()
    hook = lambda *a: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not L._no_launch_hooks()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert L._no_launch_hooks()


def test_describe_pair_given_as_spec_says_to_unpack_it():
    """``mla_sink.describe`` returns ``(spec, platform)``; passing the pair as ``spec`` is refused with the
    unpacking to do."""
    import mla_sink
    q = torch.randn(1, 4, 576, dtype=torch.bfloat16)
    kv = torch.randn(16, 576, dtype=torch.bfloat16)
    idx = torch.zeros(1, 16, dtype=torch.int32)
    pair = mla_sink.describe(q, kv, idx)
    with pytest.raises(ValueError, match=r"got tuple\).*spec, platform = mla_sink.describe"):
        mla_sink.run(pair, mla_sink.DecodeInputs(q, kv, idx))


def test_a_layers_configuration_cannot_be_changed_after_construction():
    """``sm_scale``, ``sinks``, ``plan``, ``spec``, ``platform`` and ``path`` were checked in the constructor; a later
    assignment used to be accepted and either run unchecked (``sm_scale = nan`` made every output NaN, a string
    failed inside the kernel) or be silently ignored (``plan``, ``sinks``). Assigning or deleting one of them, or the
    private state behind them, now raises ``AttributeError`` naming the class; other attributes (a subclass's own)
    work as on any object, and the layer still deep-copies, pickles, takes weak references and has ``vars()``
    (thirty-ninth session's break tests)."""
    import copy
    import pickle
    import weakref

    from mla_sink import SparseMLADecode

    layer = SparseMLADecode(num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=torch.zeros(4))
    for name, value in (("sm_scale", float("nan")), ("sinks", torch.zeros(7)), ("plan", None), ("spec", None),
                        ("platform", None), ("path", "reference"), ("_sm_scale", float("nan")), ("_plan", None)):
        with pytest.raises(AttributeError, match=rf"SparseMLADecode\.{name} is fixed at construction"):
            setattr(layer, name, value)
    for name in ("sm_scale", "_spec"):
        with pytest.raises(AttributeError, match=rf"SparseMLADecode\.{name} is fixed at construction"):
            delattr(layer, name)
    assert layer.sm_scale == 576 ** -0.5 and layer.path is None and tuple(layer.sinks.shape) == (4,)
    layer.layer_idx = 3  # an engine's own tag
    assert vars(layer)["layer_idx"] == 3 and weakref.ref(layer)() is layer
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert other.spec == layer.spec and other.sm_scale == layer.sm_scale and other.plan == layer.plan
        with pytest.raises(AttributeError, match="is fixed at construction"):
            other._sm_scale = 1.0

    class Tagged(SparseMLADecode):
        def __init__(self, name, **kw):
            super().__init__(**kw)
            self.name = name

        @property
        def scale(self):
            return self.__dict__.get("_scale", 1.0)

        @scale.setter
        def scale(self, value):  # a subclass's own property: its own business
            self.__dict__["_scale"] = value

    tagged = Tagged("attn0", num_heads=4, q_dtype="bf16", kv_dtype="bf16", topk=8)
    tagged.scale = 3.0
    assert tagged.name == "attn0" and tagged.scale == 3.0
    with pytest.raises(AttributeError, match=r"Tagged\.sm_scale is fixed at construction"):
        tagged.sm_scale = 1.0
    for change in (lambda: setattr(tagged, "_built", False), lambda: delattr(tagged, "_built")):
        with pytest.raises(AttributeError, match=r"Tagged\._built is fixed at construction"):
            change()  # the switch that keeps the state itself


@pytest.mark.parametrize("view,error", [
    (lambda d: d[:4], r"'sinks' must have num_heads=8 entries \(got 4\)"),
    (lambda d: d.view(torch.bfloat16)[::2], r"'sinks' must be float32 \(got torch.bfloat16\)"),
])
def test_a_layers_sinks_follow_a_view_at_the_same_address(view, error):
    """``p.data`` replaced by a view at the same address: of another shape (``p.data[:4]``; thirty-ninth session's
    break test), or of the same shape with other strides (an expand) or another dtype (a bf16 reinterpretation;
    fortieth session's). The layer compared the pointer (then the shape) only and kept computing with its old
    sinks; it compares shape, strides and dtype, and the next call checks (and refuses) the new tensor, as the
    function refuses it."""
    from mla_sink import SparseMLADecode

    p = torch.nn.Parameter(torch.randn(8))
    layer = SparseMLADecode(num_heads=8, q_dtype="bf16", kv_dtype="bf16", topk=8, sinks=p)
    q = torch.randn(1, 8, 576).bfloat16()
    kv = torch.randn(32, 576).bfloat16()
    idx = torch.randint(0, 32, (1, 8), dtype=torch.int32)
    layer(q, kv, idx)
    p.data = view(p.data)
    assert p.data_ptr() == layer.sinks.data_ptr()
    with pytest.raises(ValueError, match=error):
        layer(q, kv, idx)
    with pytest.raises(ValueError, match=error):
        sparse_mla_decode(q, kv, idx, p.detach())


def test_fake_shape_inference_on_a_layer_while_another_thread_compiles():
    """A ``FakeTensorMode`` over a layer's real sinks, while another thread compiles (which sets the process-wide
    is_compiling flag), took the traced branch and detached the real sinks inside the fake mode, which PyTorch
    refused; it is shape inference, as without the other thread (thirty-ninth session's break test)."""
    import threading

    from torch._subclasses.fake_tensor import FakeTensorMode

    from mla_sink import SparseMLADecode

    layer = SparseMLADecode(num_heads=8, q_dtype="bf16", kv_dtype="bf16", topk=16, sinks=torch.randn(8))
    tensors = (torch.randn(1, 8, 576).bfloat16(), torch.randn(64, 576).bfloat16(),
               torch.randint(0, 64, (1, 16), dtype=torch.int32))

    def infer():
        with FakeTensorMode() as mode:
            return tuple(layer(*[mode.from_tensor(t) for t in tensors])[0].shape)

    entered, release = threading.Event(), threading.Event()

    def blocking_backend(gm, example_inputs):
        entered.set()
        release.wait(60)
        return gm

    torch._dynamo.reset()
    worker = threading.Thread(target=torch.compile(lambda x: x + 1, backend=blocking_backend), args=(torch.ones(2),))
    worker.start()
    try:
        assert entered.wait(60) and torch.compiler.is_compiling()
        assert infer() == (1, 8, 512)
    finally:
        release.set()
        worker.join(60)
    assert infer() == (1, 8, 512)


def test_an_eager_call_is_not_traced_while_another_thread_compiles():
    """``torch.compiler.is_compiling()`` is one process-wide flag that a compilation holds throughout: an eager call in
    another thread took the traced branch, the operator, whose real implementation took it again without end
    (``RecursionError``; thirty-ninth session's break test). The library asks :func:`mla_sink.core.trace.tracing`,
    per thread: the eager call runs (and a malformed one is refused) while the other thread compiles."""
    import threading

    import mla_sink
    from mla_sink.core.reference import sparse_mla_decode_reference as reference

    entered, release = threading.Event(), threading.Event()

    def blocking_backend(gm, example_inputs):
        entered.set()
        release.wait(60)
        return gm

    compiled = torch.compile(lambda x: x * 2, backend=blocking_backend, fullgraph=True)
    worker = threading.Thread(target=compiled, args=(torch.randn(3),))
    torch._dynamo.reset()
    worker.start()
    try:
        assert entered.wait(60) and torch.compiler.is_compiling()  # the other thread holds the flag
        g = torch.Generator().manual_seed(5)
        q = torch.randn(2, 4, 576, generator=g).bfloat16()
        kv = torch.randn(64, 576, generator=g).bfloat16()
        idx = torch.randint(-1, 64, (2, 16), generator=g, dtype=torch.int32)
        sinks = torch.randn(4, generator=g)
        out, lse = mla_sink.sparse_mla_decode(q, kv, idx, sinks=sinks)
        want, want_lse = reference(q, kv, idx, sinks)
        torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse.double(), want_lse.double(), atol=1e-3, rtol=1e-3)
        with pytest.raises(ValueError, match="'sm_scale' must be a finite float in"):
            mla_sink.sparse_mla_decode(q, kv, idx, sm_scale=1e39)
    finally:
        release.set()
        worker.join(60)
