"""The Triton decode kernel on the CPU (Triton's interpreter) against the float64 reference.

Adversarial inputs of docs/DESIGN.md: empty rows, ``-1`` anywhere, ids equal to N and to 2^31-1, ±inf
sinks, NaN in unreferenced KV rows, padded head counts, non-contiguous q, topk_length, logit cap,
split and unsplit launches. Output and LSE buffers are poisoned with NaN before every call.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

pytest.importorskip("triton")

from mla_sink.paths.triton.launch import sparse_mla_decode_triton  # noqa: E402
from mla_sink.paths.triton.plan import (  # noqa: E402
    TritonConfig, num_kv_splits_for, split_plan, triton_config)
from mla_sink.core.reference import sparse_mla_decode_reference  # noqa: E402

pytestmark = pytest.mark.interpreter

D_QK, D_V = 576, 512
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, **FP8}
NAN_BITS = {"fp8_e4m3": 0x7F, "fp8_e4m3fnuz": 0x80}

#: (atol, rtol) of ``out`` against float64, by out dtype. Under the interpreter every product is fp32
#: (half tiles are upcast), so the error is the final rounding of out to its dtype plus fp32 sums.
OUT_TOL = {torch.float16: (1e-3, 2e-3), torch.bfloat16: (8e-3, 8e-3)}
LSE_TOL = (2e-5, 1e-5)  # fp32 online softmax over <= 256 ids
BF16_SUBNORMAL_STEP = 2.0**-133  # the spacing of bf16 below 2^-126 (7 mantissa bits under the least exponent)



def config(**kw):
    """A hand-built :class:`TritonConfig`: ``kw`` over a base (the split policy only matters when
    ``num_kv_splits`` is not forced)."""
    base = dict(block_h=64, block_n=64, num_warps=8, num_stages=2, max_kv_splits=32, min_ids_per_split=64,
                split_waves=1.0, split_min_fill=0.5, combine_block_h=16, combine_block_d=D_V, min_combine_block_d=32,
                fp8_f16=True)
    return TritonConfig(**{**base, **kw})


UNSPLIT = config(block_h=16, block_n=32, num_warps=4, num_stages=1)
SPLIT_KW = dict(config=config(block_h=64, block_n=16, num_warps=4, num_stages=1), num_kv_splits=3)


def make_case(T, H, topk, q_dtype="bf16", kv_dtype="bf16", N=160, seed=0, sinks="mixed"):
    """Inputs whose rows are: 0 = ids with -1, -5, N, 2^31-1 mixed in; 1 = first 16 ids -1; 2 = empty. KV rows 0 and
    N-8.. are never referenced (NaN, as every unreferenced row)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D_QK, generator=g) * 1.5
    kv = torch.randn(N, D_QK, generator=g)
    idx = torch.randint(1, N - 8, (T, topk), generator=g, dtype=torch.int32)  # rows N-8.. never used, nor row 0,
    # where a masked gather would land if it clamped invalid ids to 0 (its NaN must not reach the result)
    bad = torch.tensor([-1, -5, N, 2**31 - 1], dtype=torch.int32)
    if T > 0:
        pos = torch.arange(0, topk, 3)
        idx[0, pos] = bad[torch.arange(len(pos)) % 4]
    if T > 1:
        idx[1, : min(16, topk - 1) if topk > 1 else 0] = -1
    if T > 2:
        idx[2] = -1
    q_scale = kv_scale = None
    if kv_dtype in FP8:
        kv = (kv * 0.5).to(FP8[kv_dtype])
        kv_scale = torch.tensor([1.7])
    else:
        kv = kv.to(DT[kv_dtype])
    if q_dtype in FP8:
        q = (q * 0.5).to(FP8[q_dtype])
        q_scale = torch.tensor([0.8])
    else:
        q = q.to(DT[q_dtype])
    # NaN in every row no valid id references: it must never reach the result.
    used = torch.zeros(N, dtype=torch.bool)
    ok = (idx >= 0) & (idx < N)
    used[idx[ok].long()] = True
    if kv_dtype in FP8:
        kv.view(torch.uint8)[~used] = NAN_BITS[kv_dtype]
    else:
        kv[~used] = float("nan")
    if sinks == "mixed":
        vals = [float("-inf"), 0.5, float("inf"), 0.0, 20.0, 100.0, -1.0, 2.0]
        s = torch.tensor([vals[h % len(vals)] for h in range(H)], dtype=torch.float32)
    elif sinks is None:
        s = None
    else:
        s = torch.full((H,), float(sinks))
    return dict(q=q, kv_cache=kv, indices=idx, sinks=s, q_scale=q_scale, kv_scale=kv_scale)


def run_both(case, sm_scale=None, **kw):
    """(kernel out, kernel lse, reference out, reference lse) with poisoned output buffers."""
    q = case["q"]
    T, H, _ = q.shape
    out_dtype = torch.bfloat16 if q.dtype in FP8.values() else q.dtype
    out = torch.full((T, H, D_V), float("nan"), dtype=out_dtype)
    lse = torch.full((T, H), float("nan"))
    extra = {k: kw.pop(k) for k in ("topk_length", "logit_cap") if k in kw}
    o, l = sparse_mla_decode_triton(case["q"], case["kv_cache"], case["indices"], case["sinks"], sm_scale,
                                    q_scale=case["q_scale"], kv_scale=case["kv_scale"], out=out, lse=lse,
                                    **extra, **kw)
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    assert not torch.isnan(o).any(), "out has NaN (unwritten element or leaked NaN)"
    assert not torch.isnan(l).any(), "lse has NaN (unwritten element or leaked NaN)"
    ro, rl = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"], sm_scale,
                                         q_scale=case["q_scale"], kv_scale=case["kv_scale"], **extra)
    return o, l, ro, rl


def check(o, l, ro, rl):
    atol, rtol = OUT_TOL[o.dtype]
    torch.testing.assert_close(o.double(), ro, atol=atol, rtol=rtol)
    torch.testing.assert_close(l, rl, atol=LSE_TOL[0], rtol=LSE_TOL[1])


@pytest.mark.parametrize("H,topk", list(itertools.product([1, 5, 16, 24, 64], [1, 37, 256])),
                         ids=lambda v: str(v))
def test_bf16_heads_topk(H, topk):
    case = make_case(4, H, topk)
    check(*run_both(case, config=UNSPLIT))


@pytest.mark.parametrize("q_dtype,kv_dtype", [
    ("fp16", "fp16"), ("bf16", "bf16"), ("bf16", "fp8_e4m3"), ("fp16", "fp8_e4m3"),
    ("bf16", "fp8_e4m3fnuz"), ("fp16", "fp8_e4m3fnuz"), ("fp8_e4m3", "fp8_e4m3"),
    ("fp8_e4m3fnuz", "fp8_e4m3fnuz"),
])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_dtypes(q_dtype, kv_dtype, split):
    case = make_case(4, 24, 37, q_dtype, kv_dtype, seed=1)
    kw = SPLIT_KW if split else dict(config=UNSPLIT)
    check(*run_both(case, **kw))


def test_fp8_max_values_decode_exactly():
    """Every finite fp8 bit pattern (including fnuz's +-240 at 0x7F/0xFF) dequantises like torch does."""
    cfg = config(block_h=16, block_n=32, num_warps=4, num_stages=1)
    for key, dt in FP8.items():
        bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        vals = bits.view(dt).float()
        finite = torch.isfinite(vals)
        row_bits = bits[finite][:D_QK]
        kv = torch.zeros(4, D_QK, dtype=torch.uint8)
        kv[0, : len(row_bits)] = row_bits
        kv = kv.view(dt)
        q = torch.zeros(1, 1, D_QK, dtype=torch.float16)
        q[0, 0, 0] = 1.0
        idx = torch.tensor([[0]], dtype=torch.int32)
        o, l = sparse_mla_decode_triton(q, kv, idx, kv_scale=torch.tensor([1.0]), config=cfg)
        ro, rl = sparse_mla_decode_reference(q, kv, idx, kv_scale=torch.tensor([1.0]))
        torch.testing.assert_close(o.double(), ro, atol=1e-3, rtol=2e-3, msg=key)


@pytest.mark.parametrize("sink", [float("-inf"), float("inf"), 0.0, 20.0, 100.0])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_sink_values(sink, split):
    case = make_case(3, 5, 37, sinks=sink, seed=2)
    kw = SPLIT_KW if split else dict(config=UNSPLIT)
    o, l, ro, rl = run_both(case, **kw)
    check(o, l, ro, rl)
    if sink == float("inf"):
        assert (o == 0).all()


@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_sink_is_applied_once(split):
    """With sinks the result differs from the sink-free one, and matches the reference."""
    case = make_case(3, 16, 256, sinks=None, seed=3)
    kw = SPLIT_KW if split else dict(config=UNSPLIT)
    o0, l0, _, _ = run_both(case, **kw)
    case["sinks"] = torch.linspace(3.0, 7.0, 16)  # lse ~ log(256): factors well inside (0, 1)
    o1, l1, ro, rl = run_both(case, **kw)
    assert not torch.allclose(o1[:2].float(), o0[:2].float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(l1, l0)  # the LSE is sink-free
    check(o1, l1, ro, rl)


def test_split_counts_and_empty_splits():
    case = make_case(4, 16, 256, seed=4)
    case["indices"][0, 64:] = -1  # the later splits of row 0 hold no valid id
    for splits in (2, 5, 16):
        cfg = config(block_h=16, block_n=16, num_warps=4, num_stages=1)
        check(*run_both(case, config=cfg, num_kv_splits=splits))


def test_noncontiguous_q():
    case = make_case(3, 8, 37, seed=5)
    base = torch.randn(3, 16, D_QK).to(torch.bfloat16)
    case["q"] = base[:, ::2]  # head stride 2 * 576
    check(*run_both(case, config=UNSPLIT))
    wide = torch.randn(3, 8, 2 * D_QK).to(torch.bfloat16)
    case["q"] = wide[..., ::2]  # stride(-1) = 2: copied by the launcher
    check(*run_both(case, config=UNSPLIT))


def _file_tensor(tmp_path, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor over a sparse file (pages exist only where written), so that a view may span more than 2^31
    elements on a machine with little memory."""
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(numel * torch.empty(0, dtype=dtype).element_size())
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype)


@pytest.mark.parametrize("split", [False, True])
def test_head_strides_beyond_int32(tmp_path, split):
    """q and out as token-major views of head-major buffers whose head stride puts ``(H - 1) * stride`` beyond
    2^31 elements: the kernel's head offsets are 64-bit (a 32-bit product wrapped and read or wrote far outside
    the tensors: a segfault under the interpreter, found by the break test of the twenty-fifth session)."""
    T, H, topk = 3, 3, 37
    case = make_case(T, H, topk, seed=11)
    stride = (1 << 30) + 1024  # (H - 1) * stride > 2^31
    q = _file_tensor(tmp_path, "q.bin", H * stride, torch.bfloat16).view(H, stride)[:, : T * D_QK]
    q = q.view(H, T, D_QK).transpose(0, 1)
    q.copy_(case["q"])
    case["q"] = q
    out = _file_tensor(tmp_path, "out.bin", H * stride, torch.bfloat16).view(H, stride)[:, : T * D_V]
    out = out.view(H, T, D_V).transpose(0, 1)
    out.fill_(float("nan"))
    assert (H - 1) * q.stride(1) >= 2**31 and (H - 1) * out.stride(1) >= 2**31
    kw = SPLIT_KW if split else dict(config=UNSPLIT)
    lse = torch.full((T, H), float("nan"))
    o, l = sparse_mla_decode_triton(case["q"], case["kv_cache"], case["indices"], case["sinks"], None, out=out,
                                    lse=lse, **kw)
    assert o.data_ptr() == out.data_ptr()
    ro, rl = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    check(o, l, ro, rl)


@pytest.mark.parametrize("split", [False, True])
def test_calls_beyond_the_grid_token_limit_run_in_token_ranges(monkeypatch, split):
    """A call of more tokens than a grid's y / z dimension holds (65535 on CUDA) runs as launches over token
    ranges: with the limit lowered to 2, seven tokens (ranges 2 + 2 + 2 + 1, two prepared runners) give what one
    launch gives, bit for bit, into a strided ``out`` and with ``topk_length`` (each range reads its own rows)."""
    import mla_sink.paths.triton.launch as launch_mod

    T, H, topk = 7, 5, 37
    case = make_case(T, H, topk, seed=23)
    tl_ = torch.tensor([37, 20, 5, 0, 37, 1, 36], dtype=torch.int32)
    kw = SPLIT_KW if split else dict(config=UNSPLIT)

    def call():
        out = torch.full((T, H + 1, D_V), float("nan"), dtype=torch.bfloat16)[:, 1:]  # head-strided out
        lse = torch.full((T, H), float("nan"))
        o, l = sparse_mla_decode_triton(case["q"], case["kv_cache"], case["indices"], case["sinks"], None,
                                        topk_length=tl_, out=out, lse=lse, **kw)
        assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
        return o, l

    whole = call()
    monkeypatch.setattr(launch_mod, "MAX_GRID_TOKENS", 2)
    ranged = call()
    torch.testing.assert_close(ranged[0], whole[0], atol=0, rtol=0)
    torch.testing.assert_close(ranged[1], whole[1], atol=0, rtol=0)
    ro, rl = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"],
                                         topk_length=tl_)
    check(*ranged, ro, rl)
    allocated = sparse_mla_decode_triton(case["q"], case["kv_cache"], case["indices"], case["sinks"],
                                         topk_length=tl_, **kw)  # outputs allocated by the ranged runner
    assert allocated[0].shape == (T, H, D_V) and allocated[1].shape == (T, H)
    check(*allocated, ro, rl)


def test_a_token_range_runner_keeps_no_call_tensors_alive(monkeypatch):
    """The prepared runner of a call beyond the grid's token limit (limit lowered to 2) holds the call's metadata,
    not its tensors: once the caller drops a pool and the runner stays cached, the pool is freed. It held the first
    call's inputs (q, a pool of any size, indices, out) for as long as it stayed cached (a break test, thirty-fourth
    session)."""
    import gc
    import weakref

    import mla_sink.paths.triton.launch as launch_mod
    from mla_sink.core.inputs import DecodeInputs

    monkeypatch.setattr(launch_mod, "MAX_GRID_TOKENS", 2)
    case = make_case(5, 3, 40, seed=31)
    plan = launch_mod.triton_plan_for(case["q"], case["kv_cache"], case["indices"], sinks=case["sinks"])
    x = DecodeInputs(q=case["q"], kv_cache=case["kv_cache"], indices=case["indices"], sm_scale=D_QK ** -0.5,
                     sinks=case["sinks"])
    runner = launch_mod.prepare_triton(plan, x)
    out, lse = runner(x)
    ro, rl = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    check(out, lse, ro, rl)
    pool = weakref.ref(case["kv_cache"])
    del x, case, out, lse
    gc.collect()
    assert runner is not None and pool() is None


def _failing_gluon(monkeypatch, error):
    """Simulate a Gluon kernel that fails to compile here: its compiled launch raises ``error``; the failed-kernel
    record starts empty. Returns the launch module."""
    import mla_sink.core.plan as plan_mod
    import mla_sink.paths.triton.launch as launch_mod

    def failing_launches(*args, **kwargs):
        def decode(*a):
            raise error
        return decode, None

    monkeypatch.setattr(plan_mod, "_FAILED_KERNELS", {})
    monkeypatch.setattr(launch_mod, "_gluon_launches", failing_launches)
    plan_mod._build_plan_cached.cache_clear()
    return launch_mod


def _seesaw_call(launch_mod, T, H, topk, seed, topk_length=None):
    """``(plan, x)`` of a bf16 call whose plan names the seesaw."""
    import attrs

    from mla_sink.core.inputs import DecodeInputs

    case = make_case(T, H, topk, seed=seed)
    plan = launch_mod.triton_plan_for(case["q"], case["kv_cache"], case["indices"], sinks=case["sinks"])
    plan = attrs.evolve(plan, launch=attrs.evolve(plan.launch, kernel="gluon_seesaw"))
    x = DecodeInputs(q=case["q"], kv_cache=case["kv_cache"], indices=case["indices"], sm_scale=D_QK ** -0.5,
                     sinks=case["sinks"], topk_length=topk_length)
    return plan, x, case


@pytest.mark.parametrize("error", ["OutOfResources", "PTXASError", "MLIRPassError"])
@pytest.mark.parametrize("limit", [None, 2])
def test_a_gluon_compile_failure_writes_the_callers_lse(monkeypatch, limit, error):
    """A Gluon kernel that fails to compile (Triton's ``OutOfResources``, or ptxas refusing the PTX) falls back to the
    portable kernel for the call itself, which must write the caller's ``lse`` buffer (and, over token ranges, each
    range's rows of the whole call's ``lse``): before, the fallback wrote a fresh tensor and a ranged call returned
    its uninitialised buffer, and a ``PTXASError`` propagated (break tests, thirty-first session). Over token ranges
    only the first range tries the kernel: one warning, the later ranges on the portable kernel at once; a runner
    prepared later from the same (stale) plan takes the portable kernel without trying it again."""
    import warnings

    from triton.runtime.errors import OutOfResources, PTXASError

    import mla_sink.core.plan as plan_mod

    import mla_sink.paths.triton.launch as launch_mod

    exc = {"OutOfResources": lambda: OutOfResources(300000, 232448, "shared memory"),
           "PTXASError": lambda: PTXASError("ptxas fatal"),
           "MLIRPassError": lambda: launch_mod.MLIRPassError("PassManager::run failed")}[error]()
    launch_mod = _failing_gluon(monkeypatch, exc)
    if limit is not None:
        monkeypatch.setattr(launch_mod, "MAX_GRID_TOKENS", limit)
    plan, x, case = _seesaw_call(launch_mod, 5, 16, 64, seed=29)
    lse, lse2 = torch.full((5, 16), float("nan")), torch.full((5, 16), float("nan"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            o, l = launch_mod.prepare_triton(plan, x)(x, lse)
            o2, l2 = launch_mod.prepare_triton(plan, x)(x, lse2)  # a plan made before the failure: portable at once
    finally:
        plan_mod._build_plan_cached.cache_clear()
    assert [str(w.message).count("portable kernel serves") for w in caught] == [1]
    assert "gluon_seesaw" in plan_mod.failed_kernels() and error in plan_mod.failed_kernels()["gluon_seesaw"]
    assert l.data_ptr() == lse.data_ptr() and l2.data_ptr() == lse2.data_ptr()
    ref = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    check(o, l, *ref)
    check(o2, l2, *ref)


class _FailingJit:
    """A stand-in for a ``@triton.jit`` function whose first launch raises ``error`` (compiling, or launching)."""

    arg_names = ("X",)
    __name__ = "failing_kernel"

    def __init__(self, error):
        self.error = error

    def __getitem__(self, grid):
        def launch(**kwargs):
            raise self.error
        return launch


def test_a_failed_mlir_pass_is_a_compile_failure_and_a_cuda_error_is_not():
    """Triton reports a failed MLIR pass as a plain ``RuntimeError('PassManager::run failed')``, which propagated
    out of a Gluon runner instead of falling back (break test, thirty-first session). ``CompiledLaunch`` raises it as
    ``MLIRPassError``, one of the compile errors the runners fall back on; any other ``RuntimeError`` of a first
    launch (a CUDA error) propagates as it was, since falling back would hide it."""
    from mla_sink.paths.triton.launch import CompiledLaunch, MLIRPassError, _compile_errors

    mlir = CompiledLaunch(_FailingJit(RuntimeError("PassManager::run failed")), (1,), {}, {}, ("X",), {})
    with pytest.raises(MLIRPassError, match="failing_kernel: PassManager::run failed") as info:
        mlir(True, 0)
    assert isinstance(info.value, _compile_errors()) and isinstance(info.value.__cause__, RuntimeError)
    cuda = RuntimeError("Triton Error [CUDA]: invalid argument")
    with pytest.raises(RuntimeError) as info:
        CompiledLaunch(_FailingJit(cuda), (1,), {}, {}, ("X",), {})(True, 0)
    assert info.value is cuda and not isinstance(info.value, _compile_errors())


def test_token_ranges_keep_the_gluon_kernels_pointers_aligned(monkeypatch):
    """Every token range runs the planned Gluon kernel: ranges of a multiple of 4 tokens keep 4-byte per-token rows
    (``topk_length``; ``lse`` at an odd head count) 16-byte aligned, which the seesaw checks on every call (a
    misaligned range took the portable kernel: a break test, thirty-first session). The launches are recorded, not
    run; the limit is lowered to 6 (ranges of 4)."""
    import mla_sink.paths.triton.launch as launch_mod

    ran = []
    monkeypatch.setattr(launch_mod, "_gluon_launches",
                        lambda *a, **k: ((lambda align, *args: ran.append(("seesaw", align))), None))
    monkeypatch.setattr(launch_mod, "_portable_instead", lambda *a, **k: (lambda x, lse=None: ran.append("portable")))
    monkeypatch.setattr(launch_mod, "MAX_GRID_TOKENS", 6)
    T = 13
    plan, x, _ = _seesaw_call(launch_mod, T, 5, 16, seed=31, topk_length=torch.full((T,), 16, dtype=torch.int32))
    launch_mod.prepare_triton(plan, x)(x)
    assert ran == [("seesaw", True)] * 4  # ranges 0-4, 4-8, 8-12, 12-13, every pointer 16-byte aligned


def test_topk_length():
    case = make_case(4, 5, 37, seed=6)
    tl_ = torch.tensor([37, 20, 5, 0], dtype=torch.int32)
    check(*run_both(case, config=UNSPLIT, topk_length=tl_))
    check(*run_both(case, topk_length=tl_, **SPLIT_KW))


def test_logit_cap_and_scale():
    case = make_case(3, 5, 37, seed=7)
    check(*run_both(case, sm_scale=0.2, config=UNSPLIT, logit_cap=3.0))
    check(*run_both(case, sm_scale=0.2, logit_cap=3.0, **SPLIT_KW))


@pytest.mark.parametrize("cap", [0.05, 1e6])
def test_logit_cap_extremes(cap):
    """Tiny caps saturate; huge caps must equal no cap (no cancellation in tanh for small s/cap)."""
    case = make_case(3, 5, 37, seed=17)
    check(*run_both(case, sm_scale=0.2, config=UNSPLIT, logit_cap=cap))


def test_default_config_and_allocation():
    case = make_case(2, 5, 37, seed=8)
    o, l = sparse_mla_decode_triton(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    ro, rl = sparse_mla_decode_reference(case["q"], case["kv_cache"], case["indices"], case["sinks"])
    assert o.shape == (2, 5, D_V) and o.dtype == torch.bfloat16 and l.dtype == torch.float32
    check(o, l, ro, rl)


def test_empty_batch():
    q = torch.zeros(0, 4, D_QK, dtype=torch.bfloat16)
    o, l = sparse_mla_decode_triton(q, torch.zeros(8, D_QK, dtype=torch.bfloat16),
                                    torch.zeros(0, 16, dtype=torch.int32))
    assert o.shape == (0, 4, D_V) and l.shape == (0, 4)


def test_all_rows_empty():
    case = make_case(2, 5, 37, seed=9)
    case["indices"][:] = -1
    o, l, ro, rl = run_both(case, **SPLIT_KW)
    assert (o == 0).all() and torch.isneginf(l).all()


def test_tuning_table_and_split_heuristic():
    cfg = triton_config("sm90", "bf16", "bf16", 128, 256, topk=2048)
    assert cfg.row.startswith("sm90")
    assert cfg.block_h_for(5) == 16 and cfg.block_h_for(128) == cfg.block_h
    for arch in ("sm80", "sm100", "gfx942", "gfx950", "cpu"):
        assert triton_config(arch, "bf16", "bf16", 16, 2, topk=2048).block_n >= 16
    # Few tokens split, many do not; never more splits than ids allow.
    assert num_kv_splits_for(cfg, 256, 2, 2048, 132) == 1
    assert num_kv_splits_for(cfg, 2, 2, 2048, 132) > 1
    assert num_kv_splits_for(cfg, 1, 1, 64, 132) == 1
    assert math.isfinite(cfg.split_waves)


def test_tuning_table_passes_checker():
    from mla_sink import dispatch
    from mla_sink.core.tables import table_path

    assert dispatch.check_table(dispatch.load_table(table_path("triton_tuning"))) == []


@pytest.mark.parametrize("q_mag", [1e-6, 1.0, 3e5], ids=["tiny_q", "unit_q", "huge_q"])
@pytest.mark.parametrize("fp8_f16", [True, False], ids=["fp16_tiles", "bf16_tiles"])
def test_fp8_kv_tile_dtypes(q_mag, fp8_f16):
    """bf16 q with fp8 KV: fp16 tiles (q scaled per row by a power of two) and bf16 tiles agree with float64."""
    case = make_case(3, 16, 37, "bf16", "fp8_e4m3", seed=10)
    case["q"] = (case["q"].float() * q_mag).to(torch.bfloat16)
    cfg = config(block_h=16, block_n=32, num_warps=4, num_stages=1, fp8_f16=fp8_f16)
    check(*run_both(case, sm_scale=1.0 / q_mag / 24.0, config=cfg))


def test_split_plan_rounding_and_explain_agree_with_launcher():
    cfg = config(block_n=64, max_kv_splits=32, min_ids_per_split=128)
    assert split_plan(cfg, 2, 128, 2048, 132, requested=16) == (16, 128)
    assert split_plan(cfg, 2, 128, 37, 132, requested=4) == (1, 64)  # never more splits than 64-id blocks
    assert split_plan(cfg, 2, 128, 1000, 132, requested=3) == (3, 384)  # whole blocks per split
    assert split_plan(cfg, 2, 128, 0, 132, requested=5) == (1, 64)
    from mla_sink.core.plan import build_plan
    from mla_sink.core.platform import detect_platform
    from mla_sink.core.records import CallSpec
    from mla_sink.paths.triton.launch import triton_plan_for

    for T, H, topk in [(1, 5, 37), (3, 64, 256), (2, 16, 1000)]:
        q = torch.zeros(T, H, D_QK, dtype=torch.bfloat16)
        idx = torch.zeros(T, topk, dtype=torch.int32)
        launched = triton_plan_for(q, torch.zeros(8, D_QK, dtype=torch.bfloat16), idx).launch
        spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=H, topk=topk, need_lse=True)
        shown = build_plan(spec, detect_platform("cpu"), num_tokens=T, path="triton").launch  # what explain prints
        assert launched == shown


def test_cpu_calls_from_several_threads():
    """The interpreter's stdlib swap is process-wide; concurrent CPU calls take turns instead of failing."""
    import threading

    results, errors = {}, []

    def work(seed):
        try:
            c = make_case(3, 16, 32, seed=seed)
            args = (c["q"], c["kv_cache"], c["indices"], c["sinks"])
            results[seed] = (sparse_mla_decode_triton(*args)[0], sparse_mla_decode_reference(*args)[0])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 4
    for out, ref in results.values():
        assert (out.double() - ref).abs().max() < 2e-2


def test_gluon_runners_buffers_and_topk_length():
    """The per-call buffers the Gluon runners share (mla_sink/paths/triton/launch.py), on CPU tensors: fresh
    ``out`` / ``lse`` unless given, fp32 partials only when split, and ``topk_length`` made unit-stride."""
    from mla_sink.core.inputs import DecodeInputs
    from mla_sink.paths.triton.launch import _call_buffers, _contiguous_topk_length

    q = torch.zeros(3, 5, 576, dtype=torch.bfloat16)
    x = DecodeInputs(q=q, kv_cache=torch.zeros(8, 576, dtype=torch.bfloat16),
                     indices=torch.zeros(3, 64, dtype=torch.int32),
                     topk_length=torch.arange(6, dtype=torch.int32)[::2])
    topk_length = _contiguous_topk_length(x)
    assert topk_length.stride(0) == 1 and topk_length.tolist() == [0, 2, 4]
    out, lse, part_out, part_lse = _call_buffers(x, None, 4, torch.bfloat16)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((3, 5, 512), torch.bfloat16, (3, 5), torch.float32)
    assert (part_out.shape, part_out.dtype, part_lse.shape) == ((3, 4, 5, 512), torch.float32, (3, 4, 5))
    given_out = torch.empty(3, 5, 512, dtype=torch.bfloat16)
    given_lse = torch.empty(3, 5)
    x2 = DecodeInputs(q=q, kv_cache=x.kv_cache, indices=x.indices, out=given_out)
    out, lse, part_out, part_lse = _call_buffers(x2, given_lse, 1, torch.bfloat16)
    assert out is given_out and lse is given_lse and part_out is given_lse and part_lse is given_lse
    assert _contiguous_topk_length(x2) is None


@pytest.mark.parametrize("where", ["q", "kv", "ds_rope"])
def test_bf16_subnormals_are_read_exactly(where):
    """bf16 values below 2^-126 (subnormals) in q, in a bf16 cache, and in the bf16 RoPE of V3.2 rows are read as
    the numbers they are: Triton 3.9's interpreter converts them to other values (1e-39 to 4.4e-39), which the
    kernels' UPCAST decode avoids (kmath.upcast). The other operand is scaled up so that the scores are O(1) and
    the error of a wrong conversion (a factor of up to 4 on a term) is far outside the LSE budget."""
    import mla_sink
    g = torch.Generator().manual_seed(7)
    T, H, N, topk = 2, 3, 40, 8
    tiny, big = 1e-39, 2e36
    q = torch.randn(T, H, D_QK, generator=g)
    kv = torch.randn(N, D_QK, generator=g)
    if where == "q":
        q, kv, sm_scale, out_unit = (q * tiny).bfloat16(), (kv * big).bfloat16(), 1.0, big
        tiny_part = q
    elif where == "kv":
        q, kv, sm_scale, out_unit = (q * big).bfloat16(), (kv * tiny).bfloat16(), 1.0, tiny
        tiny_part = kv
    else:  # the RoPE of the rows subnormal, q's RoPE part large: the RoPE's share of each score O(1)
        kv[:, 512:] *= tiny
        q[..., 512:] *= big
        q, kv, sm_scale, out_unit = q.bfloat16(), mla_sink.quantize_kv_cache(kv), None, 1.0
        tiny_part = kv[:, 528:].contiguous().view(torch.bfloat16)  # the rows' RoPE as stored
    assert ((tiny_part.float().abs() < 2.0**-126) & (tiny_part != 0)).float().mean() > 0.5  # mostly subnormals
    idx = torch.randint(0, N, (T, topk), generator=g, dtype=torch.int32)
    out, lse = mla_sink.sparse_mla_decode(q, kv, idx, sm_scale=sm_scale, return_lse=True)
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sm_scale=sm_scale)
    torch.testing.assert_close(lse, rl.float(), atol=LSE_TOL[0], rtol=LSE_TOL[1])
    # out against the reference rounded to bf16: at 1e-39 the output itself is a bf16 subnormal (steps of 2^-133,
    # about 9% of it), so one step of that grid is added to the budget
    atol, rtol = OUT_TOL[torch.bfloat16]
    atol = max(atol, BF16_SUBNORMAL_STEP / out_unit)
    torch.testing.assert_close(out.double() / out_unit, ro.to(torch.bfloat16).double() / out_unit, atol=atol,
                               rtol=rtol)
