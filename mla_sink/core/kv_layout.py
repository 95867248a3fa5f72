"""The 656-byte FP8 KV layout of DeepSeek-V3.2 (``fp8_ds_mla``): its constants, a quantiser and an
exact float64 dequantiser.

One token row of the KV pool is 656 bytes::

    bytes   0 .. 511   the 512 latent ("NoPE") values, float8 e4m3 (fn: OCP e4m3, max 448, NaN 0x7F/0xFF)
    bytes 512 .. 527   four float32 scales, little-endian; scale i belongs to values 128*i .. 128*i+127
    bytes 528 .. 655   the 64 RoPE values, bf16, unscaled

Value of latent column ``c``: ``e4m3[c] * scale[c // 128]``, the scale read exactly as the float32 it
is (never rounded to bf16). The value columns of attention are the 512 latent ones; the key is all
576 (latent then RoPE). A pool is a ``torch.uint8`` tensor ``[N, 656]`` or, paged,
``[num_blocks, block_size, 656]`` whose row ids are ``block * block_size + offset``.

Writers disagree on the scales (:func:`quantize_kv_cache` writes both conventions):

* ``pow2``: each tile's scale is a power of two, ``2^ceil(log2(amax / 448))``, the smallest one with
  ``amax / scale <= 448`` (FlashMLA ``tests/quant.py``, ``quantize_k_cache`` for ``V32_FP8Sparse``;
  FlashMLA clamps ``amax / 448`` to at least ``1e-4`` first, so its smallest scale is ``2^-13``, also
  for an all-zero tile);
* ``amax``: ``scale = amax / 448`` as is (vLLM ``csrc/cache_kernels.cu``,
  ``concat_and_cache_ds_mla_kernel``, the ``fp8_ds_mla`` KV cache dtype; vLLM #54563; vLLM floors the
  scale at ``FLT_MIN``, so its all-zero tile gets ``FLT_MIN``).

SGLang stores the same numbers as 528 + 128 bytes (not this layout). Reading every scale as float32
makes every writer's cache decode to the numbers that writer meant.

Sources: FlashMLA ``flash_mla/flash_mla_interface.py`` (the layout, "In FP8+sparse mode, each token's
KV cache is 656 Bytes"), FlashMLA ``tests/quant.py`` (its quantiser and dequantiser), vLLM
``fp8_ds_mla`` (its writer); docs/DESIGN.md "The fp8_ds_mla KV layout".
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mla_sink.core.trace import concrete, has_no_data

#: The layout's key (the kv dtype key of :class:`mla_sink.core.records.CallSpec`).
LAYOUT = "fp8_ds_mla"
D_NOPE = 512  #: latent (value) columns, stored as e4m3
D_ROPE = 64  #: RoPE columns, stored as bf16
TILE = 128  #: latent columns per scale
NUM_TILES = D_NOPE // TILE  #: scales per row (4)
SCALE_OFFSET = D_NOPE  #: byte offset of the four float32 scales (512)
ROPE_OFFSET = SCALE_OFFSET + 4 * NUM_TILES  #: byte offset of the bf16 RoPE values (528)
ROW_BYTES = ROPE_OFFSET + 2 * D_ROPE  #: bytes per token row (656)
FP8_MAX = 448.0  #: largest finite float8 e4m3fn magnitude
#: smallest scale :func:`quantize_kv_cache` writes for a non-zero tile (the smallest normal float32)
MIN_SCALE = 2.0 ** -126
#: the scale of an all-zero tile (any scale decodes it to zeros; 1.0 is the neutral choice)
ZERO_TILE_SCALE = 1.0
SCALE_CONVENTIONS = ("pow2", "amax")
#: Power-of-two scales ``2^k`` with ``k`` in this range decode exactly into bf16: every e4m3fn value is a
#: multiple of 2^-9 with at most 4 significant bits and magnitude at most 448 < 2^9, so ``code x 2^k`` is 0
#: or a normal bf16 (and fp32) number when ``2^-9 x 2^k >= 2^-126`` (k >= -117) and ``448 x 2^k`` stays below
#: the largest bf16, about 3.39e38 (k <= 119). A zero scale decodes every code to 0, exactly too.
#: FlashMLA's quantiser writes scales in ``[2^-13, ...]``; vLLM's ``amax / 448`` scales are almost never
#: powers of two. The sm90 seesaw kernel decodes tiles in bf16 and serves a program only while every scale
#: it reads is such a scale; its exact reading multiplies the codes by a scale's power of two clamped to this
#: range and applies the rest in fp32 (``mla_sink.kernels.gluon.seesaw_fp8``).
BF16_EXACT_SCALE_EXP = (-117, 119)
_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_layout(layout: Any) -> None:
    if layout != LAYOUT:
        raise ValueError(f"'layout' must be {LAYOUT!r} (got {layout!r})")


def _scales(amax: torch.Tensor, scale: str) -> torch.Tensor:
    """float32 scales of tiles whose largest magnitude is ``amax`` (float64, finite, >= 0)."""
    if scale == "pow2":
        k = torch.ceil(torch.log2(torch.clamp(amax, min=1e-300) / FP8_MAX))
        # log2 in float64 may land one off at exact powers of two: settle k so that
        # 448 * 2^(k-1) < amax <= 448 * 2^k (every product exact in float64)
        k = k + (amax > FP8_MAX * torch.exp2(k)).to(k.dtype)
        k = k - (amax <= FP8_MAX * torch.exp2(k - 1)).to(k.dtype)
        s = torch.exp2(torch.clamp(k, min=math.log2(MIN_SCALE)))
    else:
        s = torch.clamp((amax.float() / FP8_MAX).double(), min=MIN_SCALE)  # vLLM: amax / 448.f in float32
    return torch.where(amax == 0, torch.full_like(s, ZERO_TILE_SCALE), s).float()


def quantize_kv_cache(kv: torch.Tensor, layout: str = LAYOUT, scale: str = "pow2") -> torch.Tensor:
    """Quantise KV rows into the 656-byte ``fp8_ds_mla`` layout (module docstring).

    Args:
        kv: ``[N, 576]`` (or paged ``[num_blocks, block_size, 576]``) bf16 / fp16 / float32 KV rows:
            512 latent columns then 64 RoPE columns. Every value must be finite.
        layout: ``"fp8_ds_mla"`` (the only layout).
        scale: the scale convention of each 128-column latent tile (default ``"pow2"``; ``amax`` = its largest
            magnitude):
            ``"pow2"``: the smallest power of two with ``amax / scale <= 448`` (FlashMLA's), at least
            ``2^-126``; ``"amax"``: ``amax / 448`` computed in float32 (vLLM's), at least ``2^-126``
            (vLLM's floor, ``FLT_MIN``). An all-zero tile gets scale ``1.0`` under both (FlashMLA
            writes ``2^-13`` there, vLLM ``FLT_MIN``; every scale decodes a zero tile to zeros).

    Returns:
        uint8 ``[N, 656]`` (paged input: ``[num_blocks, block_size, 656]``), contiguous, on ``kv``'s
        device: latent codes ``e4m3fn(clamp(x / scale, -448, 448))`` (``x`` in float32, rounded to the
        nearest e4m3 value; where that code times the scale would overflow float32 - a value within an e4m3
        step of float32's largest -, the next code toward zero), the four float32 scales little-endian, the
        RoPE columns rounded to bf16 (exact for bf16 input).

    Raises:
        ValueError: ``kv`` not a dense tensor of shape ``[N, 576]`` / ``[B, S, 576]`` in bf16/fp16/float32, on
            the meta device or a FakeTensor (no data), a non-finite value in ``kv`` or one too large for the layout
            (a RoPE value beyond bf16's largest finite value, about 3.39e38), an unknown ``layout`` or ``scale``.
    """
    _check_layout(layout)
    if scale not in SCALE_CONVENTIONS:
        raise ValueError(f"'scale' must be one of {SCALE_CONVENTIONS} (got {scale!r})")
    check_dense("kv", kv)
    if kv.dtype not in _KV_DTYPES:
        raise ValueError(f"'kv' must be bfloat16, float16 or float32 (got {kv.dtype})")
    if kv.dim() not in (2, 3) or kv.shape[-1] != D_NOPE + D_ROPE:
        raise ValueError(f"'kv' must be [N, {D_NOPE + D_ROPE}] or [num_blocks, block_size, {D_NOPE + D_ROPE}] "
                         f"(got shape {concrete(kv.shape)})")
    if has_no_data(kv):  # a FakeTensor's values are unknown too: its isfinite check raised inside torch (break test)
        kind = "a tensor on the meta device" if kv.is_meta else "a FakeTensor"
        raise ValueError(f"'kv' must hold data (got {kind}): the scales depend on the values")
    lead = tuple(kv.shape[:-1])
    x = kv.reshape(-1, D_NOPE + D_ROPE).float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("'kv' must hold finite values only (got inf or NaN)")
    n = x.shape[0]
    nope = x[:, :D_NOPE].reshape(n, NUM_TILES, TILE)
    s = _scales(nope.abs().amax(dim=-1).double(), scale)  # float32 [N, 4]
    codes = torch.clamp(nope / s.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    over = ~torch.isfinite(codes.float() * s.unsqueeze(-1))
    if bool(over.any()):
        # a value within an e4m3 step of float32's largest rounded up to a code whose product with the scale
        # overflows: the next code toward zero (the magnitude bits less one; its product is at most |x|)
        cb = codes.view(torch.uint8)
        codes = torch.where(over, cb - 1, cb).view(torch.float8_e4m3fn)
    out = torch.empty((n, ROW_BYTES), dtype=torch.uint8, device=kv.device)
    out[:, :D_NOPE] = codes.reshape(n, D_NOPE).view(torch.uint8)
    bits = s.view(torch.int32).long() & 0xFFFFFFFF  # little-endian bytes of each float32 scale
    sb = torch.stack([(bits >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    out[:, SCALE_OFFSET:ROPE_OFFSET] = sb.reshape(n, 4 * NUM_TILES).to(torch.uint8)
    # the kernels read the RoPE as bf16: a value that overflows there is refused (every latent code x its scale is
    # finite: at most |x| after the step toward zero above)
    rope = x[:, D_NOPE:].to(torch.bfloat16)
    if not bool(torch.isfinite(rope).all()):
        raise ValueError(f"'kv' holds values too large for the {LAYOUT} layout (largest RoPE magnitude "
                         f"{float(x[:, D_NOPE:].abs().max()):.4g}): its RoPE values are bf16, whose largest finite "
                         f"value is about 3.39e38")
    rb = rope.view(torch.int16).long() & 0xFFFF
    out[:, ROPE_OFFSET:] = torch.stack([rb & 0xFF, rb >> 8], dim=-1).reshape(n, 2 * D_ROPE).to(torch.uint8)
    return out.reshape(*lead, ROW_BYTES)


def check_dense(name: str, value: Any) -> torch.Tensor:
    """``value`` if it is a dense strided ``torch.Tensor``; else a ``ValueError`` naming ``name`` and what it got (not
    a tensor, a sparse or other non-strided layout, a nested tensor). Every entry point's first check of a tensor
    argument (the library's :mod:`mla_sink.core.validate`, the quantiser, the decoder and the reference), so a
    sparse ``kv`` gets this message rather than the error of the first torch op that does not take it."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"'{name}' must be a torch.Tensor (got {type(value).__name__})")
    if value.layout != torch.strided or value.is_nested:
        raise ValueError(f"'{name}' must be a dense strided tensor (got layout {value.layout}"
                         f"{', nested' if value.is_nested else ''})")
    return value


def check_cache(kv_cache: Any) -> None:
    """Raise ``ValueError`` (naming ``kv_cache``, its dtype and shape) unless it is a dense uint8 tensor of
    656-byte rows, ``[N, 656]`` or ``[num_blocks, block_size, 656]``; strides are the callers' concern."""
    check_dense("kv_cache", kv_cache)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() not in (2, 3) or kv_cache.shape[-1] != ROW_BYTES:
        raise ValueError(f"'kv_cache' must be uint8 [N, {ROW_BYTES}] or [num_blocks, block_size, {ROW_BYTES}] "
                         f"(got {kv_cache.dtype} shape {concrete(kv_cache.shape)}){one_head_hint(kv_cache)}")


def one_head_hint(kv_cache: torch.Tensor) -> str:
    """The tail of a shape error for a 4-D cache with one KV head, ``[num_blocks, block_size, 1, 656]`` (FlashMLA's
    ``k_cache``, ``flash_mla_interface.py``): how to pass it (its view without that dimension, no copy); ``""`` for
    any other shape."""
    if kv_cache.dim() == 4 and kv_cache.shape[2] == 1 and kv_cache.shape[-1] == ROW_BYTES:
        return (f"; a [num_blocks, block_size, 1, {ROW_BYTES}] cache of one KV head (FlashMLA's k_cache) is passed "
                f"as kv_cache.squeeze(2)")
    return ""


def cache_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """The uint8 ``[N, 656]`` rows of an ``fp8_ds_mla`` pool (a view where the strides allow, else a copy);
    row ``block * block_size + offset`` of a paged ``[num_blocks, block_size, 656]`` pool. ``kv_cache`` must be a
    checked pool (:func:`check_cache`); raises nothing of its own."""
    return kv_cache.reshape(-1, ROW_BYTES)


def num_rows(kv_cache: torch.Tensor) -> int:
    """N, the token rows of a pool: ``shape[0]`` of ``[N, D]`` (``D`` = 576, or the 656 bytes of an ``fp8_ds_mla``
    row), ``num_blocks * block_size`` of a paged ``[num_blocks, block_size, 656]``. ``kv_cache`` must have 2 or 3
    dimensions (the callers' checks)."""
    return kv_cache.shape[0] if kv_cache.dim() == 2 else kv_cache.shape[0] * kv_cache.shape[1]


def row_addressing(kv_cache: torch.Tensor) -> tuple[int, int]:
    """``(kv_block_size, stride_kv)``: how the kernels address row ``id`` of a pool, at element offset
    ``(id // kv_block_size) * stride_kv + (id % kv_block_size) * kv_cache.stride(-2)``.

    A flat pool ``[N, D]`` is ``(1, stride(0))``. A paged one ``[num_blocks, block_size, D]`` is
    ``(block_size, stride(0))`` (any block stride; rows inside a block at ``stride(1)``), unless its
    blocks follow each other without a gap (``stride(0) == block_size * stride(1)``, or a single block):
    then it is the flat pool ``(1, stride(1))`` it is, and the kernels skip the page arithmetic (a shift, a
    mask and a second 64-bit multiply-add per row: 3-5% of the sm90 seesaw's V3.2 launches at 128 heads,
    H200, nineteenth session, BENCHMARKS.md). A block size of 1 is ``(1, stride(0))``.

    Args:
        kv_cache: a pool ``[N, D]`` or ``[num_blocks, block_size, D]`` (any dtype; for ``fp8_ds_mla`` the
            uint8 rows, ``D = 656``).

    Returns:
        ``(kv_block_size, stride_kv)``, both in the units of ``kv_cache``'s strides (elements).

    Raises:
        ValueError: ``kv_cache`` is not a tensor of 2 or 3 dimensions (naming its type or shape).
    """
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() not in (2, 3):
        what = f"shape {concrete(kv_cache.shape)}" if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        raise ValueError(f"'kv_cache' must be a pool [N, D] or [num_blocks, block_size, D] (got {what})")
    if kv_cache.dim() == 2 or kv_cache.shape[1] == 1:
        return 1, kv_cache.stride(0)
    block_size = kv_cache.shape[1]
    if kv_cache.shape[0] == 1 or kv_cache.stride(0) == block_size * kv_cache.stride(1):
        return 1, kv_cache.stride(1)
    return block_size, kv_cache.stride(0)


def rows_packed(kv_cache: torch.Tensor) -> bool:
    """Whether a pool's rows follow each other without a gap: row ``id`` at element offset ``id * D`` (``D`` =
    ``kv_cache.shape[-1]``: 576, or 656 bytes), as in a contiguous ``[N, D]`` tensor or pages that follow each
    other without a gap (:func:`row_addressing`). A pool of at most one row is packed, whatever its strides. A view
    ``kv[:, :576]`` of wider rows (row stride 640, say) is not. :attr:`mla_sink.CallSpec.kv_rows_packed`.

    Args:
        kv_cache: a pool ``[N, D]`` or ``[num_blocks, block_size, D]``.

    Raises:
        ValueError: as :func:`row_addressing`.
    """
    block_size, stride = row_addressing(kv_cache)
    return num_rows(kv_cache) <= 1 or (block_size == 1 and stride == kv_cache.shape[-1])


def span_bytes(kv_cache: torch.Tensor) -> int:
    """The bytes a pool spans: from its first byte to the end of its last element, ``(1 + sum((size_i - 1) *
    stride_i)) * element_size`` (0 for an empty pool), whatever its layout (``[N, 576]``, rows of a wider row
    stride, pages with a gap between them, the uint8 ``fp8_ds_mla`` rows). A kernel that addresses rows by a 32-bit
    byte offset from the pool's first byte reads rows past ``2^32`` bytes wrongly; ``tables/mla_decode.yaml`` (the
    AITER paths' ``kv_cache_bytes``) says which do. :attr:`mla_sink.CallSpec.kv_cache_bytes`.

    Args:
        kv_cache: a pool with a shape and strides (a tensor with or without data); sizes must be plain ints.
    """
    if kv_cache.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(kv_cache.shape, kv_cache.stride()))
    return (1 + last) * kv_cache.element_size()


def gather_rows(kv_cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """uint8 ``[len(ids), 656]``: the rows ``ids`` (int64, each in ``[0, N)``) of a flat or paged pool,
    without copying the pool (a paged pool with padded blocks is not one ``[N, 656]`` view). The ids must be in
    range (the callers mask invalid ones first): PyTorch's ``IndexError`` otherwise."""
    if kv_cache.dim() == 2:
        return kv_cache[ids]
    block_size = kv_cache.shape[1]
    return kv_cache[torch.div(ids, block_size, rounding_mode="floor"), torch.remainder(ids, block_size)]


def dequantize_kv_cache(kv_cache: torch.Tensor, layout: str = LAYOUT) -> torch.Tensor:
    """Decode ``fp8_ds_mla`` rows exactly, in float64 (what the reference attends to).

    Args:
        kv_cache: uint8 ``[N, 656]`` or paged ``[num_blocks, block_size, 656]`` (any strides).
        layout: ``"fp8_ds_mla"`` (the only layout).

    Returns:
        float64 ``[N, 576]`` (paged: ``N = num_blocks * block_size``, row ``block * block_size +
        offset``): columns ``0..511`` = ``e4m3 * scale`` of their 128-column tile (the e4m3 value
        decoded exactly, the scale the float32 its four little-endian bytes hold, the product exact in
        float64), columns ``512..575`` = the bf16 RoPE values. NaN codes (``0x7F``/``0xFF``) decode to
        NaN; NaN or inf scales propagate (``0 * inf`` is NaN).

    Raises:
        ValueError: ``kv_cache`` not a dense uint8 ``[N, 656]`` / ``[B, S, 656]`` tensor, or an unknown ``layout``.
            A tensor without data (meta, FakeTensor) gives one of the output's shape and dtype.
    """
    _check_layout(layout)
    check_cache(kv_cache)
    rows = cache_rows(kv_cache)  # a meta tensor or a FakeTensor decodes to one of the output's shape, as the
    # reference's shape inference needs (a meta cache was refused while a FakeTensor was decoded: a break test)
    n = rows.shape[0]
    vals = rows[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).double().reshape(n, NUM_TILES, TILE)
    sb = rows[:, SCALE_OFFSET:ROPE_OFFSET].long().reshape(n, NUM_TILES, 4)
    bits = sb[..., 0] | (sb[..., 1] << 8) | (sb[..., 2] << 16) | (sb[..., 3] << 24)
    scales = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32).double()
    rb = rows[:, ROPE_OFFSET:].long().reshape(n, D_ROPE, 2)
    rbits = rb[..., 0] | (rb[..., 1] << 8)
    rope = torch.where(rbits >= 1 << 15, rbits - (1 << 16), rbits).to(torch.int16).view(torch.bfloat16).double()
    return torch.cat([(vals * scales.unsqueeze(-1)).reshape(n, D_NOPE), rope], dim=1)
