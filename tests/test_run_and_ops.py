"""run(), the layer object and the torch.library custom ops, end to end on the CPU."""

from __future__ import annotations

import pytest
import torch

from mla_sink import CallSpec, DecodeInputs, Platform, SparseMLADecode, run, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference as ref

CPU_NO_TRITON = Platform("cpu", triton=False)


def inputs(T=3, H=5, N=64, topk=24, dtype=torch.float16, seed=0, sinks=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 576, generator=g).to(dtype)
    kv = torch.randn(N, 576, generator=g).to(dtype)
    kv[N - 1] = float("nan")  # never referenced below
    idx = torch.randint(0, N - 1, (T, topk), generator=g, dtype=torch.int32)
    idx[0, 3] = -1
    idx[1, :5] = -1
    idx[-1] = -1
    s = torch.randn(H, generator=g) * 2 if sinks else None
    return q, kv, idx, s


@pytest.mark.parametrize("platform,path", [(CPU_NO_TRITON, "reference"),
                                           pytest.param(Platform("cpu"), "triton", marks=pytest.mark.interpreter)])
def test_run_matches_float64(platform, path):
    from mla_sink import prepare

    q, kv, idx, s = inputs()
    # the table's choice on this platform is the path this case is about (the parameter named it and went unread)
    assert prepare(CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=5, topk=24, sinks=True), platform).path == path
    out, lse = sparse_mla_decode(q, kv, idx, s, platform=platform)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    r_out, r_lse = ref(q, kv, idx, s)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)
    finite = torch.isfinite(r_lse)
    torch.testing.assert_close(lse[finite].double(), r_lse[finite].double(), atol=1e-4, rtol=1e-4)
    assert torch.isneginf(lse[-1]).all() and (out[-1] == 0).all()


def test_lse_returned_iff_needed():
    q, kv, idx, _ = inputs(sinks=False)
    out, lse = sparse_mla_decode(q, kv, idx, platform=CPU_NO_TRITON)
    assert lse is None
    out, lse = sparse_mla_decode(q, kv, idx, platform=CPU_NO_TRITON, return_lse=True)
    assert lse is not None and lse.shape == (3, 5)


def test_out_buffer_is_written_in_place():
    q, kv, idx, s = inputs()
    buf = torch.full((3, 5, 512), float("nan"), dtype=torch.float16)
    out, _ = sparse_mla_decode(q, kv, idx, s, out=buf, platform=CPU_NO_TRITON)
    assert out.data_ptr() == buf.data_ptr() and not buf.isnan().any()


def test_layer_runs_the_planned_path():
    q, kv, idx, s = inputs()
    layer = SparseMLADecode(num_heads=5, q_dtype="fp16", kv_dtype="fp16", topk=24, sinks=s, platform=CPU_NO_TRITON)
    assert layer.plan.path == "reference" and "reference" in repr(layer)
    out, lse = layer(q, kv, idx)
    r_out, _ = ref(q, kv, idx, s)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)


def test_forced_path():
    q, kv, idx, s = inputs()
    out, _ = sparse_mla_decode(q, kv, idx, s, path="reference")
    r_out, _ = ref(q, kv, idx, s)
    # the forced reference is the float64 reference rounded once: exactly equal (within a tolerance, the Triton path
    # the table would choose here passed too, so the check could not see a forced path ignored)
    assert torch.equal(out, r_out.to(out.dtype))


def _op_args(q, kv, idx, s, path):
    return (q, kv, idx, s, 576 ** -0.5, None, None, None, True, 0.0, path)


@pytest.mark.parametrize("path", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_opcheck_out_of_place(path):
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    torch.library.opcheck(torch.ops.mla_sink.sparse_mla_decode.default, _op_args(q, kv, idx, s, path))


@pytest.mark.parametrize("path", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_opcheck_in_place(path):
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    out = torch.empty(2, 3, 512, dtype=torch.float16)
    a = _op_args(q, kv, idx, s, path)
    torch.library.opcheck(torch.ops.mla_sink.sparse_mla_decode_out.default, (*a[:8], out, *a[8:]))


def test_compile_fullgraph_traces_run():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=3, topk=8, sinks=True)

    def step(q, kv, idx, s):
        out, lse = run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=576 ** -0.5, sinks=s), path="reference")
        return out.float() * 2, lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, kv, idx, s)
    e_out, e_lse = step(q, kv, idx, s)
    torch.testing.assert_close(out, e_out)
    torch.testing.assert_close(lse, e_lse)


def test_compile_with_a_pool_of_symbolic_rows():
    """A pool whose row count is symbolic (``mark_dynamic``) while q's and the ids' sizes are not: the operator's
    tracing check plans only with concrete sizes, the pool's included (its span, ``CallSpec.kv_cache_bytes``, is
    read from them); it raised PyTorch's fake-tensor error when it planned with the symbolic pool (a mutation audit,
    forty-seventh session). Two pool sizes, one graph, each equal to the eager call."""
    from mla_sink import sparse_mla_decode

    torch.manual_seed(0)
    q, idx, s = torch.randn(2, 16, 576).bfloat16(), torch.randint(0, 64, (2, 8), dtype=torch.int32), torch.zeros(16)
    fn = torch.compile(lambda q, kv, i, s: sparse_mla_decode(q, kv, i, s, path="reference"), fullgraph=True,
                       dynamic=False, backend="eager")
    for n in (64, 96):
        kv = torch.randn(n, 576).bfloat16()
        torch._dynamo.mark_dynamic(kv, 0)
        out, lse = fn(q, kv, idx, s)
        ref_out, ref_lse = sparse_mla_decode(q, kv, idx, s, path="reference")
        assert out.shape == (2, 16, 512) and torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_compile_fullgraph_run_and_layer_with_out():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=3, topk=8, sinks=True)
    layer = SparseMLADecode(num_heads=3, q_dtype="fp16", kv_dtype="fp16", topk=8, sinks=s, path="reference",
                            platform=Platform("cpu"))
    want, _ = run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=576 ** -0.5, sinks=s), path="reference")

    def via_run(q, kv, idx, s, out):
        return run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=576 ** -0.5, sinks=s, out=out),
                   path="reference")[0]

    for fn in (via_run, lambda q, kv, idx, s, out: layer(q, kv, idx, out=out)[0]):
        out = torch.empty(2, 3, 512, dtype=torch.float16)
        torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kv, idx, s, out)
        torch.testing.assert_close(out, want)


def test_compiled_run_refuses_a_gpu_platform_for_cpu_tensors():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=3, topk=8, sinks=True)
    gpu = Platform("gfx942", "0.1.20")

    def step(q, kv, idx, s):
        return run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=0.04, sinks=s), platform=gpu)

    with pytest.raises(Exception, match="'platform' describes arch 'gfx942'"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(q, kv, idx, s)


def test_non_positive_logit_caps_all_mean_no_cap():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=3, topk=8, sinks=True)
    x = dict(q=q, kv_cache=kv, indices=idx, sm_scale=0.04, sinks=s)
    a, _ = run(spec, DecodeInputs(**x, logit_cap=-1.0), path="reference")
    b, _ = run(spec, DecodeInputs(**x), path="reference")
    torch.testing.assert_close(a, b)


def test_numpy_integers_are_accepted_in_records():
    np = pytest.importorskip("numpy")
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=np.int64(4), topk=np.int32(8))
    assert spec == CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4, topk=8)
    with pytest.raises(ValueError, match="'num_heads' must be an int >= 1"):
        CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=4.0, topk=8)


def test_out_op_rejects_wrong_out_shape_before_the_kernel():
    q, kv, idx, _ = inputs(T=2, H=5, topk=16)
    bad = torch.zeros(2, 5, 100, dtype=torch.float16)
    with pytest.raises(ValueError, match="'out' must be"):
        torch.ops.mla_sink.sparse_mla_decode_out(q, kv, idx, None, 0.04, None, None, None, bad, False, 0.0, "")


def test_op_rejects_fp8_without_scale_and_bad_sm_scale():
    q, kv, idx, _ = inputs(T=2, H=3, topk=8)
    kv8 = kv.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="'kv_scale' is required"):
        torch.ops.mla_sink.sparse_mla_decode(q, kv8, idx, None, 0.04, None, None, None, False, 0.0, "")
    with pytest.raises(ValueError, match="'sm_scale'"):
        torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, None, -1.0, None, None, None, False, 0.0, "")


def test_compiled_run_still_validates():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=4, topk=8, sinks=True)  # wrong heads

    def step(q, kv, idx, s):
        return run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=0.04, sinks=s))

    with pytest.raises(Exception, match="num_heads"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(q, kv, idx, s)


def test_compile_fullgraph_traces_sparse_mla_decode():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    f = torch.compile(lambda q, kv, i, s: sparse_mla_decode(q, kv, i, sinks=s, path="reference"),
                      fullgraph=True, backend="aot_eager")
    out, lse = f(q, kv, idx, s)
    e_out, e_lse = sparse_mla_decode(q, kv, idx, sinks=s, path="reference")
    torch.testing.assert_close(out, e_out)
    torch.testing.assert_close(lse, e_lse)


@pytest.mark.interpreter
def test_non_contiguous_topk_length():
    q, kv, idx, s = inputs(T=3, H=4, topk=16)
    tl = torch.tensor([[2, 0], [16, 0], [5, 0]], dtype=torch.int32)[:, 0]
    out, lse = sparse_mla_decode(q, kv, idx, s, topk_length=tl, platform=Platform("cpu"))
    r_out, r_lse = ref(q, kv, idx, s, topk_length=tl.contiguous())
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)


def test_bad_records_and_devices_name_the_argument():
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    with pytest.raises(ValueError, match="'platform' must be a mla_sink.Platform"):
        sparse_mla_decode(q, kv, idx, platform="cpu")
    with pytest.raises(ValueError, match="'logit_cap' must be a finite float"):
        sparse_mla_decode(q, kv, idx, logit_cap="x")
    meta_out, meta_lse = sparse_mla_decode(q.to("meta"), kv.to("meta"), idx.to("meta"))  # shape inference
    assert meta_out.device.type == "meta" and meta_out.shape == (2, 3, 512) and meta_lse is None
    with pytest.raises(ValueError, match="no backward"):
        sparse_mla_decode(q.float().requires_grad_().half(), kv, idx)


def test_layer_construction_rejections():
    with pytest.raises(ValueError, match="'sinks' must be on a cpu device"):
        SparseMLADecode(num_heads=3, q_dtype="fp16", kv_dtype="fp16", topk=8, sinks=torch.zeros(3, device="meta"),
                        platform=Platform("cpu"))
    with pytest.raises(ValueError, match="dcp_world_size == 1"):
        SparseMLADecode(num_heads=3, q_dtype="fp16", kv_dtype="fp16", topk=8, dcp_group=object(),
                        platform=Platform("cpu"))
    with pytest.raises(ValueError, match="'sm_scale'"):
        SparseMLADecode(num_heads=3, q_dtype="fp16", kv_dtype="fp16", topk=8, sm_scale="abc", platform=Platform("cpu"))
    layer = SparseMLADecode(num_heads=5, q_dtype="fp16", kv_dtype="fp16", topk=8, sinks=torch.zeros(5),
                            platform=Platform("cpu"))
    q, kv, idx, _ = inputs(T=2, H=6, topk=8)
    with pytest.raises(ValueError, match="'q' has 6 heads but the layer was built with num_heads=5"):
        layer(q, kv, idx)


def test_layer_names_every_tensor_of_another_dtype():
    """A layer built for fp16 given bf16 tensors names q and kv_cache, each with the dtype it gives and the layer's,
    before the per-dtype checks (which would name the dtype pair alone: a break test, seventy-seventh session)."""
    layer = SparseMLADecode(num_heads=5, q_dtype="fp16", kv_dtype="fp16", topk=24, platform=CPU_NO_TRITON)
    q, kv, idx, _ = inputs(sinks=False)
    q_text = "'q' gives q_dtype='bf16' but spec.q_dtype='fp16'"
    kv_text = "'kv_cache' gives kv_dtype='bf16' but spec.kv_dtype='fp16'"
    for q_in, kv_in, want in ((q.bfloat16(), kv.bfloat16(), f"{q_text}; {kv_text} "), (q.bfloat16(), kv, q_text),
                              (q, kv.bfloat16(), f"^{kv_text}")):
        with pytest.raises(ValueError, match=want.replace("(", r"\(")):
            layer(q_in, kv_in, idx)
    out, _ = layer(q, kv, idx)  # the layer's own dtypes still run
    torch.testing.assert_close(out.double(), ref(q, kv, idx)[0], atol=2e-3, rtol=1e-2)


def test_layer_takes_torch_dtypes_and_names_bad_options():
    layer = SparseMLADecode(num_heads=5, q_dtype=torch.float16, kv_dtype=torch.float16, topk=24,
                            platform=CPU_NO_TRITON)
    assert (layer.spec.q_dtype, layer.spec.kv_dtype) == ("fp16", "fp16")
    base = dict(num_heads=3, q_dtype="fp16", kv_dtype="fp16", topk=8, platform=Platform("cpu"))
    for kw, message in ((dict(q_dtype=torch.float32), r"'q_dtype' must be in \('bf16', .*\) or the torch dtype of"),
                        (dict(return_lse=None), "'return_lse' must be a bool"),
                        (dict(logit_cap="3"), "'logit_cap' must be a finite float")):
        with pytest.raises(ValueError, match=message):
            SparseMLADecode(**{**base, **kw})


def test_run_accepts_a_mapping_of_tensors():
    q, kv, idx, s = inputs()
    spec = CallSpec(q_dtype="fp16", kv_dtype="fp16", num_heads=5, topk=24, sinks=True)
    out, lse = run(spec, {"q": q, "kv_cache": kv, "indices": idx, "sinks": s}, path="reference")
    r_out, _ = ref(q, kv, idx, s)
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)
    with pytest.raises(ValueError, match="'inputs' keys"):
        run(spec, {"q": q, "kv": kv, "indices": idx})
    with pytest.raises(ValueError, match="'inputs' must be"):
        run(spec, (q, kv, idx))


def test_the_operators_bad_path_message_says_their_own_unset_value():
    """The operators' ``path`` is a str whose "no forced path" is ``''``: a refused name says so, not ``None``, which
    their schema refuses (a break test, forty-second session); the function's message keeps ``None``."""
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    for args in (_op_args(q, kv, idx, s, "bogus"), _op_args(*[t.to("meta") for t in (q, kv, idx, s)], "bogus")):
        with pytest.raises(ValueError, match=r"or '' to let the table choose \(got 'bogus'\)"):
            torch.ops.mla_sink.sparse_mla_decode(*args)
    with pytest.raises(ValueError, match=r"or None to let the table choose \(got 'bogus'\)"):
        sparse_mla_decode(q, kv, idx, s, path="bogus")


def test_a_bad_forced_path_is_refused_while_tracing():
    """The fake implementations never looked at ``path``: meta tensors and ``torch.compile`` took ``path="bogus"``
    and a path that cannot serve the device, which failed only when the graph ran (break test, thirty-third
    session). The name is checked on every device, whether it serves the call where the device is known."""
    from mla_sink.core.select import NoKernelError

    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    meta = [t.to("meta") for t in (q, kv, idx, s)]
    with pytest.raises(ValueError, match="'path' must be one of"):
        torch.ops.mla_sink.sparse_mla_decode(*_op_args(*meta, "bogus"))
    out = torch.empty(2, 3, 512, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="'path' must be one of"):
        a = _op_args(*meta, "bogus")
        torch.ops.mla_sink.sparse_mla_decode_out(*a[:8], out, *a[8:])
    assert torch.ops.mla_sink.sparse_mla_decode(*_op_args(*meta, "aiter_lse"))[0].shape == (2, 3, 512)  # no device
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (q, kv, idx, s)]
        with pytest.raises(NoKernelError, match=r"(?s)-cpu-.*no row matched.*aiter_version=None"):  # AITER's absence
            torch.ops.mla_sink.sparse_mla_decode(*_op_args(*fake, "aiter_lse"))
        assert torch.ops.mla_sink.sparse_mla_decode(*_op_args(*fake, "reference"))[0].shape == (2, 3, 512)
    f = torch.compile(lambda q: sparse_mla_decode(q, kv, idx, s, path="bogus"), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="'path' must be one of"):
        f(q)
    # fake tensors of a GPU this machine may lack (torch.export for a GPU target on a CPU host): the name is checked,
    # the serving check needs the device (a fourth break test found every forced path refused there)
    with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=False):
        fake = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (q, kv, idx, s)]
        assert sparse_mla_decode(*fake[:3], fake[3], path="reference")[0].shape == (2, 3, 512)
        with pytest.raises(ValueError, match="'path' must be one of"):
            sparse_mla_decode(*fake[:3], fake[3], path="bogus")


def test_a_layer_built_under_a_fake_mode_names_sinks_with_data():
    """Built inside a ``FakeTensorMode`` with real sinks, the layer raised torch's own ``AssertionError`` from its
    ``detach`` (break test, seventy-second session): a ``ValueError`` names ``sinks`` and the two ways that work, and
    both work - sinks as a FakeTensor of the mode, or the layer built outside it and called on fake q."""
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    args = dict(num_heads=3, q_dtype=q.dtype, kv_dtype=kv.dtype, topk=8)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        with pytest.raises(ValueError, match=r"^'sinks' is a tensor with data while a FakeTensorMode is active"):
            SparseMLADecode(**args, sinks=s)
        out, _ = SparseMLADecode(**args, sinks=mode.from_tensor(s))(*(mode.from_tensor(t) for t in (q, kv, idx)))
        assert out.shape == (2, 3, 512)
    layer = SparseMLADecode(**args, sinks=s)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        assert layer(*(mode.from_tensor(t) for t in (q, kv, idx)))[0].shape == (2, 3, 512)


def test_the_operators_refuse_inputs_that_require_grad():
    """The operators and compiled calls returned outputs that required grad, whose ``backward()`` failed with
    PyTorch's generic "no autograd formula" (break test, thirty-third session): they refuse such a call as the
    eager function does, and run it under ``torch.no_grad()``."""
    q, kv, idx, s = inputs(T=2, H=3, topk=8)
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"^'q' must not require grad .* no backward"):
        torch.ops.mla_sink.sparse_mla_decode(*_op_args(qg, kv, idx, s, "reference"))
    sg = s.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"^'sinks' must not require grad"):
        torch.ops.mla_sink.sparse_mla_decode(*_op_args(q, kv, idx, sg, "reference"))
    with torch.no_grad():
        out, _ = torch.ops.mla_sink.sparse_mla_decode(*_op_args(qg, kv, idx, s, "reference"))
    ref_out, _ = ref(q, kv, idx, s)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-3, rtol=1e-2)
    buf = torch.empty(2, 3, 512, dtype=torch.float16)
    for kwargs in ({}, {"out": buf}):
        f = torch.compile(lambda q: sparse_mla_decode(q, kv, idx, s, path="reference", **kwargs), fullgraph=True,
                          backend="aot_eager")
        with pytest.raises(Exception, match="'q' must not require grad"):
            f(qg)
        with torch.no_grad():
            assert f(qg)[0].shape == (2, 3, 512)


@pytest.mark.parametrize("name", ["sparse_mla_decode", "sparse_mla_decode_out"])
def test_help_on_an_operator_shows_its_docstring(name):
    """``help(torch.ops.mla_sink.X)`` showed nothing and the ``CustomOpDef`` PyTorch's generic class text: both now
    carry the definition's docstring (shapes, schema order, errors)."""
    import inspect

    import mla_sink.ops as ops

    definition = getattr(ops, f"{name}_op")
    for obj in (getattr(torch.ops.mla_sink, name), definition):
        doc = inspect.getdoc(obj)
        assert doc == inspect.cleandoc(definition._init_fn.__doc__) and "Raises:" in doc, name
