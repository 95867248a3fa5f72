"""Dtype keys used in records, rule tables and canonical keys.

The keys are the field's short names: ``bf16``, ``fp16``, ``fp8_e4m3`` (OCP e4m3fn,
NVIDIA and gfx950) and ``fp8_e4m3fnuz`` (AMD MI300 / gfx942 native fp8).
"""

from __future__ import annotations

import torch

#: torch dtype -> dtype key, for every dtype q or kv_cache may have.
DTYPE_KEYS: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e4m3fnuz: "fp8_e4m3fnuz",
}

#: dtype key -> torch dtype.
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_KEYS.items()}

FP8_KEYS: frozenset[str] = frozenset({"fp8_e4m3", "fp8_e4m3fnuz"})
HALF_KEYS: frozenset[str] = frozenset({"bf16", "fp16"})
#: fp8 formats stored in AMD's "fnuz" encoding (no negative zero, one NaN code, exponent bias 8).
FNUZ_KEYS: frozenset[str] = frozenset({"fp8_e4m3fnuz"})
#: dtypes whose every value an fp16 tile holds exactly (bf16's exponent range does not fit).
FP16_EXACT_KEYS: frozenset[str] = frozenset({"fp16"}) | FP8_KEYS

#: Allowed (q dtype, kv dtype) pairs. fp8 q needs KV of the same fp8 format.
ALLOWED_DTYPE_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {("bf16", "bf16"), ("fp16", "fp16")}
    | {(q, kv) for q in HALF_KEYS for kv in FP8_KEYS}
    | {(f, f) for f in FP8_KEYS}
)


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


def out_dtype_for(q_dtype: str) -> torch.dtype:
    """The dtype of ``out``: q's dtype for bf16/fp16 q, bf16 for fp8 q (as AITER writes it)."""
    return torch.bfloat16 if q_dtype in FP8_KEYS else TORCH_DTYPES[q_dtype]
