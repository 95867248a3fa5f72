"""Whether this thread's call of the library is being traced (``torch.compile`` / ``torch.export``), or runs; and
traced sizes shown as numbers in error messages (:func:`concrete`); whether a tensor has data at all
(:func:`has_no_data`); a value shown briefly in a message (:func:`brief`).

``torch.compiler.is_compiling()`` reads one process-wide flag that a compilation holds for its whole duration, so an
eager call in another thread saw it set and took the traced branch: the custom operator, whose real implementation
took it again, without end (``RecursionError``; a break test, thirty-ninth session). :func:`tracing` asks what each
branch means: Dynamo symbolically evaluating this code (``torch.compiler.is_dynamo_compiling()``, which Dynamo reads
as True and which is False when the code runs), or a non-strict ``torch.export`` running it in this thread on fake
tensors (the flag set and a fake or proxy dispatch mode on this thread's stack; dispatch modes are thread-local).
"""

from __future__ import annotations

import fractions
from typing import Any

import torch


def tracing() -> bool:
    """True while ``torch.compile`` / a strict ``torch.export`` (Dynamo) traces this code, or a non-strict
    ``torch.export`` runs it in this thread; False for eager calls, also while another thread compiles.

    Source: ``torch.compiler.is_compiling`` (a module-level flag, set by ``torch._dynamo.convert_frame`` for a whole
    compilation) and ``torch.compiler.is_dynamo_compiling`` (PyTorch's docs: True only under TorchDynamo)."""
    if not torch.compiler.is_compiling():  # the eager case first: one call on the hot path
        return False
    if torch.compiler.is_dynamo_compiling():  # Dynamo reads both as True: the rest is not traced
        return True
    keys = torch._C._TorchDispatchModeKey
    return (torch._C._get_dispatch_mode(keys.FAKE) is not None
            or torch._C._get_dispatch_mode(keys.PROXY) is not None)


def concrete(values) -> tuple:
    """``values`` (a shape or strides) for an error message: a symbolic size of a ``torch.compile(dynamic=True)``
    trace shown as the number it stands for in this call (its hint), so the message says ``658`` where the
    symbol is ``s32``; one without a hint stays as it is."""
    shown = []
    for v in values:
        hint = getattr(getattr(v, "node", None), "hint", None) if isinstance(v, torch.SymInt) else None
        shown.append(int(hint) if hint is not None else v)
    return tuple(shown)


def shown(value):
    """One size for an error message, as :func:`concrete` shows it (the number a symbolic size stands for)."""
    return concrete((value,))[0]


_FakeTensor = torch._subclasses.fake_tensor.FakeTensor


def idle_fake_mode(t: Any) -> Any:
    """The ``FakeTensorMode`` of a FakeTensor ``t`` used outside any fake mode of this thread (where a factory call
    such as ``torch.zeros`` makes a real tensor, which the FakeTensor's ops then refuse beside it), else ``None``
    (a real or meta tensor, or a fake mode already active)."""
    if type(t) is torch.Tensor or not isinstance(t, _FakeTensor):
        return None
    from torch._guards import active_fake_mode

    return None if active_fake_mode() is not None else t.fake_mode


def has_no_data(t: Any) -> bool:
    """Whether ``t`` has no data to compute on: a meta tensor, or a FakeTensor (``FakeTensorMode``
    outside ``torch.compile``). Decode calls on such tensors go through the operator, whose fake implementation
    infers the output shapes; :func:`mla_sink.core.kv_layout.quantize_kv_cache` refuses them (its scales depend on
    the values)."""
    if type(t) is torch.Tensor:  # the common case: one type test
        return t.is_meta
    return isinstance(t, torch.Tensor) and (t.is_meta or isinstance(t, _FakeTensor))


#: Digits beyond which :func:`brief` shortens an int.
_BRIEF_DIGITS = 40


def brief(value: object) -> str:
    """``repr(value)`` for an error message, an int of more than :data:`_BRIEF_DIGITS` digits shortened to its
    leading digits and its length (``10**400`` printed all 401 digits: a break test, forty-third session), and a
    Fraction of such ints as its float's ``repr`` (0.0 or inf when beyond fp64) and its digit counts."""
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > _BRIEF_DIGITS:
        sign = "-" if value < 0 else ""
        digits = text.lstrip("-")
        return f"{sign}{digits[:6]}... (an int of {len(digits)} digits)"
    if isinstance(value, fractions.Fraction) and len(text) > _BRIEF_DIGITS:
        num, den = len(str(abs(value.numerator))), len(str(value.denominator))
        try:
            approx = repr(float(value))
        except OverflowError:
            approx = "-inf" if value < 0 else "inf"
        return f"Fraction of about {approx} (numerator of {num} digits, denominator of {den})"
    return text
