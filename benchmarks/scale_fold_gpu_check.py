import torch
from mla_sink import sparse_mla_decode, sparse_mla_decode_reference as ref
from mla_sink import plan_call, describe
g = torch.Generator().manual_seed(0); fp8 = torch.float8_e4m3fn
kv = torch.randn(16, 576, generator=g).to(fp8).cuda()
idx = torch.randint(-2, 18, (2, 8), generator=g, dtype=torch.int32).cuda()
for name, q, kw in [
    ("fp8 q, sm*q overflow", torch.randn(2, 3, 576, generator=g).to(fp8).cuda(),
     dict(sm_scale=2.0**126, q_scale=torch.tensor([8.0]).cuda(), kv_scale=torch.tensor([2.0**-106]).cuda())),
    ("bf16 q tiny, factor 2^129", (torch.randn(2, 3, 576, generator=g) * 2.0**-126).bfloat16().cuda(),
     dict(sm_scale=2.0**126, kv_scale=torch.tensor([8.0]).cuda())),
]:
    for path in (None, "triton"):
        try:
            o, l = sparse_mla_decode(q, kv, idx, return_lse=True, path=path, **kw)
            r, rl = ref(q.cpu(), kv.cpu(), idx.cpu(), **{k: (v.cpu() if torch.is_tensor(v) else v) for k, v in kw.items()})
            spec, plat = describe(q, kv, idx)
            print(name, path, plan_call(spec, plat).path, "lse err", (l.cpu().double() - rl.double()).abs().max().item(),
                  "nan", l.isnan().any().item())
        except Exception as e:
            print(name, path, "ERR", e)
