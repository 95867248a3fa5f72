"""On a GPU: a layer with sinks infers shapes on meta and fake tensors, still computes on real ones (against the
float64 reference), and a layer built for ``Platform("sm90a")`` plans and runs as one for ``sm90`` (BENCHMARKS.md,
thirty-eighth session, section 4).

Usage (repo root, a CUDA GPU): ``PYTHONPATH=. python3 benchmarks/layer_meta_devcheck.py``
"""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from mla_sink import Platform, SparseMLADecode
from mla_sink.core.reference import sparse_mla_decode_reference


def main() -> None:
    dev = "cuda"
    sinks = torch.randn(128, device=dev)
    L = SparseMLADecode(num_heads=128, q_dtype="bf16", kv_dtype="bf16", topk=2048, sinks=sinks)
    m = lambda *s, d=torch.bfloat16: torch.empty(*s, dtype=d, device="meta")
    o, l = L(m(4, 128, 576), m(5000, 576), m(4, 2048, d=torch.int32))
    print("meta", o.shape, o.device, l.shape)
    with FakeTensorMode():
        o, l = L(torch.empty(4, 128, 576, dtype=torch.bfloat16, device=dev), torch.empty(5000, 576, dtype=torch.bfloat16, device=dev),
                 torch.zeros(4, 2048, dtype=torch.int32, device=dev))
    print("fake", type(o).__name__, o.shape, o.device)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(4, 128, 576, device=dev, generator=g).bfloat16()
    kv = torch.randn(5000, 576, device=dev, generator=g).bfloat16()
    idx = torch.randint(-1, 5000, (4, 2048), device=dev, generator=g, dtype=torch.int32)
    o, l = L(q, kv, idx)
    ro, rl = sparse_mla_decode_reference(q, kv, idx, sinks)
    print("real layer max err", (o.double() - ro).abs().max().item(), (l.double() - rl.double()).abs().max().item())
    L2 = SparseMLADecode(num_heads=128, q_dtype="bf16", kv_dtype="bf16", topk=2048, sinks=sinks, platform=Platform("sm90a", num_sms=132))
    print("sm90a layer", L2.plan.path, L2.plan.row_id, (L2(q, kv, idx)[0].double() - ro).abs().max().item())


if __name__ == "__main__":
    main()
