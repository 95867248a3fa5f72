"""Sinks of any stride (forty-second session): a column ``[:, layer]`` of a ``[H, layers]`` parameter, a step-2 view
or a broadcast ``expand`` give the results of their contiguous copy on every entry point (the function, the operator,
the layer, DCP), ±inf entries included, against the float64 reference. Until then a strided ``sinks`` was refused
("'sinks' must be contiguous") while every other input took its strides; the runners now read a contiguous copy
(:func:`mla_sink.paths.prepare_runner`), and the raw merge launcher still asks for a contiguous buffer."""

from __future__ import annotations

import pytest
import torch

from mla_sink import Platform, SparseMLADecode, sparse_mla_decode
from mla_sink.core.reference import sparse_mla_decode_reference as ref

H = 5
CPU_NO_TRITON = Platform("cpu", triton=False)
PLATFORMS = [pytest.param(CPU_NO_TRITON, id="reference"),
             pytest.param(Platform("cpu"), id="triton", marks=pytest.mark.interpreter)]


def _call(T=3, N=64, topk=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 576, generator=g).to(torch.float16)
    kv = torch.randn(N, 576, generator=g).to(torch.float16)
    kv[N - 1] = float("nan")  # never referenced
    idx = torch.randint(0, N - 1, (T, topk), generator=g, dtype=torch.int32)
    idx[0, 3] = -1
    idx[-1] = -1  # a row with no valid id
    return q, kv, idx


def _strided_sinks():
    """Three strided views of H sinks (``-inf`` and ``+inf`` among them) and their values."""
    table = torch.randn(H, 3) * 2  # [H, layers]: a layer's sinks are a column
    table[1, 1], table[3, 1] = float("-inf"), float("inf")
    step = (torch.arange(2 * H, dtype=torch.float32) - 4.0)[::2]
    broadcast = torch.tensor([0.5]).expand(H)
    return [table[:, 1], step, broadcast]


def _check(out, lse, q, kv, idx, sinks):
    r_out, r_lse = ref(q, kv, idx, sinks.contiguous())
    torch.testing.assert_close(out.double(), r_out, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(lse.double(), r_lse.double(), atol=1e-4, rtol=1e-4)  # -inf on the empty row, equal


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_function_reads_strided_sinks_as_their_values(platform):
    q, kv, idx = _call()
    for sinks in _strided_sinks():
        assert not sinks.is_contiguous()
        out, lse = sparse_mla_decode(q, kv, idx, sinks, return_lse=True, platform=platform)
        _check(out, lse, q, kv, idx, sinks)
        again, _ = sparse_mla_decode(q, kv, idx, sinks.contiguous(), return_lse=True, platform=platform)
        assert torch.equal(out, again)  # the same launch on the copy


def test_a_later_call_reads_the_strided_sinks_of_that_call():
    """The runner prepared for a strided signature copies each call's sinks, not the first call's."""
    q, kv, idx = _call()
    table = torch.randn(H, 3)
    first, _ = sparse_mla_decode(q, kv, idx, table[:, 0], return_lse=True, platform=CPU_NO_TRITON)
    table[:, 0] = float("inf")  # every head's sink +inf: zeros
    out, lse = sparse_mla_decode(q, kv, idx, table[:, 0], return_lse=True, platform=CPU_NO_TRITON)
    assert not torch.equal(first, out) and torch.count_nonzero(out) == 0
    _check(out, lse, q, kv, idx, table[:, 0])


def test_the_operator_reads_strided_sinks():
    q, kv, idx = _call(T=2, topk=8)
    sinks = _strided_sinks()[0]
    out, lse = torch.ops.mla_sink.sparse_mla_decode(q, kv, idx, sinks, 576 ** -0.5, None, None, None, True, 0.0,
                                                    "reference")
    _check(out, lse, q, kv, idx, sinks)


def test_a_layer_follows_its_sinks_to_a_broadcast_view():
    """The layer's sinks parameter replaced by an ``expand`` of its first entry at the same address (the break test
    of the fortieth session refused it): the next call computes with the broadcast value on every head."""
    p = torch.nn.Parameter(torch.randn(H))
    layer = SparseMLADecode(num_heads=H, q_dtype="fp16", kv_dtype="fp16", topk=24, sinks=p, platform=CPU_NO_TRITON)
    q, kv, idx = _call()
    with torch.no_grad():
        layer(q, kv, idx)
        p.data = p.data[:1].expand(H)
        out, lse = layer(q, kv, idx)  # a layer with sinks returns its LSE
    _check(out, lse, q, kv, idx, p.detach())


def test_dcp_reads_strided_sinks():
    """A one-rank group (fake backend): the merge applies the strided sinks' values."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from mla_sink.core.dcp import dcp_sparse_mla_decode
    from mla_sink.core.inputs import DecodeInputs

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        q, kv, idx = _call()
        sinks = _strided_sinks()[0]

        def local(x):
            return ref(x.q, x.kv_cache, x.indices, None, topk_length=x.topk_length)

        x = DecodeInputs(q, kv, idx, 576 ** -0.5, sinks)
        out, lse = dcp_sparse_mla_decode(x, group=dist.group.WORLD, layout="interleaved", num_kv_rows=kv.shape[0],
                                         local_decode=local)
        _check(out, lse, q, kv, idx, sinks)
    finally:
        dist.destroy_process_group()


def test_the_raw_merge_launcher_still_asks_for_contiguous_sinks():
    from mla_sink.core.validate import check_merge_buffers

    part_out = torch.zeros(2, 1, H, 512)
    part_lse = torch.zeros(2, 1, H)
    with pytest.raises(ValueError, match=r"'sinks' must be contiguous \(got stride \(2,\)\)"):
        check_merge_buffers(part_out, part_lse, torch.zeros(2 * H)[::2], torch.zeros(1, H, 512), torch.zeros(1, H))
