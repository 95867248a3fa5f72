"""Dtype keys used in records, rule tables and canonical keys.

The keys are the field's short names: ``bf16``, ``fp16``, ``fp8_e4m3`` (OCP e4m3fn,
NVIDIA and gfx950) and ``fp8_e4m3fnuz`` (AMD MI300 / gfx942 native fp8), the dtypes of ``q`` and of a
576-column ``kv_cache``; and, for ``kv_cache`` only, ``fp8_ds_mla``: DeepSeek-V3.2's 656-byte rows
(e4m3 latent values, four float32 tile scales, bf16 RoPE), stored as ``torch.uint8`` and recognised by
their last dimension (:mod:`mla_sink.core.kv_layout`).
"""

from __future__ import annotations

import torch

from mla_sink.core import kv_layout
from mla_sink.core.trace import concrete

#: torch dtype -> dtype key, for every dtype q or kv_cache may have.
DTYPE_KEYS: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e4m3fnuz: "fp8_e4m3fnuz",
}

#: KV layouts stored as raw bytes (``torch.uint8``), by bytes per token row. A uint8 ``kv_cache`` is
#: one of these, recognised by its last dimension.
BYTE_KV_LAYOUTS: dict[int, str] = {kv_layout.ROW_BYTES: kv_layout.LAYOUT}
#: the 656-byte V3.2 layout (per-128-column float32 scales inside each row; no ``kv_scale``)
DS_MLA_KEYS: frozenset[str] = frozenset(BYTE_KV_LAYOUTS.values())
#: every dtype key ``kv_cache`` may have
KV_DTYPE_KEYS: tuple[str, ...] = tuple(sorted(DTYPE_KEYS.values())) + tuple(sorted(DS_MLA_KEYS))

#: dtype key -> torch dtype (a byte layout -> its storage dtype, ``torch.uint8``).
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_KEYS.items()} | {k: torch.uint8 for k in DS_MLA_KEYS}

FP8_KEYS: frozenset[str] = frozenset({"fp8_e4m3", "fp8_e4m3fnuz"})
HALF_KEYS: frozenset[str] = frozenset({"bf16", "fp16"})
#: fp8 formats stored in AMD's "fnuz" encoding (no negative zero, one NaN code, exponent bias 8).
FNUZ_KEYS: frozenset[str] = frozenset({"fp8_e4m3fnuz"})
#: dtypes whose every value an fp16 tile holds exactly (bf16's exponent range does not fit).
FP16_EXACT_KEYS: frozenset[str] = frozenset({"fp16"}) | FP8_KEYS

#: Allowed (q dtype, kv dtype) pairs. fp8 q needs KV of the same fp8 format; the fp8_ds_mla layout
#: takes a half q (bf16 or fp16) only.
ALLOWED_DTYPE_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {("bf16", "bf16"), ("fp16", "fp16")}
    | {(q, kv) for q in HALF_KEYS for kv in FP8_KEYS}
    | {(f, f) for f in FP8_KEYS}
    | {(q, kv) for q in HALF_KEYS for kv in DS_MLA_KEYS}
)


def pair_error(q_dtype: str, kv_dtype: str, what: str) -> str:
    """The message refusing a (q dtype, kv dtype) pair outside :data:`ALLOWED_DTYPE_PAIRS`; ``what`` names
    the pair as the caller wrote it (``"('q_dtype', 'kv_dtype')"``, ``"(q dtype, kv_cache dtype)"``)."""
    hint = ""
    if kv_dtype in DS_MLA_KEYS:
        hint = (f"; a {kv_dtype} kv_cache takes q in {sorted(HALF_KEYS)} only (its tile scales live in the rows: "
                "no fp8 q)")
    return f"{what} must be one of {sorted(ALLOWED_DTYPE_PAIRS)} (got {(q_dtype, kv_dtype)!r}){hint}"


def dtype_key(dtype: torch.dtype) -> str:
    """Return the dtype key of a torch dtype.

    Raises:
        ValueError: the dtype is not one of bf16, fp16, fp8_e4m3, fp8_e4m3fnuz.
    """
    try:
        return DTYPE_KEYS[dtype]
    except KeyError:
        raise ValueError(
            f"dtype must be one of {sorted(DTYPE_KEYS.values())} (got {dtype})"
        ) from None


def kv_dtype_key(kv_cache: torch.Tensor) -> str:
    """The dtype key of a ``kv_cache`` tensor: :func:`dtype_key` of its dtype, or for ``torch.uint8`` the
    byte layout its last dimension names (656 -> ``fp8_ds_mla``).

    Raises:
        ValueError: naming ``kv_cache``: not a dense strided tensor, a dtype outside the keys, or a uint8 tensor
            whose last dimension is no known row size.
    """
    kv_layout.check_dense("kv_cache", kv_cache)
    if kv_cache.dtype == torch.uint8:
        last = kv_cache.shape[-1] if kv_cache.dim() else None
        for row_bytes, key in BYTE_KV_LAYOUTS.items():  # compared, not hashed: a traced size is a SymInt
            if last is not None and last == row_bytes:
                return key
        allowed = ", ".join(f"{n} ({k})" for n, k in sorted(BYTE_KV_LAYOUTS.items()))
        raise ValueError(f"'kv_cache' of dtype torch.uint8 must have a last dimension of {allowed} bytes "
                         f"(got shape {concrete(kv_cache.shape)})")
    if kv_cache.dtype not in DTYPE_KEYS:
        halves = ", ".join(f"{d} ({k})" for d, k in DTYPE_KEYS.items())
        rows = ", ".join(f"{n}-byte rows ({k})" for n, k in sorted(BYTE_KV_LAYOUTS.items()))
        raise ValueError(f"'kv_cache' dtype must be one of {halves}, or torch.uint8 with {rows} "
                         f"(got {kv_cache.dtype})")
    return DTYPE_KEYS[kv_cache.dtype]


def out_dtype_for(q_dtype: str) -> torch.dtype:
    """The dtype of ``out``: q's dtype for bf16/fp16 q, bf16 for fp8 q (as AITER writes it)."""
    return torch.bfloat16 if q_dtype in FP8_KEYS else TORCH_DTYPES[q_dtype]
