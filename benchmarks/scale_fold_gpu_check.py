"""The score factor on a GPU: two calls whose fp32 scale products overflow (fortieth session's break test), through
the library's path and the forced ``triton`` path, against the float64 reference; prints each LSE's largest error.

    PYTHONPATH=. python3 benchmarks/scale_fold_gpu_check.py
"""

import torch

from mla_sink import describe, plan_call, sparse_mla_decode
from mla_sink import sparse_mla_decode_reference as ref


def main() -> None:
    g = torch.Generator().manual_seed(0)
    fp8 = torch.float8_e4m3fn
    kv = torch.randn(16, 576, generator=g).to(fp8).cuda()
    idx = torch.randint(-2, 18, (2, 8), generator=g, dtype=torch.int32).cuda()
    cases = [
        ("fp8 q, sm*q overflow", torch.randn(2, 3, 576, generator=g).to(fp8).cuda(),
         dict(sm_scale=2.0 ** 126, q_scale=torch.tensor([8.0]).cuda(), kv_scale=torch.tensor([2.0 ** -106]).cuda())),
        ("bf16 q tiny, factor 2^129", (torch.randn(2, 3, 576, generator=g) * 2.0 ** -126).bfloat16().cuda(),
         dict(sm_scale=2.0 ** 126, kv_scale=torch.tensor([8.0]).cuda())),
    ]
    for name, q, kw in cases:
        cpu_kw = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()}
        for path in (None, "triton"):
            try:
                _, lse = sparse_mla_decode(q, kv, idx, return_lse=True, path=path, **kw)
                _, ref_lse = ref(q.cpu(), kv.cpu(), idx.cpu(), **cpu_kw)
                spec, platform = describe(q, kv, idx)
                err = (lse.cpu().double() - ref_lse.double()).abs().max().item()
                print(name, path, plan_call(spec, platform).path, "lse err", err, "nan", lse.isnan().any().item())
            except Exception as e:  # a probe: report and go on
                print(name, path, "ERR", e)


if __name__ == "__main__":
    main()
