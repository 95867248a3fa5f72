"""Tensor layouts and kinds an inference engine may pass, through every entry point (the forty-first session's break
test): strided, offset, expanded and size-1-odd-stride views of every argument equal the float64 reference; tensors
a kernel must not write (an inference tensor ``out`` outside inference mode) or cannot read (a tensor without data
beside real ones) are refused by name before any kernel runs, on a call's first run and on a prepared signature."""

from __future__ import annotations

import pytest
import torch

import mla_sink.api as api
from mla_sink import CallSpec, DecodeInputs, SparseMLADecode, quantize_kv_cache, run, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference as reference

pytestmark = pytest.mark.interpreter

T, H, N, K = 2, 3, 48, 16
SM = 576 ** -0.5


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 576, generator=g).bfloat16()
    kv = torch.randn(N, 576, generator=g)
    idx = torch.randint(-1, N + 2, (T, K), generator=g, dtype=torch.int32)
    return q, kv, idx


def _strided_copy(t: torch.Tensor, shape, strides, offset: int) -> torch.Tensor:
    """``t``'s values in a view of ``shape`` / ``strides`` starting ``offset`` elements into a larger storage."""
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    v = torch.zeros(offset + span, dtype=t.dtype).as_strided(shape, strides, offset)
    v.copy_(t)
    return v


def _views():
    """(name, q, kv_cache, indices, topk_length, out) - every argument in an unusual layout; the reference computes
    on the same views."""
    q, kv, idx = _data(1)
    tl = torch.tensor([16, 5], dtype=torch.int32)
    ds = quantize_kv_cache(kv)
    padded = torch.zeros(6, 9, 656, dtype=torch.uint8)
    padded[:, :8] = ds.view(6, 8, 656)
    yield ("bf16_all_strided", _strided_copy(q, (T, H, 576), (600, 1300, 1), 7),
           _strided_copy(kv.bfloat16(), (N, 576), (601, 1), 3), _strided_copy(idx, (T, K), (1, 5), 1),
           _strided_copy(tl, (T,), (3,), 2), torch.empty(H, T, 512, dtype=torch.bfloat16).transpose(0, 1))
    yield ("bf16_expanded_inputs", q[:1].expand(T, H, 576), kv.bfloat16()[:1].expand(N, 576), idx[:, :1].expand(T, K),
           tl[:1].expand(T), torch.empty(T, H, 700, dtype=torch.bfloat16)[..., 100:612])
    yield ("ds_paged_padded", q.transpose(0, 1).contiguous().transpose(0, 1), padded[:, :8], idx.t().contiguous().t(),
           tl, None)
    yield ("ds_paged_expanded_blocks", q, ds[:8].view(1, 8, 656).expand(6, 8, 656), idx, None, None)
    yield ("ds_flat_row_stride_660_offset_4", q, torch.zeros(N, 664, dtype=torch.uint8)[:, 4:660].copy_(ds), idx,
           None, torch.empty(2 * T, H, 512, dtype=torch.bfloat16)[::2])


@pytest.mark.parametrize("case", list(_views()), ids=lambda c: c[0])
def test_unusual_layouts_equal_the_reference_through_every_entry_point(case):
    name, q, kv, idx, tl, out = case
    r_out, r_lse = reference(q, kv, idx, topk_length=tl, out_dtype=torch.bfloat16)
    kv_key = "fp8_ds_mla" if kv.dtype == torch.uint8 else "bf16"
    layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype=kv_key, topk=K, return_lse=True)
    spec = CallSpec(q_dtype="bf16", kv_dtype=kv_key, num_heads=H, topk=K, need_lse=True)
    fresh = (lambda: None) if out is None else (lambda: out.fill_(float("nan")))  # the buffer, poisoned
    calls = {
        "function": lambda: sparse_mla_decode(q, kv, idx, topk_length=tl, out=fresh(), return_lse=True),
        "layer": lambda: layer(q, kv, idx, topk_length=tl, out=fresh()),
        "run": lambda: run(spec, dict(q=q, kv_cache=kv, indices=idx, topk_length=tl, out=fresh())),
        "operator": lambda: torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, None, SM, tl, None, None, True, 0.0, ""),
    }
    for entry, call in calls.items():
        got_out, got_lse = call()
        if out is not None and entry != "operator":
            assert got_out.data_ptr() == out.data_ptr(), entry
        torch.testing.assert_close(got_out.double(), r_out.double(), atol=2e-2, rtol=2e-2, msg=f"{name} {entry}")
        torch.testing.assert_close(got_lse, r_lse, atol=1e-3, rtol=1e-3, msg=f"{name} {entry}")


# ---- an inference tensor `out` outside inference mode ----


def _inference_out() -> torch.Tensor:
    with torch.inference_mode():
        return torch.full((T, H, 512), 7.0, dtype=torch.bfloat16)


INFERENCE_CALLS = {  # each returns the output it wrote
    "function": lambda q, kv, idx, out: sparse_mla_decode(q, kv, idx, out=out)[0],
    "reference_path": lambda q, kv, idx, out: sparse_mla_decode(q, kv, idx, out=out, path="reference")[0],
    "layer": lambda q, kv, idx, out: SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=K)(
        q, kv, idx, out=out)[0],
    "run": lambda q, kv, idx, out: run(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=H, topk=K),
                                       DecodeInputs(q, kv, idx, out=out))[0],
    "out_operator": lambda q, kv, idx, out: torch.ops.mla_sink.sparse_mla_decode_out(
        q, kv, idx, None, SM, None, None, None, out, False, 0.0, "") is None or out,
}


@pytest.mark.parametrize("entry", list(INFERENCE_CALLS))
@pytest.mark.parametrize("prepared", [False, True], ids=["first_call", "prepared_signature"])
def test_an_inference_tensor_out_outside_inference_mode_is_refused_before_the_kernel(entry, prepared):
    """PyTorch forbids writing into an inference tensor outside ``torch.inference_mode()``. The CPU kernel's output
    copy raised PyTorch's ``RuntimeError`` after the kernel had run (on a GPU the kernel wrote it in place, where
    torch's own ops refuse); now a ``ValueError`` names ``out`` before any kernel, also on a signature prepared by
    an earlier call inside inference mode (whose ``out`` it may write)."""
    q, kv, idx = _data(2)
    kv = kv.bfloat16()
    call = INFERENCE_CALLS[entry]
    api.forget_prepared_calls()
    if prepared:
        with torch.inference_mode():  # the same signature, prepared where writing an inference tensor is allowed
            out_in = call(q, kv, idx, _inference_out())
        torch.testing.assert_close(out_in.double(), reference(q, kv, idx)[0], atol=2e-2, rtol=2e-2)
    out = _inference_out()
    with torch.no_grad(), pytest.raises(ValueError, match=r"'out' is an inference tensor .*torch.inference_mode\(\)"):
        call(q, kv, idx, out)
    assert bool((out == 7.0).all())  # not written


def test_an_inference_tensor_out_inside_inference_mode_and_inference_inputs_outside_it_are_served():
    q, kv, idx = _data(3)
    kv = kv.bfloat16()
    want = reference(q, kv, idx)[0]
    with torch.inference_mode():
        out = torch.empty(T, H, 512, dtype=torch.bfloat16)
        got, _ = sparse_mla_decode(q, kv, idx, out=out)
        q_i, kv_i, idx_i = q.clone(), kv.clone(), idx.clone()
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    got, _ = sparse_mla_decode(q_i, kv_i, idx_i)  # reading inference tensors outside the mode is allowed
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)


# ---- a tensor without data beside real ones ----


def _fake(t: torch.Tensor) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode().from_tensor(t)


@pytest.mark.parametrize("arg", ["kv_cache", "indices", "topk_length", "out"])
@pytest.mark.parametrize("prepared", [False, True], ids=["first_call", "prepared_signature"])
def test_a_fake_tensor_beside_a_real_q_is_refused_by_name(arg, prepared):
    """A FakeTensor (no data; it reports a real device) beside real tensors went to the kernel: Triton's interpreter
    failed inside torch ("Cannot copy out of meta tensor"), PyTorch's fake mode asserted on the output copy, and a
    GPU kernel would read address 0. Now a ``ValueError`` names the argument, also when a real call of the same
    metadata was prepared before."""
    q, kv, idx = _data(4)
    args = dict(q=q, kv_cache=kv.bfloat16(), indices=idx, topk_length=torch.full((T,), K, dtype=torch.int32),
                out=torch.empty(T, H, 512, dtype=torch.bfloat16))
    api.forget_prepared_calls()
    if prepared:
        sparse_mla_decode(**args)
    args[arg] = _fake(args[arg])
    with pytest.raises(ValueError, match=f"'{arg}' must hold data like q"):
        sparse_mla_decode(**args)
    with pytest.raises(ValueError, match=f"'{arg}' must hold data like q"):
        run(CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=H, topk=K), args)


def test_an_inference_tensor_out_is_refused_on_a_prepared_dcp_call():
    """The DCP branch of ``run()`` prepares per signature too; its later calls checked no ``out`` (the merge's output
    copy raised PyTorch's ``RuntimeError`` after the collectives). One process, rank 0 of a two-rank fake group (its
    collectives move no data: only the refusal is checked)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from mla_sink.core.dcp import shard_kv_cache

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        q, kv, idx = _data(5)
        shard = shard_kv_cache(kv.bfloat16(), 2, 0, "interleaved")
        layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=K, dcp_world_size=2,
                                dcp_group=dist.group.WORLD, num_kv_rows=N)
        api.forget_prepared_calls()
        with torch.inference_mode():
            layer(q, shard, idx, out=_inference_out())  # prepares the signature
        out = _inference_out()
        with torch.no_grad(), pytest.raises(ValueError, match="'out' is an inference tensor"):
            layer(q, shard, idx, out=out)
        assert bool((out == 7.0).all())
    finally:
        dist.destroy_process_group()
