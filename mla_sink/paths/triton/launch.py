"""Triton sparse MLA decode with fused sinks and a natural-log, sink-free LSE.

Semantics are those of :func:`mla_sink.core.reference.sparse_mla_decode_reference` (the float64 reference):
``s_j = sm_scale * q.k_j`` over the valid ids of a token row (``0 <= id < N``, position ``<
topk_length[t]``), optionally soft-capped ``s = cap * tanh(s / cap)``; ``lse = log(sum_j exp(s_j))``
(natural log, sink excluded, ``-inf`` for an empty row); ``out = sum_j exp(s_j - lse) v_j`` times
``sigmoid(lse - sink)`` (0 on empty rows; ``sink = +inf`` gives 0, ``sink = -inf`` changes nothing).

Kernel structure (one program per (head block, KV split, token); head blocks of one token are
adjacent in launch order so their identical gathers hit L2):

* the 576 dims are two dots: a 512-dim latent dot and a 64-dim RoPE dot (Triton blocks are powers of
  two); the gathered latent tile is reused as V (no second load);
* online softmax in base 2 (``log2 e`` folded into the scale), fp32 accumulation; the LSE written to
  ``lse`` is converted back to natural log;
* ids that are ``-1``, negative, ``>= N`` or past ``topk_length`` are masked in the gathered load
  (``other=0``): their rows are never read, so NaN in unreferenced rows cannot leak; ids are cast
  to int64 before multiplying by the row stride (pools beyond 2^31 bytes);
* fp8 KV/q are converted to bf16 tiles (exact) and the per-tensor scales, read from device memory,
  are folded into the scores and the output; ``fp8_e4m3fnuz`` is decoded from its bits through
  ``e4m3fn`` (value / 2, with its own NaN and max encodings) so it runs on NVIDIA and the CPU too;
* split-KV (``num_kv_splits > 1``): stage 1 writes fp32 partial ``(out, lse2)`` per split (a split
  with no valid id writes ``out = 0, lse2 = -inf``), stage 2 merges them in fp32 and applies the sink
  exactly once.

Kernel choice: :func:`launch_plan` reads the call's shapes and device and returns
:func:`mla_sink.paths.triton.plan.plan_triton_launch`'s record (tuning row, split count, kernel: the
paths of ``tables/triton_tuning.yaml``); on sm90, unsplit bf16/fp16 launches with 64-head blocks run
the warp-specialised kernel of :mod:`mla_sink.kernels.gluon.gluon_ws` and unsplit e4m3fn-KV launches
at H <= 16 that of :mod:`mla_sink.kernels.gluon.gluon_fp8` (same semantics; a Gluon kernel that fails
to compile here falls back to the portable one after one warning, and later plans name the fallback);
every other launch runs the kernel below.

On the CPU the same Python function runs through Triton's interpreter
(``triton.runtime.interpreter.InterpretedFunction``), without ``TRITON_INTERPRET`` being set; an
``UPCAST`` constexpr (true only there) casts half tiles to fp32 before any arithmetic, because the
interpreter does not do bf16 arithmetic (docs/DESIGN.md, triton-lang/triton#11584).

Source: the split-KV decode + combine structure of lightllm/sglang ``decode_attention`` kernels; the
online softmax of Triton tutorial 06; the sink formula of FlashMLA ``flash_mla_interface.py``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from mla_sink.core.dtypes import DTYPE_KEYS, out_dtype_for
from mla_sink.kernels.triton.combine import combine_jit
from mla_sink.kernels.triton.interpreter import interpreted, interpreter_stdlib
from mla_sink.kernels.triton.portable import portable_jit
from mla_sink.kernels.triton.math import LOG2E as _LOG2E
from mla_sink.paths.triton.plan import TritonConfig, TritonLaunch, plan_triton_launch, portable_launch

D_QK = 576
D_V = 512
D_PE = D_QK - D_V
LOG2E = _LOG2E.value

@functools.lru_cache(maxsize=None)
def gluon_available() -> bool:
    """Whether the Gluon kernels import (Triton's Gluon dialect with its sm90 primitives)."""
    try:
        from mla_sink.kernels.gluon import gluon_fp8, gluon_ws  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means the portable kernel serves
        return False
    return True


#: kernel name -> compile error text of the Gluon kernels that failed to compile in this process
#: (``plan_triton_launch``'s ``failed``).
_GLUON_FAILED: dict[str, str] = {}


def _launch_gluon(kernel, q, kv_cache, indices, sinks, sm_scale, topk_length, kv_scale, out, lse) -> bool:
    """Run a Gluon kernel (``"gluon_ws"`` or ``"gluon_fp8"``); False (after one warning) where it fails
    to compile here.

    A Triton whose Gluon API differs from the one the kernels were written for (Triton 3.6) fails at
    compile time, before anything is launched; the portable kernel then serves that signature.
    """
    if kernel in _GLUON_FAILED:
        return False
    try:
        if kernel == "gluon_ws":
            from mla_sink.kernels.gluon.gluon_ws import sparse_mla_decode_gluon

            sparse_mla_decode_gluon(q, kv_cache, indices, sinks, sm_scale, topk_length=topk_length, out=out, lse=lse)
        else:
            from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_gluon

            sparse_mla_decode_fp8_gluon(q, kv_cache, indices, sinks, sm_scale, topk_length=topk_length,
                                        kv_scale=kv_scale, out=out, lse=lse)
    except Exception as e:  # noqa: BLE001 - compile errors of an unsupported Triton/Gluon version
        _GLUON_FAILED[kernel] = repr(e)[:500]
        warnings.warn(f"mla_sink: the warp-specialised sm90 kernel {kernel} failed to compile ({repr(e)[:200]}); "
                      "the portable Triton kernel serves these calls", RuntimeWarning, stacklevel=3)
        return False
    return True


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _arch(device_type: str, device_index: Optional[int]) -> str:
    from mla_sink.core.platform import arch_of

    return arch_of(torch.device(device_type, device_index) if device_type != "cpu" else "cpu")


def _num_sms(device: torch.device) -> int:
    if device.type == "cpu":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def launch_plan(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *, logit_cap: float = 0.0,
                num_kv_splits: Optional[int] = None, config: Optional[TritonConfig] = None) -> TritonLaunch:
    """The :class:`~mla_sink.paths.triton.plan.TritonLaunch` of a call (reads shapes, dtypes and the device):
    :func:`~mla_sink.paths.triton.plan.plan_triton_launch`, or the portable kernel with ``config``'s tiles
    (:func:`~mla_sink.paths.triton.plan.portable_launch`) when a config is given."""
    T, H, _ = q.shape
    topk = indices.shape[1]
    device = q.device
    if config is not None:
        return portable_launch(config, num_heads=H, num_tokens=T, topk=topk, num_sms=_num_sms(device),
                               num_kv_splits=num_kv_splits)
    return plan_triton_launch(arch=_arch(device.type, device.index), q_dtype=DTYPE_KEYS[q.dtype],
                              kv_dtype=DTYPE_KEYS[kv_cache.dtype], num_heads=H, num_tokens=T, topk=topk,
                              logit_cap=logit_cap, gluon=device.type == "cuda" and gluon_available(),
                              num_sms=_num_sms(device), num_kv_splits=num_kv_splits, failed=_GLUON_FAILED)


def sparse_mla_decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    *,
    topk_length: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    kv_scale: Optional[torch.Tensor] = None,
    logit_cap: float = 0.0,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    num_kv_splits: Optional[int] = None,
    config: Optional[TritonConfig] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode with fused sinks (Triton; CPU tensors run through Triton's interpreter).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 / fp8 (e4m3fn or e4m3fnuz), any strides.
        kv_cache: ``[N, 576]`` bf16 / fp16 / fp8 rows (one shared KV head; value = first 512 columns);
            any row stride.
        indices: int32 ``[T, topk]`` global row ids; ``-1``, negative and ``>= N`` ids are skipped
            wherever they sit.
        sinks: optional fp32 ``[H]`` natural-log sink logits (not scaled by ``sm_scale``).
        sm_scale: multiplies ``q.k``; default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]``; only the first ``topk_length[t]`` ids of row t are used.
        q_scale, kv_scale: fp32 ``[1]`` dequantisation scales for fp8 q / fp8 KV (value = stored *
            scale), read inside the kernel (no host synchronisation).
        logit_cap: ``> 0`` soft-caps the scaled logits, ``s = cap * tanh(s / cap)``.
        out: optional ``[T, H, 512]`` output buffer (q's dtype; bf16 for fp8 q), written in full.
        lse: optional fp32 ``[T, H]`` buffer, written in full.
        num_kv_splits: KV splits per token; ``None`` picks from the tuning table and the SM count.
        config: a :class:`~mla_sink.paths.triton.plan.TritonConfig` overriding the tuning table.

    Returns:
        ``(out, lse)``: ``out [T, H, 512]`` = sink-free attention output times
        ``sigmoid(lse - sink)`` (0 on rows with no valid id); ``lse`` fp32 ``[T, H]``, natural log,
        sink excluded, ``-inf`` on rows with no valid id.

    Inputs are validated by the caller (:mod:`mla_sink.core.validate`); this launcher assumes valid input.
    No ``.item()``/``.cpu()``: the call can be captured in a CUDA graph.

    Source: semantics of :func:`mla_sink.core.reference.sparse_mla_decode_reference`.
    """
    T, H, d_qk = q.shape
    topk = indices.shape[1]
    num_rows = kv_cache.shape[0]
    device = q.device
    if out is None:
        out = torch.empty((T, H, D_V), dtype=out_dtype_for(DTYPE_KEYS[q.dtype]), device=device)
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=device)
    if T == 0 or H == 0:
        return out, lse
    if sm_scale is None:
        sm_scale = d_qk ** -0.5
    if topk_length is not None:
        topk_length = topk_length.contiguous()  # the kernel reads TOPK_LEN + t (unit stride)

    interp = device.type == "cpu"
    plan = launch_plan(q, kv_cache, indices, logit_cap=logit_cap, num_kv_splits=num_kv_splits, config=config)
    block_h, num_kv_splits, ids_per_split = plan.block_h, plan.num_kv_splits, plan.ids_per_split
    num_hb = triton.cdiv(H, block_h)

    # Kernels assume a unit stride on the last dim of q, kv_cache and indices (copy otherwise).
    if q.stride(-1) != 1:
        q = q.contiguous()
    if kv_cache.stride(-1) != 1:
        kv_cache = kv_cache.contiguous()
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    out_k = out if out.stride(-1) == 1 else torch.empty_like(out, memory_format=torch.contiguous_format)
    if plan.kernel != "portable" and _launch_gluon(plan.kernel, q, kv_cache, indices, sinks, sm_scale, topk_length,
                                                   kv_scale, out_k, lse):
        if out_k is not out:
            out.copy_(out_k)
        return out, lse
    q_fnuz = q.dtype == torch.float8_e4m3fnuz
    kv_fnuz = kv_cache.dtype == torch.float8_e4m3fnuz
    q_k = q.view(torch.uint8) if q_fnuz else q
    kv_k = kv_cache.view(torch.uint8) if kv_fnuz else kv_cache

    dummy = lse
    split = num_kv_splits > 1
    if split:
        part_out = torch.empty((T, num_kv_splits, H, D_V), dtype=torch.float32, device=device)
        part_lse = torch.empty((T, num_kv_splits, H), dtype=torch.float32, device=device)
    else:
        part_out, part_lse = dummy, dummy
    q_fp8 = q.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    kv_fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

    f16 = kv_fp8 and plan.fp8_f16
    decode = interpreted("portable") if interp else portable_jit
    combine = interpreted("combine") if interp else combine_jit
    sinks_k = sinks if sinks is not None else dummy
    with interpreter_stdlib() if interp else contextlib.nullcontext():
        decode[(num_hb, num_kv_splits, T)](
            q_k, kv_k, indices, sinks_k,
            topk_length if topk_length is not None else dummy,
            q_scale if q_fp8 else dummy,
            kv_scale if kv_fp8 else dummy,
            out_k, lse, part_out, part_lse,
            float(sm_scale), float(logit_cap) if logit_cap > 0 else 1.0,
            H, min(num_rows, 2 ** 31), topk, ids_per_split,
            q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
            out_k.stride(0), out_k.stride(1), lse.stride(0), lse.stride(1),
            part_out.stride(0) if split else 0, part_out.stride(1) if split else 0,
            part_out.stride(2) if split else 0,
            part_lse.stride(0) if split else 0, part_lse.stride(1) if split else 0,
            BLOCK_H=block_h, BLOCK_N=plan.block_n, D_NOPE=D_V, D_ROPE=D_PE,
            HAS_SINKS=sinks is not None, HAS_TOPK_LEN=topk_length is not None, HAS_CAP=logit_cap > 0,
            Q_FP8=q_fp8, KV_FP8=kv_fp8, Q_FNUZ=q_fnuz, KV_FNUZ=kv_fnuz,
            SPLIT=split, UPCAST=interp, FP8_F16=f16, ROW_SCALE=f16 and q.dtype == torch.bfloat16,
            EVEN=topk_length is None and topk % plan.block_n == 0,
            num_warps=plan.num_warps, num_stages=plan.num_stages,
        )
        if split:
            cbh, cbd = plan.combine_block_h, plan.combine_block_d
            combine[(triton.cdiv(H, cbh), T, D_V // cbd)](
                part_out, part_lse, sinks_k, out_k, lse,
                H, num_kv_splits,
                part_out.stride(0), part_out.stride(1), part_out.stride(2),
                part_lse.stride(0), part_lse.stride(1),
                out_k.stride(0), out_k.stride(1), lse.stride(0), lse.stride(1),
                BLOCK_H=cbh, BLOCK_D=cbd, BLOCK_S=triton.next_power_of_2(num_kv_splits),
                HAS_SINKS=sinks is not None,
                num_warps=4, num_stages=1,
            )
    if out_k is not out:
        out.copy_(out_k)
    return out, lse


def combine_states_triton(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    *,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge R sink-free partial states and apply the sink once, in one kernel (the split-KV combine).

    Args:
        part_out: ``[R, T, H, 512]`` partial outputs (fp32/bf16/fp16, innermost stride 1, any other
            strides: e.g. views into an all-gather buffer); a part whose LSE is ``-inf`` is never read.
        part_lse: fp32 ``[R, T, H]`` natural-log, sink-free partial LSEs (``-inf`` = no valid id).
        sinks: optional fp32 ``[H]`` natural-log sink logits.
        out: ``[T, H, 512]`` output buffer (any float dtype, innermost stride 1).
        lse: fp32 ``[T, H]`` output buffer: ``logsumexp_r(lse_r)``, natural log, sink excluded.

    Returns:
        ``(out, lse)``, with ``out = sum_r out_r exp(lse_r - lse) * sigmoid(lse - sink)``; rows empty in
        every part give ``out = 0``, ``lse = -inf``. Same algebra as :func:`mla_sink.core.lse.merge_states`
        followed by :func:`mla_sink.core.lse.apply_sink`, in one pass over the parts.
    """
    R, T, H, d = part_out.shape
    if d != D_V or part_out.stride(3) != 1 or tuple(part_lse.shape) != (R, T, H):
        raise ValueError(f"'part_out' must be [R, T, H, {D_V}] with innermost stride 1 and 'part_lse' [R, T, H] "
                         f"(got {tuple(part_out.shape)} strides {part_out.stride()} and {tuple(part_lse.shape)})")
    if T == 0 or H == 0:
        return out, lse
    lse2 = (part_lse.float() * LOG2E).permute(1, 0, 2).contiguous()  # [T, R, H], base 2 as the kernel keeps it
    interp = part_out.device.type == "cpu"
    combine = interpreted("combine") if interp else combine_jit
    cbh = max(16, triton.next_power_of_2(H)) if interp else 16  # the interpreter prefers few, large programs
    cbd = D_V if interp else 128
    dummy = lse2.new_empty(1)
    with interpreter_stdlib() if interp else contextlib.nullcontext():
        combine[(triton.cdiv(H, cbh), T, D_V // cbd)](
            part_out, lse2, sinks if sinks is not None else dummy, out, lse,
            H, R,
            part_out.stride(1), part_out.stride(0), part_out.stride(2),
            lse2.stride(0), lse2.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            BLOCK_H=cbh, BLOCK_D=cbd, BLOCK_S=triton.next_power_of_2(R),
            HAS_SINKS=sinks is not None,
            num_warps=4, num_stages=1,
        )
    return out, lse
