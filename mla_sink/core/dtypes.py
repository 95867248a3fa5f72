"""Dtype keys used in records, rule tables and canonical keys.

The keys are the field's short names: ``bf16``, ``fp16``, ``fp8_e4m3`` (OCP e4m3fn,
NVIDIA and gfx950) and ``fp8_e4m3fnuz`` (AMD MI300 / gfx942 native fp8), the dtypes of ``q`` and of a
576-column ``kv_cache``; and, for ``kv_cache`` only, ``fp8_ds_mla``: DeepSeek-V3.2's 656-byte rows
(e4m3 latent values, four float32 tile scales, bf16 RoPE), stored as ``torch.uint8`` and recognised by
their last dimension (:mod:`mla_sink.core.kv_layout`).
"""

from __future__ import annotations

import functools
from typing import Optional

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


def call_dtype_pairs() -> dict[tuple[str, str], tuple[Optional[str], str]]:
    """Every ``(q dtype key, kv dtype key)`` pair -> ``(out dtype key or None, reason)``: the output's dtype key where
    mla-sink serves the pair (``reason`` empty), ``None`` and the refusal's text where it does not. The rows are
    ``tables/call_dtypes.yaml``'s, read once per process (:func:`_call_dtypes`).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed, has a gap or a shadowed row,
            declares domains other than :data:`DTYPE_KEYS`' and :data:`KV_DTYPE_KEYS`' keys, or serves a pair without a
            known ``out_dtype``.
    """
    return _call_dtypes()[1]


def allowed_dtype_pairs() -> frozenset[tuple[str, str]]:
    """The ``(q dtype key, kv dtype key)`` pairs mla-sink serves (``tables/call_dtypes.yaml``), e.g.
    ``('bf16', 'fp8_ds_mla')``. Raises as :func:`call_dtype_pairs`."""
    return _call_dtypes()[2]


def call_dtypes_table():
    """``tables/call_dtypes.yaml`` loaded, proven by the rule-table checker and checked for what this module reads
    (:func:`_pairs_of`), once per process (:func:`_call_dtypes`). Raises as :func:`call_dtype_pairs`."""
    return _call_dtypes()[0]


#: The one param a served row of ``tables/call_dtypes.yaml`` gives: the output's dtype key, or ``q`` for q's own.
_OUT_PARAM = "out_dtype"


def _pairs_of(table) -> tuple:
    """``(pairs, allowed, out_by_q)`` of ``tables/call_dtypes.yaml``'s rows: :func:`call_dtype_pairs`,
    :func:`allowed_dtype_pairs` and q's dtype key -> the output's (:func:`out_dtype_for`). The table's checks, run
    when it loads (so ``mla-sink tables`` reports what a call would meet): its fields are closed domains of exactly the
    dtype keys; a served row gives ``out_dtype`` and nothing else; every served pair's output is a half dtype (``q``
    resolved: an fp8 q must name one); and each q dtype has one output dtype with every kv_cache dtype
    (:func:`out_dtype_for` takes q's alone).

    Raises:
        dispatch.TableError: a check above fails, naming the table and the row.
    """
    from mla_sink.dispatch import TableError

    where = table.source_file or table.name
    for name, keys in (("q_dtype", set(DTYPE_KEYS.values())), ("kv_dtype", set(KV_DTYPE_KEYS))):
        field = table.fields.get(name)
        if field is None or not field.closed or set(field.domain) != keys:
            got = None if field is None else f"{list(field.domain)}, closed: {field.closed}"
            raise TableError(f"{where}: field {name!r} must be a closed domain of {sorted(keys)} (the dtype keys "
                             f"mla-sink knows; got {got})")
    for row in table.rows:
        extra = set(row.params) - {_OUT_PARAM}
        if extra:
            raise TableError(f"{where}:{row.line}: row {row.id!r} gives {sorted(extra)}; its one param is "
                             f"{_OUT_PARAM!r}")
    pairs: dict = {}
    out_by_q: dict = {}
    for q in DTYPE_KEYS.values():
        for kv in KV_DTYPE_KEYS:
            sel = table.select({"q_dtype": q, "kv_dtype": kv})
            if sel.refused:
                pairs[(q, kv)] = (None, sel.reason)
                continue
            out = sel.params.get(_OUT_PARAM)
            out = q if out == "q" else out
            if out not in HALF_KEYS:
                raise TableError(f"{where}:{sel.row.line}: row {sel.row.id!r} must give {_OUT_PARAM} 'q' (for a half "
                                 f"q) or one of {sorted(HALF_KEYS)}: the kernels write a half output (got "
                                 f"{sel.params.get(_OUT_PARAM)!r} for q {q})")
            if out_by_q.setdefault(q, out) != out:
                raise TableError(f"{where}:{sel.row.line}: row {sel.row.id!r} gives q {q} the output {out}, another "
                                 f"row {out_by_q[q]}: q's dtype must have one output dtype with every kv_cache dtype")
            pairs[(q, kv)] = (out, "")
    allowed = frozenset(pair for pair, (out, _) in pairs.items() if out is not None)
    return pairs, allowed, out_by_q


@functools.lru_cache(maxsize=None)
def _call_dtypes() -> tuple:
    """``(table, pairs, allowed, out_by_q)``: the shipped table, loaded and proven once per process, and what
    :func:`_pairs_of` derives from it (its checks failing the load)."""
    from mla_sink.core.tables import load_checked_table

    table = load_checked_table("call_dtypes", paths=("served",))
    return (table, *_pairs_of(table))


def pair_error(q_dtype: str, kv_dtype: str, what: str) -> str:
    """The message refusing a (q dtype, kv dtype) pair that ``tables/call_dtypes.yaml`` does not serve: the served
    pairs and the refusal row's text; ``what`` names the pair as the caller wrote it (``"('q_dtype', 'kv_dtype')"``,
    ``"(q dtype, kv_cache dtype)"``)."""
    reason = call_dtype_pairs().get((q_dtype, kv_dtype), (None, ""))[1]
    return (f"{what} must be one of {sorted(allowed_dtype_pairs())} (got {(q_dtype, kv_dtype)!r})"
            + (f"; {reason}" if reason else ""))


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
    """The dtype of ``out`` for q of dtype key ``q_dtype`` on every path (``tables/call_dtypes.yaml``'s out_dtype:
    q's dtype for bf16/fp16 q, bf16 for fp8 q, as AITER writes it).

    Raises:
        KeyError: ``q_dtype`` is not a dtype key (callers pass a checked one).
    """
    return TORCH_DTYPES[_call_dtypes()[3][q_dtype]]
