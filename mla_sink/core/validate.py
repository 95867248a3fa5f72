"""Input validation: every malformed call is a ``ValueError`` raised before any kernel runs.

Messages follow one shape: the argument, the value, what is allowed, e.g.
``'sinks' must be float32 (got torch.bfloat16)``. Only metadata (shapes, dtypes, strides, devices)
is inspected, never tensor values, so validation needs no host synchronisation and is safe to call
before CUDA-graph capture. Value-level semantics (``-1`` ids, ids outside the pool) are handled by
the kernels, not rejected.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from mla_sink.core import kv_layout
from mla_sink.core.dtypes import (
    DS_MLA_KEYS,
    DTYPE_KEYS,
    FP8_KEYS,
    allowed_dtype_pairs,
    kv_dtype_key,
    out_dtype_for,
    pair_error,
)
from mla_sink.core.records import D_QK, D_V, TOPK_MAX, TOPK_WHY
from mla_sink.core.trace import brief, concrete, has_no_data, shown, tracing

#: Whether a tensor is a torch.func transform's wrapper (vmap's BatchedTensor, grad's): PyTorch's own test, absent
#: from some builds (then nothing is such a wrapper to us).
is_functorch_wrapped_tensor = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                                      lambda t: False)


def _dt(t: torch.Tensor) -> str:
    return DTYPE_KEYS.get(t.dtype, str(t.dtype))


#: byte alignment of an ``fp8_ds_mla`` row (its float32 scales and bf16 RoPE values are read in place)
DS_MLA_ALIGN = 4


def _has_memory(t: torch.Tensor) -> bool:
    """Whether ``t`` has a real data pointer (not meta, fake (:func:`~mla_sink.core.trace.has_no_data`) or traced)."""
    return not (has_no_data(t) or tracing())


def check_kinds_like_q(q: torch.Tensor, named) -> None:
    """Raises ValueError unless every tensor of ``named`` (``(argument name, tensor or None)`` pairs) is of q's kind:
    a tensor with data beside a q with data, a meta tensor beside a meta q, a FakeTensor of q's ``FakeTensorMode``
    beside a FakeTensor q. A call on tensors without data infers shapes and one with data computes; a mix of the
    kinds met PyTorch's "Please convert all Tensors to FakeTensors" or "Mixing fake modes" ``AssertionError``
    (a break test, forty-sixth session). Eager calls only: a traced call's tensors are the tracer's."""
    want = _kind(q)
    for name, t in named:
        if isinstance(t, torch.Tensor) and _kind(t) != want:
            if want[0] == "data":
                raise ValueError(f"'{name}' must hold data like q (got a {type(t).__name__} on {t.device}, which has "
                                 "none: a kernel would read or write it; pass real tensors, or give every tensor "
                                 "without data for shape inference)")
            raise ValueError(f"'{name}' must be {_kind_text(want, want)} like q (got {_kind_text(_kind(t), want)}): "
                             f"pass every tensor of a call with data, or every one without (meta tensors, or "
                             f"FakeTensors of one FakeTensorMode) for shape inference")


def check_call_kinds(x) -> None:
    """:func:`check_kinds_like_q` over the tensors of a call ``x`` (a :class:`~mla_sink.core.inputs.DecodeInputs`):
    kv_cache, indices, sinks, topk_length, the scales and out."""
    check_kinds_like_q(x.q, ((name, getattr(x, name)) for name in _READ_BY_KERNELS + ("out",)))


def _kind_text(kind: tuple, q_kind: tuple) -> str:
    """A kind of :func:`_kind` in words, beside q's."""
    if kind[0] != "fake":
        return "a tensor with data" if kind[0] == "data" else "a meta tensor"
    if kind == q_kind:
        return "a FakeTensor of q's FakeTensorMode"
    return "a FakeTensor of another FakeTensorMode" if q_kind[0] == "fake" else "a FakeTensor"


def _kind(t: torch.Tensor) -> tuple:
    """``('fake', id of its mode)``, ``('meta',)`` or ``('data',)``: what :func:`check_kinds_like_q` compares."""
    if type(t) is not torch.Tensor and isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
        return ("fake", id(t.fake_mode))
    return ("meta",) if t.is_meta else ("data",)


def check_ds_mla_pointer(kv_cache: torch.Tensor) -> None:
    """Raises ValueError unless an ``fp8_ds_mla`` ``kv_cache``'s data pointer is a multiple of 4 bytes
    (each row's float32 scales are loaded in place; a GPU faults on a misaligned load). Per call: a data
    pointer is not part of a call's signature."""
    if kv_cache.data_ptr() % DS_MLA_ALIGN:
        _misaligned_ds_mla(f"a data pointer at {kv_cache.data_ptr() % DS_MLA_ALIGN} modulo {DS_MLA_ALIGN}, e.g. a view "
                           f"that starts a few bytes into its storage")


def _misaligned_ds_mla(got: str) -> None:
    """Raises the ValueError of an ``fp8_ds_mla`` ``kv_cache`` that does not start at a multiple of 4 bytes
    (``got``: what it starts at)."""
    raise ValueError(f"'kv_cache' (fp8_ds_mla) must start at a multiple of {DS_MLA_ALIGN} bytes: its rows' float32 "
                     f"scales are read in place (got {got})")


def check_ds_mla_cache(kv_cache: torch.Tensor, *, allow_empty_pool: bool = False) -> None:
    """Validate an ``fp8_ds_mla`` ``kv_cache`` (the 656-byte V3.2 rows, :mod:`mla_sink.core.kv_layout`).

    Allowed: uint8 ``[N, 656]`` with the 656 bytes of a row contiguous (``stride(1) == 1``) and any row
    stride that is a multiple of 4 bytes; or paged ``[num_blocks, block_size, 656]`` with the rows of a
    block contiguous (``stride(2) == 1``, ``stride(1) == 656``) and any block stride that is a multiple of 4
    bytes (FlashMLA's tests allocate ``block_size + 1`` rows per block and slice: stride ``65 * 656``);
    ``N`` (``num_blocks * block_size``) >= 1 unless ``allow_empty_pool``; a data pointer that is a multiple
    of 4 bytes (real tensors; meta, fake and traced tensors: the view's byte offset into its storage, since
    storages are allocated aligned, so that a misaligned view fails while tracing, not at its first run).

    Raises:
        ValueError: naming ``kv_cache``, the value and what is allowed.
    """
    row = kv_layout.ROW_BYTES
    if kv_cache.dim() not in (2, 3) or kv_cache.shape[-1] != row:
        raise ValueError(f"'kv_cache' (fp8_ds_mla) must be uint8 [N, {row}] or [num_blocks, block_size, {row}] "
                         f"(got shape {concrete(kv_cache.shape)}){kv_layout.one_head_hint(kv_cache)}")
    if kv_layout.num_rows(kv_cache) < (0 if allow_empty_pool else 1):
        raise ValueError(f"'kv_cache' (fp8_ds_mla) must hold N >= 1 rows (got shape {concrete(kv_cache.shape)})")
    strides = tuple(kv_cache.stride())  # compared as they are (symbolic sizes install their guards)
    if kv_cache.shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(f"'kv_cache' (fp8_ds_mla) must have the {row} bytes of a row contiguous (stride(-1) == 1; "
                         f"got strides {concrete(strides)})")
    if kv_cache.dim() == 3 and kv_cache.shape[1] > 1 and strides[1] != row:
        raise ValueError(f"'kv_cache' (fp8_ds_mla) [num_blocks, block_size, {row}] must have the rows of a block "
                         f"contiguous (stride(1) == {row}; got strides {concrete(strides)})")
    if kv_cache.shape[0] > 1 and strides[0] % DS_MLA_ALIGN:
        what = "block" if kv_cache.dim() == 3 else "row"
        raise ValueError(f"'kv_cache' (fp8_ds_mla) must have a {what} stride that is a multiple of {DS_MLA_ALIGN} "
                         f"bytes (its float32 scales are read in place; got strides {concrete(strides)})")
    if _has_memory(kv_cache):
        if kv_cache.numel():
            check_ds_mla_pointer(kv_cache)
        return
    offset = kv_cache.storage_offset()
    if isinstance(offset, int) and offset * kv_cache.element_size() % DS_MLA_ALIGN:
        _misaligned_ds_mla(f"a view at byte offset {offset * kv_cache.element_size()} of its storage")


def require_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` as a tensor a kernel can read: dense and strided (:func:`mla_sink.core.kv_layout.check_dense`), not a
    lazily negated or conjugated view, not a zero tensor (``torch._efficientzerotensor``: no storage, which Triton's
    launch met with PyTorch's "invalid python storage" RuntimeError; a break test, forty-sixth session), not a
    ``torch.func`` transform's tensor (``vmap``'s: no storage to read; sixty-third session)."""
    kv_layout.check_dense(name, value)
    if is_functorch_wrapped_tensor(value):  # its storage raised NotImplementedError in the storage check (break test)
        raise ValueError(f"'{name}' is a torch.func transform's tensor (vmap, grad, jvp): the decode has no batching "
                         f"or autograd rule; call it once per batch element, outside the transform")
    if value.is_neg() or value.is_conj():
        raise ValueError(f"'{name}' must not be a lazily negated or conjugated view (resolve it first: "
                         "t.resolve_neg() / t.resolve_conj())")
    if value._is_zerotensor():
        raise ValueError(f"'{name}' must not be a zero tensor (torch._efficientzerotensor, which has no storage): "
                         f"pass torch.zeros(...)")
    return value


def check_topk_length(topk_length: Optional[torch.Tensor], T, device: torch.device, name: str = "topk_length",
                      like: str = "q") -> None:
    """Raises ValueError unless ``topk_length`` is None or a dense int32 ``[T]`` tensor on ``device`` (the device of
    ``like``: q for a call, indices for a DCP call's pre-collective check), ``T`` a call's tokens (a symbolic size
    under ``torch.compile(dynamic=True)`` is shown as the number it stands for). The message names ``name``, what
    was given and what is allowed."""
    if topk_length is None:
        return
    if not isinstance(topk_length, torch.Tensor):
        raise ValueError(f"'{name}' must be None or an int32 [T={shown(T)}] tensor on {device}, like {like} (got "
                         f"{type(topk_length).__name__})")
    require_tensor(name, topk_length)
    if topk_length.dtype != torch.int32 or topk_length.dim() != 1 or topk_length.shape[0] != T \
            or topk_length.device != device:
        raise ValueError(f"'{name}' must be int32 [T={shown(T)}] on {device}, like {like} (got {topk_length.dtype} "
                         f"shape {concrete(topk_length.shape)} on {topk_length.device})")


def check_storage(name: str, value: Optional[torch.Tensor]) -> None:
    """Raises ValueError for a tensor with data whose storage does not hold every element it reaches (one freed or
    shrunk by ``untyped_storage().resize_(0)`` was read: NaN, and the interpreter grew it back; a break test,
    forty-sixth session). By :func:`check_inputs`, on the first call of a signature: later calls of one signature
    only test for a freed storage's null pointer (:meth:`DecodeInputs.has_freed_storage`), and a storage shrunk
    between them is not re-checked (README, "The pipeline and the layout")."""
    if isinstance(value, torch.Tensor) and _has_memory(value) and value.numel():
        need = value.storage_offset() * value.element_size() + kv_layout.span_bytes(value)  # its last byte's end
        have = value.untyped_storage().nbytes()
        if have < need:
            raise ValueError(f"'{name}' reaches byte {need} of its storage, which holds {have} bytes (freed or shrunk, "
                             f"e.g. by untyped_storage().resize_(0)): pass a tensor whose storage holds its elements")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)`` bytes the tensor's elements can touch (strides >= 0; empty tensors: empty range)."""
    if t.numel() == 0:
        return 0, 0
    start = t.data_ptr()
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def _residue_span(t: torch.Tensor, pitch: int) -> Optional[int]:
    """Bytes ``E`` such that every byte of ``t`` lies at an offset from ``t.data_ptr()`` whose remainder
    modulo ``pitch`` is in ``[0, E)``, with ``E <= pitch``; ``None`` when no such ``E`` exists.

    The dimensions whose byte stride is a multiple of ``pitch`` move whole pitches (they do not change
    the remainder); the others span at most ``E = sum((size - 1) * stride) + element size`` bytes.
    """
    elt = t.element_size()
    span = elt + sum((size - 1) * stride * elt for size, stride in zip(t.shape, t.stride())
                     if size > 1 and (stride * elt) % pitch)
    return span if span <= pitch else None


def _disjoint_by_pitch(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some pitch proves that ``a`` and ``b`` touch no common byte.

    For each candidate pitch ``P`` (the byte strides of both tensors' dimensions of size > 1), both
    tensors' bytes are reduced modulo ``P`` to one interval each (:func:`_residue_span`); ``a``'s is
    ``[0, Ea)`` relative to its first byte and ``b``'s ``[c, c + Eb)`` with ``c = (b.data_ptr() -
    a.data_ptr()) mod P``. When the two intervals of the circle of length ``P`` do not meet
    (``Ea <= c`` and ``c + Eb <= P``), no address can be in both tensors. Example: ``q = b[..., :576]``
    and ``out = b[..., 576:]`` of one bf16 ``[T, H, 1088]`` buffer share the row pitch 2176 bytes and
    occupy bytes ``[0, 1152)`` and ``[1152, 2176)`` of every row. A proof never accepts an overlap; a
    layout no pitch separates is reported as overlapping (refused rather than risked).
    """
    pitches = {abs(st) * t.element_size() for t in (a, b) for st, sz in zip(t.stride(), t.shape) if sz > 1 and st}
    for pitch in sorted(pitches):
        ea, eb = _residue_span(a, pitch), _residue_span(b, pitch)
        if ea is None or eb is None:
            continue
        c = (b.data_ptr() - a.data_ptr()) % pitch
        if ea <= c and c + eb <= pitch:
            return True
    return False


def _memory_overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may touch a common byte: their byte ranges intersect and no common row pitch
    separates them (:func:`_disjoint_by_pitch`), so two views carved side by side from one workspace,
    or interleaved column blocks of one buffer, are not overlaps. Traced tensors (fake, meta, or under
    ``torch.compile``) have no memory to compare: False; the op's real implementation checks again
    with the real tensors."""
    fake = getattr(getattr(torch, "_subclasses", None), "FakeTensor", ())
    if (tracing() or isinstance(a, fake) or isinstance(b, fake) or a.device.type == "meta"
            or b.device.type == "meta" or a.device != b.device):
        return False
    try:
        a0, a1 = _byte_range(a)
        b0, b1 = _byte_range(b)
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. under tracing)
        return False
    if not (a0 != 0 and b0 != 0 and a0 < b1 and b0 < a1):
        return False
    return not _disjoint_by_pitch(a, b)


def overlaps_itself(t: torch.Tensor) -> bool:
    """True unless the strides prove every element has its own memory: the dimensions of size > 1,
    ordered by stride, each step past the whole extent of the previous one (a stride-0 broadcast or
    interleaved strides fail; such layouts are refused rather than written through)."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False


def check_sinks(sinks: Optional[torch.Tensor], num_heads: int, device: Optional[torch.device] = None,
                like: str = "q", contiguous: bool = False) -> None:
    """Validate ``sinks``: fp32, 1-D ``[H]``, on ``device`` (that of the tensor named ``like``); any stride (the
    runners read a contiguous copy of strided sinks: :func:`mla_sink.paths.prepare_runner`), or contiguous where
    ``contiguous`` (a raw kernel launcher's buffers, :func:`check_merge_buffers`).

    Raises:
        ValueError: wrong type, dtype, rank, length, layout (only with ``contiguous``) or device.
    """
    if sinks is None:
        return
    require_tensor("sinks", sinks)
    if sinks.dtype != torch.float32:
        raise ValueError(f"'sinks' must be float32 (got {sinks.dtype})")
    if sinks.dim() != 1:
        raise ValueError(f"'sinks' must be 1-D [num_heads] (got shape {concrete(sinks.shape)})")
    if sinks.shape[0] != num_heads:
        raise ValueError(f"'sinks' must have num_heads={shown(num_heads)} entries (got {shown(sinks.shape[0])})")
    if contiguous and not sinks.is_contiguous():
        raise ValueError(f"'sinks' must be contiguous (got stride {concrete(sinks.stride())})")
    if device is not None and sinks.device != device:
        raise ValueError(f"'sinks' must be on {device}, like {like} (got {sinks.device})")


#: dtypes of the fused DCP merge's partial outputs and output buffer (:func:`check_merge_buffers`).
MERGE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_merge_buffers(part_out, part_lse, sinks, out, lse) -> None:
    """Validate the tensors of the fused DCP merge (:func:`mla_sink.paths.triton.merge.combine_states_triton`)
    before its kernel runs: ``part_out`` ``[R, T, H, 512]`` fp32 / bf16 / fp16 with innermost stride 1,
    ``part_lse`` floating ``[R, T, H]``, ``sinks`` as :func:`check_sinks` (``[H]`` fp32, contiguous), ``out``
    ``[T, H, 512]`` fp32 / bf16 / fp16 with innermost stride 1, ``lse`` fp32 ``[T, H]``, all on ``part_out``'s
    device, a cpu or cuda one (other strides are free: the kernel takes them). The kernel writes ``out`` and ``lse``
    while it reads the parts and the sinks, tile by tile: ``out`` and ``lse`` may overlap neither themselves (a
    broadcast view) nor each other, ``part_out`` or ``sinks`` (a shifted view of the parts gave wrong values).

    Raises:
        ValueError: naming the argument, what it is and what is allowed.
    """
    require_tensor("part_out", part_out)
    if part_out.device.type not in ("cpu", "cuda"):
        raise ValueError(f"'part_out' must be on a cpu or cuda (CUDA/ROCm) device (got {part_out.device})")
    if part_out.dim() != 4 or part_out.shape[3] != D_V or (part_out.numel() and part_out.stride(3) != 1):
        raise ValueError(f"'part_out' must be [R, T, H, {D_V}] with innermost stride 1 (got shape "
                         f"{concrete(part_out.shape)}, strides {part_out.stride()})")
    R, T, H, _ = part_out.shape
    dev = part_out.device
    for name, t, shape, dtypes in (("part_lse", part_lse, (R, T, H), None), ("out", out, (T, H, D_V), MERGE_DTYPES),
                                   ("lse", lse, (T, H), (torch.float32,))):
        require_tensor(name, t)
        if tuple(t.shape) != shape:
            raise ValueError(f"'{name}' must be {list(shape)} for part_out {list(part_out.shape)} (got "
                             f"{list(t.shape)})")
        if (dtypes is None and not t.is_floating_point()) or (dtypes is not None and t.dtype not in dtypes):
            allowed = "a floating dtype" if dtypes is None else " / ".join(map(str, dtypes))
            raise ValueError(f"'{name}' must be {allowed} (got {t.dtype})")
        if t.device != dev:
            raise ValueError(f"'{name}' must be on {dev}, like part_out (got {t.device})")
    if part_out.dtype not in MERGE_DTYPES:
        raise ValueError(f"'part_out' must be {' / '.join(map(str, MERGE_DTYPES))} (got {part_out.dtype})")
    if out.numel() and out.stride(2) != 1:
        raise ValueError(f"'out' must have innermost stride 1 (got strides {concrete(out.stride())})")
    check_sinks(sinks, H, dev, like="part_out", contiguous=True)
    for name, t in (("out", out), ("lse", lse)):
        if overlaps_itself(t):
            raise ValueError(f"'{name}' must not overlap itself (got shape {concrete(t.shape)}, strides {t.stride()}): "
                             "every token and head is written once")
    for name, t, other_name, other in (("out", out, "lse", lse), ("out", out, "part_out", part_out),
                                       ("out", out, "sinks", sinks), ("lse", lse, "part_out", part_out),
                                       ("lse", lse, "sinks", sinks)):
        if other is not None and _memory_overlaps(t, other):
            raise ValueError(f"'{name}' must not overlap '{other_name}': the merge writes it while it reads "
                             f"'{other_name}'")


FP32_TINY = 2.0 ** -126  #: smallest normal fp32
FP32_SCALE_MAX = 2.0 ** 126  #: largest ``sm_scale`` / positive ``logit_cap`` the kernels represent (see below)

_SCALAR_RANGE_WHY = "the kernels take it as fp32 and multiply it by log2(e)"


def _in_scalar_range(value: float) -> bool:
    return FP32_TINY <= value <= FP32_SCALE_MAX


def _real_type(value: object) -> bool:
    """Whether ``value``'s type is one a scalar option takes: a ``numbers.Real`` (Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _as_real(value: object) -> Optional[float]:
    """``value`` as a Python float when it is a finite real number (Python or numpy scalar; not a bool or
    a string), else None: huge ints (no fp32 nor fp64 value) and numpy half floats compare as Python floats."""
    if not _real_type(value):
        return None
    if tracing():
        return value  # possibly symbolic (dynamic=True): its value is checked where the operator runs
    try:
        f = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return f if math.isfinite(f) else None


def _got(value: object) -> str:
    """``brief(value)`` for a scalar option's error, with its type where that, not its value, is refused: a
    ``decimal.Decimal('0.04')`` (not a ``numbers.Real``), a string, a bool or a tensor read as "must be a finite
    float" alone, as if the value were the trouble (a break test, sixty-ninth session)."""
    if _real_type(value):
        return brief(value)
    kind = type(value).__qualname__ if type(value).__module__ == "builtins" else \
        f"{type(value).__module__}.{type(value).__qualname__}"
    return f"{brief(value)}, a {kind}: pass a Python or numpy int or float"


def _symbolic(value: object) -> bool:
    """A scalar torch.compile traces symbolically (``dynamic=True``): checked where the call runs, by the
    operator's real implementation."""
    return isinstance(value, (torch.SymFloat, torch.SymInt))


def check_sm_scale(sm_scale: float) -> None:
    """Raises ValueError unless ``sm_scale`` is a real number (Python or numpy scalar) in
    ``[2^-126, 2^126]`` (about ``[1.18e-38, 8.5e37]``).

    Why these bounds: every kernel takes ``sm_scale`` as an fp32 argument and folds ``log2(e)`` into it
    (its softmax runs in base 2): ``sm_scale * log2(e)`` must be a finite normal fp32. Above
    ``fp32 max / log2(e)`` (about 2.36e38) it overflows to ``inf`` and the whole output is NaN (measured
    with 3e38 on the ``triton`` path); below 2^-126 it is a subnormal fp32, which loses significant bits
    and is 0 wherever a kernel is compiled to flush denormals. ``[2^-126, 2^126]`` is the power-of-two
    range where the value, its reciprocal and its product with ``log2(e)`` are all finite normal fp32
    numbers. (Scores themselves can still overflow fp32 when ``|q.k|`` or ``|sm_scale * q.k|`` exceeds
    3.4e38, e.g. ``sm_scale = 2^126`` with ordinary data or KV values near the bf16 limit: the kernels then
    give NaN for that token and head where the float64 reference stays finite or gives ``lse = +inf``;
    values are not inspected.)
    """
    if _symbolic(sm_scale):
        return
    value = _as_real(sm_scale)
    if value is None or (not tracing() and not _in_scalar_range(value)):
        raise ValueError(f"'sm_scale' must be a finite float in [2^-126, 2^126] "
                         f"({_SCALAR_RANGE_WHY}; got {_got(sm_scale)})")


def check_logit_cap(logit_cap: float) -> float:
    """``logit_cap`` as a Python float; raises ValueError unless it is a real number (Python or numpy
    scalar; strings and bools refused) that is ``<= 0`` (no cap) or in ``[2^-126, 2^126]``.

    Why these bounds: the kernels take the cap as fp32, divide the scaled score by it and multiply
    ``cap * tanh(s / cap)`` by ``log2(e)``: a cap above the largest fp32 becomes ``inf`` there
    (``inf * 0`` = NaN output, measured with 3.5e38 on the ``triton`` path), one above
    ``fp32 max / log2(e)`` overflows in the product, one below the smallest normal fp32 is subnormal.
    The range is that of :func:`check_sm_scale`.
    """
    if _symbolic(logit_cap):
        return logit_cap
    value = _as_real(logit_cap)
    if value is None:
        raise ValueError(f"'logit_cap' must be a finite float (got {_got(logit_cap)})")
    if tracing():
        return value
    # positive as given: a Fraction or numpy longdouble below fp64's range is positive but its float is 0.0, which
    # read as "no cap" (a break test, sixty-third session)
    if (value > 0 or logit_cap > 0) and not _in_scalar_range(value):
        raise ValueError(f"'logit_cap' must be <= 0 (no cap) or in [2^-126, 2^126] ({_SCALAR_RANGE_WHY}; "
                         f"got {brief(logit_cap)})")
    return float(value)


def check_return_lse(return_lse: bool) -> None:
    """Raises ValueError unless ``return_lse`` is a bool."""
    if not isinstance(return_lse, bool):
        raise ValueError(f"'return_lse' must be a bool (got {return_lse!r})")


def call_scalars(sm_scale: float, return_lse: bool, logit_cap: float) -> tuple[float, float]:
    """Check the scalar options of a call under the names the caller used; returns ``(sm_scale, logit_cap)``
    as Python floats (numpy scalars accepted).

    Raises:
        ValueError: ``sm_scale`` not a real in ``[2^-126, 2^126]`` (:func:`check_sm_scale`), ``return_lse``
            not a bool, ``logit_cap`` not a real ``<= 0`` or in ``[2^-126, 2^126]`` (:func:`check_logit_cap`;
            strings are refused, not parsed).
    """
    check_sm_scale(sm_scale)
    check_return_lse(return_lse)
    keep = _symbolic(sm_scale) or tracing()
    return (sm_scale if keep else float(sm_scale)), check_logit_cap(logit_cap)


def grad_inputs(q, kv_cache, sinks, q_scale, kv_scale) -> list:
    """The names of the call's differentiable inputs that require grad (``None`` and non-tensors do not): what
    :func:`no_backward_error` names, for :func:`check_inputs`, the traced ``out=`` call (:mod:`mla_sink.api`) and the
    operator's autograd registration (:mod:`mla_sink.ops`)."""
    return [name for name, t in (("q", q), ("kv_cache", kv_cache), ("sinks", sinks), ("q_scale", q_scale),
                                 ("kv_scale", kv_scale)) if getattr(t, "requires_grad", False)]


def no_backward_error(names) -> ValueError:
    """The refusal of a call whose tensors ``names`` require grad (the eager check of :func:`check_inputs`, and the
    operators' autograd registration, :mod:`mla_sink.ops`): the decode has no backward."""
    return ValueError(f"{', '.join(repr(n) for n in names)} must not require grad (got requires_grad=True): "
                      "mla-sink is a decode (inference) op with no backward; call it under torch.no_grad() or "
                      "torch.inference_mode(), or pass .detach()")


def check_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    *,
    topk_length: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    kv_scale: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    check_scales: bool = True,
    allow_empty_pool: bool = False,
    allow_meta: bool = True,
) -> None:
    """Validate the tensors of one call (shapes, dtypes, layouts, devices; never values).

    Args:
        q: ``[T, H, 576]`` bf16/fp16/fp8_e4m3/fp8_e4m3fnuz; innermost stride 1.
        kv_cache: ``[N, 576]`` (page size 1), innermost stride 1; N >= 1. Or the 656-byte V3.2 layout
            (``fp8_ds_mla``): uint8 ``[N, 656]`` or ``[num_blocks, block_size, 656]``
            (:func:`check_ds_mla_cache`), with ``kv_scale`` None and q bf16/fp16.
        indices: int32 ``[T, topk]``, topk >= 1.
        sinks: optional fp32 ``[H]``, any stride.
        sm_scale: optional float in ``[2^-126, 2^126]`` (:func:`check_sm_scale`).
        topk_length: optional int32 ``[T]``.
        q_scale / kv_scale: fp32 with one element; required exactly when q / kv_cache is fp8 (a per-tensor
            format; ``fp8_ds_mla`` carries its scales in the rows and takes no ``kv_scale``).
        out: optional ``[T, H, 512]`` in the out dtype (q's dtype; bf16 for fp8 q), innermost stride 1.
        check_scales: False skips the fp8 scale checks (for :func:`mla_sink.core.describe.describe`,
            which is given no scales).
        allow_empty_pool: accept ``N = 0`` (a DCP rank whose shard holds no rows).
        allow_meta: accept tensors on the ``meta`` device (no data: shape inference, e.g. the
            operators' fake implementations, which return meta outputs of the right shapes). The entry points
            accept them and send tensors without data to shape inference before any runner is prepared (the
            operator; a DCP call's :func:`mla_sink.api._dcp_shapes`); :func:`mla_sink.core.describe.describe`,
            whose spec precedes a launch, passes False.

    Devices: ``cpu`` and ``cuda`` (CUDA or ROCm), and ``meta`` where ``allow_meta``; every tensor on
    q's device.

    Raises:
        ValueError: naming the argument, the value and what is allowed.
    """
    require_tensor("q", q)
    require_tensor("kv_cache", kv_cache)
    require_tensor("indices", indices)
    if q.dtype not in DTYPE_KEYS:
        raise ValueError(f"'q' dtype must be one of {sorted(DTYPE_KEYS.values())} (got {q.dtype})")
    kv_key = kv_dtype_key(kv_cache)  # ValueError for other dtypes and uint8 rows of unknown size
    if q.dim() != 3 or q.shape[2] != D_QK or q.shape[1] < 1:
        raise ValueError(f"'q' must be [T, H, {D_QK}] with H >= 1 (got shape {concrete(q.shape)})")
    if q.stride(2) != 1:
        raise ValueError(f"'q' must have innermost stride 1 (got strides {concrete(q.stride())})")
    if kv_key in DS_MLA_KEYS:
        check_ds_mla_cache(kv_cache, allow_empty_pool=allow_empty_pool)
    elif kv_cache.dim() != 2 or kv_cache.shape[1] != D_QK or kv_cache.shape[0] < (0 if allow_empty_pool else 1):
        hint = (" (a contiguous paged cache [num_blocks, block_size, 576] can be passed as kv_cache.view(-1, 576), "
                "with ids block * block_size + offset)") if kv_cache.dim() > 2 else ""
        if kv_cache.dim() >= 2 and kv_cache.shape[-1] == kv_layout.ROW_BYTES:
            hint = (f" ({kv_layout.ROW_BYTES}-byte rows are the {kv_layout.LAYOUT} layout: pass them as torch.uint8, "
                    f"e.g. kv_cache.view(torch.uint8), not {kv_cache.dtype})")
        raise ValueError(f"'kv_cache' must be [N, {D_QK}] with N >= 1 (got shape {concrete(kv_cache.shape)}){hint}")
    elif kv_cache.stride(1) != 1:
        raise ValueError(f"'kv_cache' must have innermost stride 1 (got strides {concrete(kv_cache.stride())})")
    if indices.dtype != torch.int32:
        raise ValueError(f"'indices' must be int32 (got {indices.dtype})")
    if indices.dim() != 2 or indices.shape[1] < 1:
        raise ValueError(f"'indices' must be 2-D [T, topk] with topk >= 1 (got shape {concrete(indices.shape)})")
    if indices.shape[1] > TOPK_MAX:
        raise ValueError(f"'indices' must be [T, topk] with topk <= {TOPK_MAX} ({TOPK_WHY}; got shape "
                         f"{concrete(indices.shape)})")
    T, H = q.shape[0], q.shape[1]
    if indices.shape[0] != T:
        raise ValueError(f"'indices' must have T={shown(T)} rows like q (got {shown(indices.shape[0])})")
    pair = (_dt(q), kv_key)
    if pair not in allowed_dtype_pairs():
        raise ValueError(pair_error(*pair, "(q dtype, kv_cache dtype)"))
    device = q.device
    if device.type not in ("cpu", "cuda") and not (allow_meta and device.type == "meta"):
        traced = (" (meta tensors serve shape inference: torch.ops.mla_sink.sparse_mla_decode)"
                  if device.type == "meta" else "")
        raise ValueError(f"'q' must be on a cpu or cuda (CUDA/ROCm) device{traced} (got {device})")
    grads = grad_inputs(q, kv_cache, sinks, q_scale, kv_scale)
    if torch.is_grad_enabled() and grads:
        raise no_backward_error(grads)
    for name, t in (("kv_cache", kv_cache), ("indices", indices)):
        if t.device != device:
            raise ValueError(f"'{name}' must be on {device}, like q (got {t.device})")
    check_sinks(sinks, H, device)
    if sm_scale is not None:
        check_sm_scale(sm_scale)
    check_topk_length(topk_length, T, device)
    if check_scales and kv_key in DS_MLA_KEYS and kv_scale is not None:
        raise ValueError(f"'kv_scale' must be None with a {kv_key} kv_cache: its scales are in the rows (four float32 "
                         "per row, one per 128 latent columns; got a tensor)")
    for name, scale, tensor in (("q_scale", q_scale, q), ("kv_scale", kv_scale, kv_cache)):
        if not check_scales:
            break
        is_fp8 = _dt(tensor) in FP8_KEYS
        owner = "q" if name == "q_scale" else "kv_cache"
        if is_fp8 and scale is None:
            raise ValueError(f"'{name}' is required when {owner} is fp8 ({_dt(tensor)}): "
                             f"pass a float32 tensor of shape [1] or []")
        if not is_fp8 and scale is not None:
            raise ValueError(f"'{name}' must be None when {owner} is {_dt(tensor)} "
                             f"(scales apply to fp8 only; got a tensor)")
        if scale is not None:
            require_tensor(name, scale)
            if scale.dtype != torch.float32 or tuple(scale.shape) not in ((1,), ()):
                raise ValueError(f"'{name}' must be float32 of shape [1] or [] "
                                 f"(got {scale.dtype} shape {concrete(scale.shape)})")
            if scale.device != device:
                raise ValueError(f"'{name}' must be on {device}, like q (got {scale.device})")
    if out is not None:
        require_tensor("out", out)
        want = out_dtype_for(_dt(q))
        if tuple(out.shape) != (T, H, D_V) or out.dtype != want:
            raise ValueError(
                f"'out' must be {want} [T={shown(T)}, H={shown(H)}, {D_V}] (got {out.dtype} shape "
                f"{concrete(out.shape)})"
            )
        if out.stride(2) != 1 or out.device != device:
            raise ValueError(f"'out' must be on {device} with innermost stride 1 "
                             f"(got {out.device}, strides {concrete(out.stride())})")
        if overlaps_itself(out):
            raise ValueError(f"'out' must not overlap itself: each [token, head] row needs its own memory (got strides "
                             f"{concrete(out.stride())} for shape {concrete(out.shape)}, e.g. from expand())")
        if out.requires_grad:
            raise ValueError("'out' must not require grad (the kernel writes it in place; pass a plain buffer)")
        check_out_writable(out)
        _check_out_shares_nothing(out, zip(_READ_BY_KERNELS, (q, kv_cache, indices, sinks, topk_length, q_scale,
                                                              kv_scale)))
    check_data(q, zip(_READ_BY_KERNELS + ("out",), (q, kv_cache, indices, sinks, topk_length, q_scale, kv_scale, out)))


def check_data(q: torch.Tensor, named) -> None:
    """Raises ValueError unless every tensor of ``named`` (``(argument name, value)`` pairs, q's among them; values
    that are not tensors are left to the caller's own checks) is of q's kind (:func:`check_kinds_like_q`; where q
    holds data, since a kernel will read and write every tensor of the call) and has a storage that holds every
    element it reaches (:func:`check_storage`). The caller has passed each through :func:`require_tensor` (a zero
    tensor's storage check passes). For a call (:func:`check_inputs`) and a DCP call's checks before any collective
    (:func:`mla_sink.core.dcp.dcp_sparse_mla_decode`, whose own index arithmetic read a freed ``topk_length`` or
    ``indices`` and crashed the process: a break test, sixty-second session)."""
    named = tuple(named)
    if _has_memory(q):
        check_kinds_like_q(q, named)
    for name, t in named:
        check_storage(name, t)


def check_out_writable(out: torch.Tensor, name: str = "out") -> None:
    """Raises ValueError when ``out`` is an inference tensor and the call runs outside ``torch.inference_mode()``,
    where PyTorch forbids updating one in place (the CPU kernel's output copy raised PyTorch's ``RuntimeError`` after
    the kernel had run, and a GPU kernel wrote it where torch's own ops refuse: a break test, forty-first session).
    Per call (:func:`check_out_overlaps`, :func:`mla_sink.core.dcp.dcp_sparse_mla_decode`): the mode is not part of a
    call's signature. ``name``: the argument as the caller names it (``'inputs.out'`` in the DCP merge)."""
    if out.is_inference() and not torch.is_inference_mode_enabled() and not tracing():
        raise ValueError(f"'{name}' is an inference tensor (made under torch.inference_mode()) and the call runs "
                         f"outside inference mode, where PyTorch forbids writing into one (got {name}.is_inference()="
                         f"True, torch.is_inference_mode_enabled()=False): call under torch.inference_mode(), or "
                         f"allocate '{name}' outside it")


def check_out_overlaps(x) -> None:
    """The per-call part of the ``out`` checks (data pointers and the inference mode are not part of a call's
    signature): ``x.out`` must be writable here (:func:`check_out_writable`) and share no memory with an input.

    Raises:
        ValueError: ``out`` is an inference tensor outside inference mode, or shares memory with q, kv_cache,
            indices, sinks, topk_length or a scale.
    """
    check_out_writable(x.out)
    _check_out_shares_nothing(x.out, ((name, getattr(x, name)) for name in _READ_BY_KERNELS))


#: The tensors of a call that a kernel reads, by their argument names: ``out`` may share memory with none of them.
_READ_BY_KERNELS = ("q", "kv_cache", "indices", "sinks", "topk_length", "q_scale", "kv_scale")


def _check_out_shares_nothing(out: torch.Tensor, named) -> None:
    """Raises ValueError when ``out`` shares memory with a tensor of ``named`` (``(argument name, tensor or None)``
    pairs), naming it."""
    for name, t in named:
        if isinstance(t, torch.Tensor) and _memory_overlaps(out, t):
            raise ValueError(f"'out' must not share memory with '{name}' (the kernel would read what it writes)")
