"""Natural-log LSE algebra shared by every path: applying a sink, merging partial states.

Definitions (docs/DESIGN.md, and :mod:`mla_sink.core.reference`, which defines the semantics):
``lse = log(sum_j exp(s_j))`` over a row's valid ids, natural log, sink excluded; an empty row has
``lse = -inf`` and ``out = 0``. A sink ``b`` scales the sink-free output by
``exp(lse) / (exp(lse) + exp(b)) = sigmoid(lse - b)``. Partial states over disjoint id sets merge as
``lse = logsumexp_r(lse_r)``, ``out = sum_r out_r * exp(lse_r - lse)``.

Source: FlashMLA ``flash_mla_interface.py`` (sink formula in its docstring); the split-KV combine of
lightllm/sglang decode kernels.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def sink_factor(lse: torch.Tensor, sinks: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Per-(token, head) factor ``sigmoid(lse - sink)`` in fp32, 0 where ``lse = -inf``.

    Args:
        lse: fp32 ``[T, H]``, natural log, sink excluded; ``-inf`` for empty rows.
        sinks: fp32 ``[H]`` natural-log sink logits (not scaled by ``sm_scale``), or ``None``.

    Returns:
        fp32 ``[T, H]`` (float64 for a float64 ``lse``) or ``None`` without sinks. ``sink = -inf`` gives 1,
        ``sink = +inf`` gives 0, an empty row gives 0 (never the NaN of ``-inf - -inf``).

    No checks of its own (torch's errors for mismatched shapes); :func:`apply_sink` checks its arguments.
    """
    if sinks is None:
        return None
    dtype = torch.promote_types(lse.dtype, torch.float32)  # float64 in the reference, else fp32
    lse_c = lse.to(dtype)
    factor = torch.sigmoid(lse_c - sinks.to(dtype).unsqueeze(0))
    return torch.where(torch.isneginf(lse_c), torch.zeros_like(factor), factor)


def apply_sink(out: torch.Tensor, lse: torch.Tensor, sinks: Optional[torch.Tensor]) -> torch.Tensor:
    """Return the sink-applied output ``out * sigmoid(lse - sink)`` in fp32 (float64 for float64 input).

    Args:
        out: ``[T, H, d_v]`` sink-free output (any float dtype); must be 0 on empty rows.
        lse: fp32 ``[T, H]`` natural-log, sink-free.
        sinks: fp32 ``[H]`` or ``None`` (then ``out`` is returned as fp32 unchanged).

    Returns:
        ``[T, H, d_v]`` fp32 (float64 for float64 input): ``out * sigmoid(lse - sink)`` (the factor is 0 where
        ``lse = -inf``).

    Raises:
        ValueError: naming the argument: one that is not a floating-point tensor (``sinks`` may be ``None``) or
            not on ``out``'s device, a 0-d ``out``, ``lse`` not of ``out``'s shape without its last dim, ``sinks``
            not ``[H]`` (``lse``'s last dim) - checked before any math (fresh users' checks, twenty-ninth session:
            a short ``lse`` or a one-element ``sinks`` broadcast silently).
    """
    for name, x in (("out", out), ("lse", lse), ("sinks", sinks)):
        if (x is not None or name != "sinks") and not (isinstance(x, torch.Tensor) and x.dtype.is_floating_point):
            raise ValueError(f"'{name}' must be a floating-point tensor (got "
                             f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__})")
        if x is not None and x.device != out.device:
            raise ValueError(f"'{name}' must be on {out.device}, like 'out' (got {x.device})")
    if out.dim() < 1:
        raise ValueError(f"'out' must be [..., d_v], at least one dim (got shape {list(out.shape)})")
    if tuple(lse.shape) != tuple(out.shape[:-1]):
        raise ValueError(f"'lse' must have the shape of 'out' without its last dim, 'out' [..., d_v] and 'lse' "
                         f"[...] (got out {list(out.shape)} and lse {list(lse.shape)})")
    if sinks is not None and (lse.dim() < 1 or tuple(sinks.shape) != tuple(lse.shape[-1:])):
        raise ValueError(f"'sinks' must be [H], one per head of 'lse' [T, H] (got sinks {list(sinks.shape)} and lse "
                         f"{list(lse.shape)})")
    return sink_applied(out, lse, sinks)


def sink_applied(out: torch.Tensor, lse: torch.Tensor, sinks: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`apply_sink` without its input checks, for the library's own callers (the AITER finalize, the DCP
    merge), whose shapes, dtypes and devices are fixed by construction: the checks cost about 25 us of Python a call
    (CPU, twenty-ninth session), which the eager hot path does not pay. Same arguments and result."""
    out_c = out.to(torch.promote_types(out.dtype, torch.float32))
    factor = sink_factor(lse, sinks)
    return out_c if factor is None else out_c * factor.to(out_c.dtype).unsqueeze(-1)


def merge_states(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge sink-free partial attention states computed over disjoint id sets.

    Args:
        outs: R tensors ``[..., d_v]``, each normalised over its own ids (0 where its ``lse`` is -inf).
        lses: R fp32 tensors ``[...]``, natural log, sink excluded; ``-inf`` = no valid id in that part.

    Returns:
        ``(out, lse)``: fp32 ``[..., d_v]`` and fp32 ``[...]``, with ``lse = logsumexp_r(lse_r)`` and
        ``out = sum_r out_r * exp(lse_r - lse)``, computed as ``m + log(sum_r w_r)`` and ``sum_r w_r out_r /
        sum_r w_r`` with ``w_r = exp(lse_r - m)``, ``m`` the largest ``lse_r`` (so the weights sum to 1 exactly
        at any ``|lse|``, as the combine kernel takes them); a NaN ``lse_r`` makes the row NaN; parts with
        ``lse_r = -inf`` contribute exactly 0 (their ``out_r`` is never read into the sum, so even a
        NaN there does not leak); a row empty in every part gives ``out = 0``, ``lse = -inf``; a row where a
        part has ``lse_r = +inf`` gives ``lse = +inf`` and ``out = NaN`` (that part's weight ``exp(+inf - +inf)``
        has no value, as a ``+inf`` score makes the reference's ``out`` NaN).

    Raises:
        ValueError: ``outs`` or ``lses`` not a list or tuple; they differ in length or are empty; a part that is not
            a tensor, of another shape than the first (``outs[r]`` ``[..., d_v]``, at least one dim, ``lses[r]``
            its ``[...]``), on another device, or not floating point.
    """
    for name, parts in (("outs", outs), ("lses", lses)):  # a list or tuple of parts (a stacked tensor is not one)
        if not isinstance(parts, (list, tuple)):
            raise ValueError(f"'{name}' must be a list or tuple of tensors, one per part (got {type(parts).__name__})")
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"outs and lses must be non-empty and of equal length (got {len(outs)} and {len(lses)})")
    for name, parts in (("outs", outs), ("lses", lses)):
        for r, x in enumerate(parts):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"every part must be a torch.Tensor (got {name}[{r}] of type {type(x).__name__})")
    shape, device = tuple(outs[0].shape), outs[0].device
    if not shape:
        raise ValueError("outs[r] must be [..., d_v], at least one dim (got outs[0] of shape [])")
    for r, (o, x) in enumerate(zip(outs, lses)):  # named here, not torch.stack's bare RuntimeError
        if tuple(o.shape) != shape or tuple(x.shape) != shape[:-1]:
            raise ValueError(f"every part must have the shapes of the first, outs[r] {list(shape)} and lses[r] "
                             f"{list(shape[:-1])} (got outs[{r}] {list(o.shape)} and lses[{r}] {list(x.shape)})")
        if o.device != device or x.device != device:
            raise ValueError(f"every part must be on {device}, like outs[0] (got outs[{r}] on {o.device} and "
                             f"lses[{r}] on {x.device})")
        if not (o.dtype.is_floating_point and x.dtype.is_floating_point):
            raise ValueError(f"outs[r] and lses[r] must be floating point (got outs[{r}] {o.dtype} and lses[{r}] "
                             f"{x.dtype})")
    lse_stack = torch.stack([x.float() for x in lses])  # [R, ...]
    # relative to the largest part (0 where every part is empty or one is +inf, as the combine kernel takes it),
    # and the output normalised by the weights' own sum: normalising by exp(lse_r - lse) with the fp32 merged
    # lse lost the log of the sum at large |lse| (two equal parts at lse = 1e8 merged to 2x their output)
    m = lse_stack.amax(dim=0)  # NaN where a part's LSE is NaN
    empty = torch.isneginf(m)
    m_safe = torch.where(empty | torch.isposinf(m), torch.zeros_like(m), m)
    weights = torch.exp(lse_stack - m_safe.unsqueeze(0))  # exactly 0 for lse_r = -inf; +inf for lse_r = +inf
    w_sum = weights.sum(dim=0)
    lse = torch.where(empty, m, m_safe + torch.log(w_sum))
    out = torch.zeros_like(outs[0], dtype=torch.float32)
    for w, o in zip(weights, outs):
        o32 = o.float()
        o32 = torch.where(w.unsqueeze(-1) > 0, o32, torch.zeros_like(o32))
        out = out + w.unsqueeze(-1) * o32
    out = out / torch.where(empty, torch.ones_like(w_sum), w_sum).unsqueeze(-1)
    return out, lse
