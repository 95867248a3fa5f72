"""A CPU model of the column-split V3.2 kernel's rounding (fifty-fourth session, 2026-12-06), for the H100 failure of
``test_ds_mla_more_tokens_than_sms_with_empty_ranges[19]`` (2 elements over the bf16 budget, max abs err 0.0141; its
tokens attend to 0, 1, 63, 64, 65, 150, 1000 or 2048 ids; BENCHMARKS.md).

It draws the test's kind of inputs on the CPU (amax scales, ``sm_scale = 576 ** -0.55``, sinks with +-inf, 20,
100) and computes what :mod:`mla_sink.kernels.gluon.gluon_fp8`'s docstring says the kernel computes: fp32 scores
``K_rope q_rope^T + sum_t scale_t (K_t q_t^T)`` in base 2, the online softmax over 64-id blocks, ``P^T * scale_t``
rounded to bf16 before each tile's ``P V`` (fp32 accumulation), the sink in the denominator, ``out`` rounded to
bf16. It then counts the elements over the bf16 and the few-id budgets of ``tests/test_gluon_gpu.py``, for tokens
on 2048 ids and on fewer, against the float64 reference. With ``fp32`` as a third argument ``P * scale_t`` stays
in fp32 (the control: what is left is the rounding of ``out``).

    PYTHONPATH=. python3 benchmarks/ds_mla_rounding_model.py H SEED [fp32]
"""

from __future__ import annotations

import math
import os
import sys

import torch

from mla_sink import quantize_kv_cache
from mla_sink.core.kv_layout import dequantize_kv_cache
from mla_sink.core.reference import sparse_mla_decode_reference, valid_mask

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_gluon_gpu  # noqa: E402,F401  (adds the few-id budget to test_triton_gpu.BUDGET)
from test_triton_gpu import BUDGET  # noqa: E402

#: the kernel's block of ids and V3.2's value tiles
BLOCK, TILE, NUM_TILES = 64, 128, 4
LOG2E = 1.4426950408889634
#: (atol, rtol) of tests/test_triton_gpu.py's "bf16" and tests/test_gluon_gpu.py's "bf16_few_ids"
BUDGETS = {key: BUDGET[key][:2] for key in ("bf16", "bf16_few_ids")}


def inputs(H: int, seed: int):
    torch.manual_seed(seed)
    N, T, topk = 4099, 300, 2048
    cache = quantize_kv_cache(torch.randn(N, 576) * 0.7, scale="amax")
    q = torch.randn(T, H, 576).to(torch.bfloat16)
    idx = torch.randint(0, N, (T, topk), dtype=torch.int32)
    idx[:, 11::29] = -5
    lengths = torch.tensor([2048, 1, 63, 64, 65, 150, 2048, 1000], dtype=torch.int32).repeat(T // 8 + 1)[:T]
    lengths[::8] = 0
    sinks = torch.randn(H) * 3
    sinks[:5] = torch.tensor([math.inf, -math.inf, 0.0, 20.0, 100.0])[:min(H, 5)]
    return cache, q, idx, sinks, lengths


def modelled_out(cache, q, idx, sinks, lengths, sm_scale, p_dtype=torch.bfloat16):
    """bf16 ``[T, H, 512]``: the kernel's arithmetic as its docstring states it (accumulation order aside), with
    ``P * scale_t`` rounded to ``p_dtype``."""
    N = cache.shape[0]
    codes = cache[:, :512].contiguous().view(torch.float8_e4m3fn).float()  # exact in fp32 (and in bf16)
    scales = cache[:, 512:528].contiguous().view(torch.float32)
    rope = dequantize_kv_cache(cache)[:, 512:].float()
    mask = valid_mask(idx, N, lengths)
    T, H = q.shape[:2]
    out = torch.zeros(T, H, 512)
    for t in range(T):
        qf = q[t].float()
        m, L, O = torch.full((H,), -math.inf), torch.zeros(H), torch.zeros(H, 512)
        for b in range(0, idx.shape[1], BLOCK):
            ok = mask[t, b:b + BLOCK]
            if not ok.any():
                continue
            ids = torch.where(ok, idx[t, b:b + BLOCK].long(), 0)
            c, sc = codes[ids], scales[ids]
            s = qf[:, 512:] @ rope[ids].T
            for i in range(NUM_TILES):
                cols = slice(TILE * i, TILE * (i + 1))
                s = s + (qf[:, cols] @ c[:, cols].T) * sc[:, i]
            s = torch.where(ok[None, :], s * (sm_scale * LOG2E), -math.inf)
            m_new = torch.maximum(m, s.max(1).values)
            alpha = torch.nan_to_num(torch.exp2(m - m_new), nan=0.0)
            p = torch.exp2(s - m_new[:, None])
            L, O = L * alpha + p.sum(1), O * alpha[:, None]
            for i in range(NUM_TILES):
                cols = slice(TILE * i, TILE * (i + 1))
                O[:, cols] += (p * sc[:, i][None, :]).to(p_dtype).float() @ c[:, cols]
            m = m_new
        out[t] = torch.nan_to_num(O / (L + torch.exp2(sinks * LOG2E - m))[:, None], nan=0.0)
    return out.to(torch.bfloat16)


def main(H: int, seed: int, p_dtype: str = "bf16") -> None:
    sm_scale = 576 ** -0.55
    cache, q, idx, sinks, lengths = inputs(H, seed)
    ro, _ = sparse_mla_decode_reference(q, cache, idx, sinks, sm_scale, topk_length=lengths)
    p = {"bf16": torch.bfloat16, "fp32": torch.float32}[p_dtype]
    err = (modelled_out(cache, q, idx, sinks, lengths, sm_scale, p).double() - ro).abs()
    for name, rows in (("2048 ids", lengths >= 2048), ("fewer ids", lengths < 2048)):
        e, r = err[rows], ro[rows]
        for key, (atol, rtol) in BUDGETS.items():
            over = int((~((e <= atol) | (e <= rtol * r.abs()))).sum())
            print(f"H={H} seed={seed} P {p_dtype}: tokens on {name}, budget {key}: {over} of {e.numel()} over, "
                  f"max abs err {e.max().item():.4g}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4])
