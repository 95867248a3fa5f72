"""The reference path: plain PyTorch in float64. It *defines* the semantics every kernel is checked against.

Semantics (docs/DESIGN.md "The operation"):

* valid ids of token t: ``indices[t, j]`` with ``0 <= id < N`` and ``j < topk_length[t]`` (when given);
  ``-1``, any negative id and any id ``>= N`` are skipped wherever they sit in the row;
* ``s_j = sm_scale * (q_t . k_j)`` over d_qk = 576 dims (q and k dequantised by their fp8 scales);
  with ``logit_cap > 0``: ``s_j = logit_cap * tanh(s_j / logit_cap)``;
* ``lse = log(sum_j exp(s_j))`` natural log, **sink excluded**; ``-inf`` for a row with no valid id;
* ``out = sum_j exp(s_j - lse) v_j`` (v = first 512 columns), then with a sink
  ``out *= sigmoid(lse - sink)`` = ``exp(lse) / (exp(lse) + exp(sink))``;
  ``sink = -inf`` changes nothing, ``sink = +inf`` gives zeros; an empty row gives ``out = 0``;
* a duplicated id counts once per occurrence: ids ``[2, 2, 5]`` weigh row 2 twice (``exp(s_2)`` is in
  the sum twice), exactly as two distinct rows holding the same values would;
* non-finite scores (an ``inf`` or ``NaN`` in ``q``, in a referenced KV row or in a scale): a score
  ``s_j = -inf`` (after the soft cap) gives its id weight 0, and a row whose valid scores are all
  ``-inf`` is an empty row (``out = 0``, ``lse = -inf``); a score ``s_j = +inf`` or ``NaN`` makes that
  (token, head)'s ``out`` and ``lse`` NaN (``+inf - +inf`` has no value); the soft cap maps ``+-inf`` to
  ``+-logit_cap``. The ``triton`` path gives the same (``tests/test_semantics_edges.py``);
* KV rows no valid id references never influence the result (they are not read; NaN there is harmless).

Computation: ``p_j = exp(s_j - max_j s_j)``, ``out = (sum_j p_j v_j) / sum_j p_j``,
``lse = max_j s_j + log(sum_j p_j)``: the output is normalised by the sum of the weights it used, so it
is a convex combination of the attended rows at any score scale (ids ``[2, 2]`` give exactly ``v_2``).
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from mla_sink.core import kv_layout, validate
from mla_sink.core.lse import apply_sink
from mla_sink.core.trace import idle_fake_mode, tracing


def valid_mask(indices: torch.Tensor, num_rows: int, topk_length: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bool ``[T, topk]``: which entries of ``indices`` are valid row ids of a pool of ``num_rows`` rows.

    Args:
        indices: int32 ``[T, topk]`` global row ids; ``-1``, negatives and ids ``>= num_rows`` are invalid.
        num_rows: N, rows in ``kv_cache``.
        topk_length: optional int32 ``[T]``; entries at positions ``>= topk_length[t]`` are invalid.
    """
    idx = indices.long()
    mask = (idx >= 0) & (idx < num_rows)
    if topk_length is not None:
        pos = torch.arange(indices.shape[1], device=indices.device)
        mask &= pos.unsqueeze(0) < topk_length.long().unsqueeze(1)
    return mask


def _normalise(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax-weighted sum of ``v`` over the last dim of the scores ``s [t, H, topk]`` (``-inf`` = not attended).

    Normalised by the sum of the weights it actually used: ``p = exp(s - max)``,
    ``out = (p @ v) / sum(p)``, ``lse = max + log(sum(p))``. The output is therefore a convex
    combination of the attended rows by construction (ids ``[2, 2]`` give exactly ``v[2]`` at any
    score, where normalising by ``exp(-logsumexp)`` drifted: ``2 v`` at ``sm_scale = 1e16``).
    A row whose scores are all ``-inf`` (no valid id) gives ``out = 0``, ``lse = -inf``; a row with a
    ``NaN`` or ``+inf`` score gives ``out = NaN``, ``lse = NaN`` (``+inf - +inf`` is NaN).
    """
    if s.shape[-1] == 0:
        return s.new_zeros((*s.shape[:-1], v.shape[-1])), s.new_full(s.shape[:-1], float("-inf"))
    mx = s.amax(dim=-1)  # NaN propagates; -inf on rows with no attended score
    shift = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
    p = torch.exp(s - shift.unsqueeze(-1))  # 1 at the max, exactly 0 at -inf
    denom = p.sum(dim=-1)  # >= 1 on a row with a finite max, 0 on an empty row, NaN with NaN/+inf
    out = torch.einsum("thk,tkd->thd", p, v) / torch.where(denom == 0, torch.ones_like(denom), denom).unsqueeze(-1)
    return out, shift + torch.log(denom)  # empty row: 0 + log(0) = -inf


def _check_extras(d_v, d_qk, q_scale, kv_scale, compute_dtype, out_dtype, chunk_bytes) -> None:
    """The reference's other arguments: ``d_v`` in ``[1, d_qk]``, the scales one-element tensors of at most one
    dimension, ``compute_dtype`` float64 or float32, ``out_dtype`` floating-point, ``chunk_bytes`` a positive int (ints
    and numpy integers) - a ``ValueError`` naming the argument (``d_v=-1`` returned 575 columns and
    ``compute_dtype=torch.int32`` raised from ``torch.finfo``: a break test)."""
    def integral(x) -> bool:  # an int or a numpy integer, not a bool (numpy's bool is no numbers.Integral)
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    if not integral(d_v) or not 1 <= d_v <= d_qk:
        raise ValueError(f"'d_v' must be an int in [1, {d_qk}] (q's last dimension; got {d_v!r})")
    for name, x in (("q_scale", q_scale), ("kv_scale", kv_scale)):
        if x is not None and (not isinstance(x, torch.Tensor) or x.numel() != 1 or x.dim() > 1):
            raise ValueError(f"'{name}' must be None or a one-element tensor, shape [1] or [] "
                             f"(got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__})")
    if compute_dtype not in (torch.float64, torch.float32):
        raise ValueError(f"'compute_dtype' must be torch.float64 (the reference) or torch.float32 (the fallback "
                         f"path's) (got {compute_dtype!r})")
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise ValueError(f"'out_dtype' must be None or a floating-point torch dtype (got {out_dtype!r})")
    if not integral(chunk_bytes) or chunk_bytes < 1:
        raise ValueError(f"'chunk_bytes' must be an int >= 1 (got {chunk_bytes!r})")


def _check_scale_owners(q, kv_cache, q_scale, kv_scale) -> None:
    """A ``q_scale`` / ``kv_scale`` only beside a float8 ``q`` / ``kv_cache`` (any float8 dtype: the reference
    computes the ones the library refuses too), as the library takes them
    (:func:`mla_sink.core.validate.check_inputs`): a V3.2 cache's scales are in its rows, and a half tensor has
    none (a break test found a ``kv_scale`` applied to a V3.2 cache, giving numbers no library call returns)."""
    for name, scale, owner, x in (("q_scale", q_scale, "q", q), ("kv_scale", kv_scale, "kv_cache", kv_cache)):
        if scale is not None and not (x.dtype.is_floating_point and x.dtype.itemsize == 1):  # any float8 dtype
            what = (f"a {kv_layout.LAYOUT} kv_cache: its scales are in the rows" if x.dtype == torch.uint8 else
                    f"{owner} in {x.dtype} (scales apply to the float8 dtypes only)")
            raise ValueError(f"'{name}' must be None with {what} (got a tensor)")
        if isinstance(scale, torch.Tensor) and scale.device != q.device:  # torch's error named no argument
            raise ValueError(f"'{name}' must be on q's device {q.device} (got {scale.device})")


def _check_shapes(q, kv_cache, indices, sinks, topk_length) -> None:
    """The shapes :func:`sparse_mla_decode_reference` computes with (its dtypes and strides are free, but for the
    ids' integer dtype): a ``ValueError`` naming the argument, its shape and what is allowed, before anything is
    gathered."""
    for name, x in (("q", q), ("kv_cache", kv_cache), ("indices", indices)):
        kv_layout.check_dense(name, x)
    for name, x in (("sinks", sinks), ("topk_length", topk_length)):
        if isinstance(x, torch.Tensor):
            kv_layout.check_dense(name, x)
    for name, x in (("kv_cache", kv_cache), ("indices", indices), ("sinks", sinks), ("topk_length", topk_length)):
        if isinstance(x, torch.Tensor) and x.device != q.device:  # torch's own error named no argument (break test)
            raise ValueError(f"'{name}' must be on q's device {q.device} (got {x.device})")
    if q.dim() != 3:
        raise ValueError(f"'q' must be [T, H, d_qk] (got shape {tuple(q.shape)})")
    T, H, d_qk = q.shape
    if kv_cache.dtype == torch.uint8:
        kv_layout.check_cache(kv_cache)
        if d_qk != kv_layout.D_NOPE + kv_layout.D_ROPE:
            raise ValueError(f"'q' must be [T, H, {kv_layout.D_NOPE + kv_layout.D_ROPE}] with a "
                             f"{kv_layout.LAYOUT} cache (got shape {tuple(q.shape)})")
    elif kv_cache.dim() != 2 or kv_cache.shape[1] != d_qk:
        raise ValueError(f"'kv_cache' must be [N, {d_qk}] (q's d_qk), or a uint8 {kv_layout.LAYOUT} cache "
                         f"(got shape {tuple(kv_cache.shape)})")
    if (indices.dim() != 2 or indices.shape[0] != T or indices.dtype.is_floating_point or indices.dtype.is_complex
            or indices.dtype == torch.bool):
        raise ValueError(f"'indices' must be integer [T={T}, topk] (got {indices.dtype} shape {tuple(indices.shape)})")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (H,)):
        got = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"'sinks' must be None or a [H={H}] tensor (got {got})")
    if topk_length is not None and (not isinstance(topk_length, torch.Tensor) or tuple(topk_length.shape) != (T,)):
        got = tuple(topk_length.shape) if isinstance(topk_length, torch.Tensor) else type(topk_length).__name__
        raise ValueError(f"'topk_length' must be None or a [T={T}] tensor (got {got})")


def sparse_mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    *,
    d_v: int = 512,
    topk_length: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    kv_scale: Optional[torch.Tensor] = None,
    logit_cap: float = 0.0,
    compute_dtype: torch.dtype = torch.float64,
    out_dtype: Optional[torch.dtype] = None,
    chunk_bytes: int = 1 << 28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode with sinks, computed in ``compute_dtype`` (float64 by default).

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp8 (any strides).
        kv_cache: ``[N, 576]`` rows, one shared KV head; value = first ``d_v`` columns. A uint8 cache is
            the 656-byte ``fp8_ds_mla`` layout, ``[N, 656]`` or ``[num_blocks, block_size, 656]`` (ids
            ``block * block_size + offset``): the referenced rows are decoded exactly by
            :func:`mla_sink.core.kv_layout.dequantize_kv_cache` (e4m3 times its tile's float32 scale).
        indices: int32 ``[T, topk]`` global row ids; ``-1`` / out-of-range = skip, anywhere in a row.
        sinks: optional fp32 ``[H]`` natural-log sink logits, not scaled by ``sm_scale``.
        sm_scale: multiplies ``q.k``; default ``576 ** -0.5``.
        d_v: value dims (512).
        topk_length: optional int32 ``[T]``: only the first ``topk_length[t]`` ids of row t are used.
        q_scale, kv_scale: fp32 ``[1]`` or ``[]`` dequantisation scales of fp8 q / fp8 KV (value = stored * scale);
            ``None`` means 1. Unlike the decode, which needs ``kv_scale`` with an fp8 cache, the reference
            also reads any float dtype and int64 ``indices``: it defines the values, not the accepted inputs.
        logit_cap: ``> 0`` soft-caps the scaled scores with ``logit_cap * tanh(s / logit_cap)``; ``<= 0`` disables.
        compute_dtype: float64 (the reference) or float32 (the fallback path on machines without Triton).
        out_dtype: dtype of ``out``; default ``compute_dtype``.
        chunk_bytes: token rows are processed in chunks whose gathered KV stays under this many bytes.

    Returns:
        ``(out, lse)``: ``out [T, H, d_v]`` in ``out_dtype`` (0 on empty rows), ``lse`` fp32 ``[T, H]``
        natural log, sink excluded (``-inf`` on empty rows).

    Raises:
        ValueError: a tensor argument that is not a dense strided tensor (sparse, nested), or not on ``q``'s device;
            a shape that does not fit the others (q not 3-D, kv_cache not ``[N, d_qk]`` or a 656-byte-row uint8
            cache, indices not ``[T, topk]`` integers, sinks not ``[H]``, topk_length not ``[T]``), before anything
            is gathered; ``d_v`` outside ``[1, d_qk]``, a scale that is not a
            one-element tensor of at most one dimension, a ``compute_dtype`` other than float64 / float32, an
            ``out_dtype`` that is not floating-point, ``chunk_bytes`` below 1; ``sm_scale`` or ``logit_cap`` that
            the library refuses (:func:`mla_sink.core.validate.check_sm_scale`,
            :func:`~mla_sink.core.validate.check_logit_cap`); ``indices`` of a bool or complex dtype; a ``q_scale``
            or ``kv_scale`` beside a ``q`` / ``kv_cache`` that is not fp8 (a V3.2 cache's scales are in its rows).
            The other dtypes are not checked: the reference computes in ``compute_dtype`` whatever it is given. A
            pool of no rows (``N = 0``, e.g. an empty DCP shard) is served: every id is then invalid.

    FakeTensors (shape inference) are served inside their ``FakeTensorMode``, entered here when the caller is
    outside it (its own zeros and ids would otherwise be real tensors beside them); every tensor must then be a
    FakeTensor of q's mode, as every one must be a meta tensor beside a meta q and have data beside a q with data
    (:func:`mla_sink.core.validate.check_kinds_like_q`: a ``ValueError`` naming the first that is not).

    Source: docs/DESIGN.md "The operation" (the definition); the sink formula of FlashMLA
    ``flash_mla/flash_mla_interface.py``; DeepSeek-V3.2 sparse attention (the indexer's top-k ids).
    """
    mode = idle_fake_mode(q)
    if mode is not None:  # outside it, the first factory tensor met PyTorch's "Please convert all Tensors" assertion
        with mode:
            return sparse_mla_decode_reference(q, kv_cache, indices, sinks, sm_scale, d_v=d_v, topk_length=topk_length,
                                               q_scale=q_scale, kv_scale=kv_scale, logit_cap=logit_cap,
                                               compute_dtype=compute_dtype, out_dtype=out_dtype,
                                               chunk_bytes=chunk_bytes)
    _check_shapes(q, kv_cache, indices, sinks, topk_length)
    for name, x in (("q_scale", q_scale), ("kv_scale", kv_scale)):
        if isinstance(x, torch.Tensor):
            kv_layout.check_dense(name, x)
    T, H, d_qk = q.shape
    _check_extras(d_v, d_qk, q_scale, kv_scale, compute_dtype, out_dtype, chunk_bytes)
    _check_scale_owners(q, kv_cache, q_scale, kv_scale)
    if not tracing():  # a mix of tensors with and without data met PyTorch's AssertionError (forty-sixth session)
        named = (("q", q), ("kv_cache", kv_cache), ("indices", indices), ("sinks", sinks),
                 ("topk_length", topk_length), ("q_scale", q_scale), ("kv_scale", kv_scale))
        validate.check_kinds_like_q(q, named)
        for name, t in named:  # a freed storage met PyTorch's "out of bounds for storage" RuntimeError
            validate.check_storage(name, t)
    byte_rows = kv_cache.dtype == torch.uint8  # the fp8_ds_mla layout
    N = kv_layout.num_rows(kv_cache)
    # the scalars the library takes, checked as it checks them (any real - a numpy scalar, a Fraction - as the
    # float the kernels are given; str, bool, non-finite and out-of-range values refused, naming the argument)
    if sm_scale is None:
        sm_scale = d_qk ** -0.5
    else:
        validate.check_sm_scale(sm_scale)
        sm_scale = float(sm_scale)
    logit_cap = validate.check_logit_cap(logit_cap)
    mask = valid_mask(indices, N, topk_length)
    qf = q.to(compute_dtype)
    if q_scale is not None:
        qf = qf * q_scale.to(compute_dtype).reshape(())
    kscale = kv_scale.to(compute_dtype).reshape(()) if kv_scale is not None else None
    topk = indices.shape[1]
    row_bytes = d_qk * torch.finfo(compute_dtype).bits // 8
    chunk = max(1, chunk_bytes // max(1, topk * row_bytes))
    outs, lses = [], []
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        m = mask[t0:t1]
        safe = torch.where(m, indices[t0:t1].long(), torch.zeros_like(indices[t0:t1], dtype=torch.long))
        if N == 0:  # nothing to gather (every id is invalid): the placeholder row 0 does not exist
            kv = torch.zeros((t1 - t0, topk, d_qk), dtype=compute_dtype, device=q.device)
        elif byte_rows:  # decode only the gathered rows (a pool beyond 2^31 bytes is never decoded whole)
            rows = kv_layout.gather_rows(kv_cache, safe.reshape(-1))
            kv = kv_layout.dequantize_kv_cache(rows).to(compute_dtype).reshape(t1 - t0, topk, d_qk)
        else:
            kv = kv_cache[safe.reshape(-1)].to(compute_dtype).reshape(t1 - t0, topk, d_qk)
        # Invalid slots gather row 0 as a placeholder; zero them so no value of any row leaks (NaN included).
        kv = torch.where(m.unsqueeze(-1), kv, torch.zeros((), dtype=compute_dtype, device=kv.device))
        if kscale is not None:
            kv = kv * kscale
        s = torch.einsum("thd,tkd->thk", qf[t0:t1], kv) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~m.unsqueeze(1), float("-inf"))
        out, lse = _normalise(s, kv[..., :d_v])
        outs.append(out)
        lses.append(lse)
    out = torch.cat(outs) if outs else q.new_zeros((0, H, d_v), dtype=compute_dtype)
    lse = torch.cat(lses) if lses else q.new_zeros((0, H), dtype=compute_dtype)
    lse32 = lse.float()
    out = apply_sink(out, lse, sinks).to(compute_dtype) if sinks is not None else out
    return out.to(out_dtype or compute_dtype), lse32
