"""sm90 kernels in Triton's Gluon dialect: ``gluon_seesaw`` (bf16/fp16, 64-head blocks, split-KV) and
``gluon_fp8`` (e4m3fn KV, few heads); ``math`` holds their shared jit helpers. GPU only, except ``tuning``
(their launch tables, ``tables/gluon_fp8.yaml`` and ``tables/gluon_seesaw.yaml``), which needs no Triton."""


def launch_buffers(q, out, lse, sm_scale):
    """``(out, lse, sm_scale)`` of a Gluon launch: ``out [T, H, 512]`` in q's dtype and fp32 ``lse [T, H]``
    allocated where not given, ``sm_scale`` defaulting to ``576 ** -0.5`` (the Gluon launchers' shared
    prologue)."""
    import torch

    from mla_sink.core.records import D_V

    T, H, d_qk = q.shape
    if out is None:
        out = torch.empty((T, H, D_V), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    return out, lse, (d_qk ** -0.5 if sm_scale is None else sm_scale)
