"""CUDA-graph capture of the triton path and construction-time refusal (GPU marker: run on the device)."""

from __future__ import annotations

import pytest
import torch

from mla_sink import NoKernelError, Platform, SparseMLADecode
from mla_sink.core.reference import sparse_mla_decode_reference as ref

pytestmark = pytest.mark.gpu


def _fresh(T, H, N, topk, g, device):
    idx = torch.randint(0, N, (T, topk), generator=g, dtype=torch.int32, device="cpu")
    idx[0, :7] = -1
    idx[1, 100:] = N + 3 if topk > 100 else -1
    idx[-1] = -1
    return idx.to(device), (torch.randn(H, generator=g) * 3).float().to(device)


@pytest.mark.parametrize("H,T", [(128, 2), (64, 64), (16, 256)])
def test_cuda_graph_replays_follow_new_indices_and_sinks(H, T):
    device = "cuda"
    N, topk = 100_000, 2048
    g = torch.Generator().manual_seed(H * 1000 + T)
    q = torch.randn(T, H, 576, generator=g).bfloat16().to(device)
    kv = torch.randn(N, 576, generator=g).bfloat16().to(device)
    idx0, sinks0 = _fresh(T, H, N, topk, g, device)
    static_idx, static_sinks = idx0.clone(), sinks0.clone()
    layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=topk, sinks=static_sinks)
    assert layer.plan.path == "triton", repr(layer)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up compiles the kernels outside capture
        layer(q, kv, static_idx, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse_static = layer(q, kv, static_idx, out=out)
    for replay in range(3):
        idx, sinks = _fresh(T, H, N, topk, g, device)
        static_idx.copy_(idx)
        static_sinks.copy_(sinks)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager_layer = SparseMLADecode(num_heads=H, q_dtype="bf16", kv_dtype="bf16", topk=topk, sinks=sinks)
        e_out, e_lse = eager_layer(q, kv, idx)
        torch.testing.assert_close(out, e_out, atol=0, rtol=0, msg=f"replay {replay}")
        torch.testing.assert_close(lse_static, e_lse, atol=0, rtol=0, msg=f"replay {replay}")
        r_out, _ = ref(q, kv, idx, sinks)
        torch.testing.assert_close(out.double(), r_out, atol=1e-2, rtol=2 / 128)
        assert (out[-1] == 0).all() and torch.isneginf(lse_static[-1]).all()


def test_refused_configuration_raises_at_construction_before_capture():
    # on this machine (detected platform): AITER's path cannot be pinned on an NVIDIA GPU
    with pytest.raises(NoKernelError, match="aiter_lse"):
        SparseMLADecode(num_heads=64, q_dtype="bf16", kv_dtype="bf16", topk=2048, return_lse=True, path="aiter_lse")
    with pytest.raises(NoKernelError, match="sm89"):
        SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="fp8_e4m3", topk=2048,
                        platform=Platform("sm80"))
    with pytest.raises(ValueError, match="'sinks' must be float32"):
        SparseMLADecode(num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=2048,
                        sinks=torch.zeros(16, dtype=torch.bfloat16, device="cuda"))


def test_platform_detects_this_gpu():
    p = Platform.detect("cuda")
    assert p.arch.startswith("sm") or p.arch.startswith("gfx")


def _random_call(T, H, N, topk, seed, device="cuda"):
    """``(q, kv_cache, indices, sinks)`` of a bf16 call: random q and pool, ids anywhere in the pool, random sinks."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, 576, generator=g).bfloat16().to(device)
    kv = torch.randn(N, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(0, N, (T, topk), generator=g, dtype=torch.int32).to(device)
    return q, kv, idx, torch.randn(H, generator=g).float().to(device)


def test_compiled_run_captures_in_cuda_graph():
    """torch.compile(mode='reduce-overhead') puts the custom op inside a CUDA graph."""
    from mla_sink import CallSpec, DecodeInputs, run

    T, H, N, topk = 4, 16, 10_000, 256
    q, kv, idx, sinks = _random_call(T, H, N, topk, seed=7)
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=H, topk=topk, sinks=True)

    def step(q, kv, idx, sinks):
        return run(spec, DecodeInputs(q=q, kv_cache=kv, indices=idx, sm_scale=576 ** -0.5, sinks=sinks))

    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        out, lse = compiled(q, kv, idx, sinks)
    e_out, e_lse = step(q, kv, idx, sinks)
    torch.testing.assert_close(out, e_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, e_lse, atol=0, rtol=0)


def test_compiled_calls_refuse_a_path_this_gpu_lacks_and_inputs_that_require_grad_while_tracing():
    """On the GPU the traced device is known: a forced AITER path on NVIDIA is refused while tracing (the fake
    implementation plans it), as are inputs that require grad; a forced ``triton`` path compiles and matches the
    eager call (thirty-third session's break test)."""
    from mla_sink import sparse_mla_decode

    q, kv, idx, sinks = _random_call(T=2, H=16, N=4096, topk=256, seed=11)

    def call(path):
        return torch.compile(lambda q: sparse_mla_decode(q, kv, idx, sinks, path=path), fullgraph=True)

    with pytest.raises(Exception, match=r"NoKernelError\(\"bf16-h16-sm\d+-sinks-dcp1"):  # while tracing
        call("aiter_lse")(q)
    with pytest.raises(Exception, match="'q' must not require grad"):
        call("triton")(q.clone().requires_grad_())
    out, lse = call("triton")(q)
    e_out, e_lse = sparse_mla_decode(q, kv, idx, sinks, path="triton")
    torch.testing.assert_close(out, e_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, e_lse, atol=0, rtol=0)
    # the mutating operator (out=) under CUDA graphs, and its refusal of inputs that require grad
    buf = torch.empty_like(e_out)
    with_out = torch.compile(lambda q, o: sparse_mla_decode(q, kv, idx, sinks, out=o), fullgraph=True,
                             mode="reduce-overhead")
    with pytest.raises(Exception, match="'q' must not require grad"):
        with_out(q.clone().requires_grad_(), buf)
    for _ in range(3):
        _, lse = with_out(q, buf)
    torch.testing.assert_close(buf, e_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, e_lse, atol=0, rtol=0)
