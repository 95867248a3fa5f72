"""PyTorch custom operators (``torch.library``) so the decode composes with ``torch.compile`` and
CUDA graphs: ``torch.ops.mla_sink.sparse_mla_decode`` (out-of-place, returns ``(out, lse)``) and
``torch.ops.mla_sink.sparse_mla_decode_out`` (writes a caller-provided ``out``, returns ``lse``).

Both select the path on the device the tensors live on (or take a forced ``path``), and both have
fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces :func:`mla_sink.api.run`
without a graph break. Both validate their inputs (:func:`mla_sink.core.validate.check_inputs`) in
the real and in the fake implementation, so a malformed call fails with a ``ValueError`` when traced
and when run; a forced ``path`` is checked when traced too (its name, and on a real device whether it serves
the call there: ``NoKernelError``). Neither has a backward. The out-of-place operator refuses an input that requires
grad in grad mode with the eager call's ``ValueError`` (its autograd registration); PyTorch takes no autograd
formula for the mutating one, so :func:`mla_sink.api.sparse_mla_decode` and :func:`mla_sink.api.run` refuse such a
call with ``out=`` themselves (eager and traced), while ``sparse_mla_decode_out`` called directly returns an LSE that
requires grad, whose ``backward()`` fails with PyTorch's message. ``lse`` is ``[T, H]`` when the call needs one
(sinks, or ``return_lse``), else an empty ``[T, 0]`` tensor (the Python API turns that into ``None``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from mla_sink.core.dtypes import DTYPE_KEYS, out_dtype_for
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.records import D_V
from mla_sink.core.validate import check_inputs, check_logit_cap

#: How the operators say "no forced path" (their ``path`` is a str): the empty string.
OP_UNSET_PATH = "''"


def _plan_and_launch(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out, return_lse,
                     logit_cap, path):
    """The operators' real implementation: the library's one execute (validated there)."""
    from mla_sink.api import execute
    from mla_sink.core.select import check_path
    from mla_sink.core.validate import call_scalars

    if path:  # the operators' "no forced path" is '', which the message must say (not None)
        check_path(path, unset=OP_UNSET_PATH)
    sm_scale, logit_cap = call_scalars(sm_scale, return_lse, logit_cap)
    x = DecodeInputs(q, kv_cache, indices, sm_scale, sinks, topk_length, q_scale, kv_scale, out, logit_cap)
    res_out, lse = execute(x, spec=None, need_lse=return_lse, platform=None, path=path or None)
    if lse is None:
        lse = q.new_empty((q.shape[0], 0), dtype=torch.float32)
    return res_out, lse


def _check_traced_path(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, return_lse, logit_cap,
                       path) -> None:
    """A forced ``path`` in the fake implementations: its name always, and whether it serves the call on the
    tensors' device (not on ``meta``, which names none, on a GPU this machine lacks, nor with symbolic sizes), so
    that ``torch.compile`` and ``torch.export`` refuse such a call while tracing, as the eager call does, instead of
    when the graph first runs (a break test, thirty-third session). Tracing only: the real implementation plans the
    same way (:func:`mla_sink.api.execute`).

    Raises:
        ValueError: ``path`` is not a path of the rule table. NoKernelError: it does not serve this call here.
    """
    from mla_sink.core.select import check_path

    check_path(path or None, unset=OP_UNSET_PATH)
    sizes = (q.shape[0], q.shape[1], indices.shape[1], *kv_cache.shape, *kv_cache.stride())  # the pool's too: the
    # plan reads its span (CallSpec.kv_cache_bytes), which a symbolic N leaves open
    device = q.device
    absent = device.type == "cuda" and not (torch.cuda.is_available()
                                            and (device.index or 0) < torch.cuda.device_count())
    if not path or device.type == "meta" or absent or not all(isinstance(n, int) for n in sizes):
        return  # no device here to plan for (meta, or a GPU target traced on a machine without it: torch.export),
        # or symbolic sizes (dynamic shapes): the run plans
    from mla_sink.core.describe import spec_of
    from mla_sink.core.plan import build_plan
    from mla_sink.core.platform import detect_platform

    x = DecodeInputs(q, kv_cache, indices, sm_scale, sinks, topk_length, q_scale, kv_scale, None, logit_cap)
    build_plan(spec_of(x, need_lse=return_lse or sinks is not None), detect_platform(q.device), path=path)


def _lse_shape(q: Tensor, sinks: Optional[Tensor], return_lse: bool) -> tuple[int, int]:
    return (q.shape[0], q.shape[1] if (sinks is not None or return_lse) else 0)


@torch.library.custom_op("mla_sink::sparse_mla_decode", mutates_args=())
def sparse_mla_decode_op(
    q: Tensor, kv_cache: Tensor, indices: Tensor, sinks: Optional[Tensor], sm_scale: float,
    topk_length: Optional[Tensor], q_scale: Optional[Tensor], kv_scale: Optional[Tensor],
    return_lse: bool, logit_cap: float, path: str,
) -> tuple[Tensor, Tensor]:
    """Out-of-place sparse MLA decode with sinks as a PyTorch operator.

    ``out = sum_j exp(s_j) v_j / (exp(lse) + exp(sink))``, ``s_j = sm_scale * q.k_j`` over the valid
    ids of each row, ``lse = log(sum_j exp(s_j))`` (natural log, sink excluded); semantics of
    :mod:`mla_sink.core.reference`.

    Every argument is positional in the schema and has no default (``None`` for an absent tensor); each is
    as in :func:`mla_sink.sparse_mla_decode`.

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 / ``float8_e4m3fn`` (``fp8_e4m3``) / ``float8_e4m3fnuz``
            (``fp8_e4m3fnuz``), innermost stride 1.
        kv_cache: ``[N, 576]`` (q's dtype, or an fp8 format with a half q), or uint8 ``[N, 656]`` /
            ``[num_blocks, block_size, 656]`` (the ``fp8_ds_mla`` layout, with bf16 / fp16 q).
        indices: int32 ``[T, topk]`` global row ids (``-1`` / ids outside ``[0, N)`` skipped, anywhere).
        sinks: fp32 ``[H]`` natural-log sink logits (not scaled by ``sm_scale``), or None.
        sm_scale: multiplies ``q.k``; a float in ``[2^-126, 2^126]`` (the schema's ``float``: pass
            ``576 ** -0.5`` for the Python API's default).
        topk_length: int32 ``[T]`` (only the first ``topk_length[t]`` ids of row t are used) or None.
        q_scale, kv_scale: fp32 ``[1]`` or ``[]`` per-tensor dequantisation scales, required exactly for fp8 q /
            fp8 KV (``kv_scale`` None for ``fp8_ds_mla``), else None.
        return_lse: return ``lse [T, H]`` even without sinks.
        logit_cap: ``> 0`` soft-caps the scaled scores (``logit_cap * tanh(s / logit_cap)``, then in
            ``[2^-126, 2^126]``); ``0.0`` (any finite ``<= 0``) = no cap.
        path: ``''`` = the rule table's choice for the tensors' device, else a forced path name.

    Returns:
        ``(out, lse)``: ``out`` ``[T, H, 512]`` in q's dtype (bf16 for fp8 q); ``lse`` fp32 ``[T, H]`` (natural
        log, sink excluded, ``-inf`` on rows with no valid id), or an empty ``[T, 0]`` when neither sinks nor
        ``return_lse`` ask for it.

    Raises:
        ValueError: malformed input (see :func:`mla_sink.core.validate.check_inputs`; ``sm_scale`` /
            ``logit_cap`` out of range), an unknown ``path``, or an input that requires grad in grad mode (the
            autograd registration refuses it: no backward), at trace and at run time.
        NoKernelError: no path serves the call on this device (or not the forced ``path``); while tracing, for
            a forced ``path`` on a device of this machine.
    """
    out, lse = _plan_and_launch(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, None,
                                return_lse, logit_cap, path)
    return out, lse


@sparse_mla_decode_op.register_fake
def _(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, return_lse,
      logit_cap, path):
    check_logit_cap(logit_cap)
    check_inputs(q, kv_cache, indices, sinks, sm_scale, topk_length=topk_length, q_scale=q_scale, kv_scale=kv_scale)
    _check_traced_path(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, return_lse, logit_cap,
                       path)
    out = q.new_empty((q.shape[0], q.shape[1], D_V), dtype=out_dtype_for(DTYPE_KEYS[q.dtype]))
    return out, q.new_empty(_lse_shape(q, sinks, return_lse), dtype=torch.float32)


@torch.library.custom_op("mla_sink::sparse_mla_decode_out", mutates_args=("out",))
def sparse_mla_decode_out_op(
    q: Tensor, kv_cache: Tensor, indices: Tensor, sinks: Optional[Tensor], sm_scale: float,
    topk_length: Optional[Tensor], q_scale: Optional[Tensor], kv_scale: Optional[Tensor], out: Tensor,
    return_lse: bool, logit_cap: float, path: str,
) -> Tensor:
    """In-place sparse MLA decode into a caller-provided ``out``.

    Schema order: ``q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out, return_lse,
    logit_cap, path``, every argument given.

    Args:
        out: ``[T, H, 512]`` buffer in the out dtype (q's dtype; bf16 for fp8 q), innermost stride 1, not
            overlapping itself, sharing no memory with an input, not requiring grad; written in place. Other
            arguments as :func:`sparse_mla_decode_op`.

    Returns:
        ``lse`` fp32 ``[T, H]`` (natural log, sink excluded) or ``[T, 0]``, as :func:`sparse_mla_decode_op`.
        Called directly with an input that requires grad in grad mode, it is not refused (PyTorch takes no
        autograd formula for a mutating operator): the LSE then requires grad and its ``backward()`` fails
        with PyTorch's message (:func:`mla_sink.sparse_mla_decode` and :func:`mla_sink.run` with ``out=``
        refuse such a call themselves).

    Raises:
        ValueError: malformed input or ``out``, an unknown ``path``. NoKernelError: no path serves the call.
    """
    res, lse = _plan_and_launch(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out,
                                return_lse, logit_cap, path)
    if res.data_ptr() != out.data_ptr():
        out.copy_(res)
    return lse


@sparse_mla_decode_out_op.register_fake
def _(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, out, return_lse,
      logit_cap, path):
    check_logit_cap(logit_cap)
    check_inputs(q, kv_cache, indices, sinks, sm_scale, topk_length=topk_length, q_scale=q_scale, kv_scale=kv_scale,
                 out=out)
    _check_traced_path(q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, return_lse, logit_cap,
                       path)
    return q.new_empty(_lse_shape(q, sinks, return_lse), dtype=torch.float32)


#: Positions of ``q, kv_cache, sinks, q_scale, kv_scale`` (the differentiable inputs) in the operator's schema
#: (``q, kv_cache, indices, sinks, sm_scale, topk_length, q_scale, kv_scale, ...``).
_GRAD_POSITIONS = (0, 1, 3, 6, 7)


def _refuse_grad(ctx, inputs, output) -> None:
    """The out-of-place operator's autograd ``setup_context``, which PyTorch calls only when an input requires grad
    in grad mode: the eager call's refusal (:func:`mla_sink.core.validate.no_backward_error`), at the forward and
    while ``torch.compile`` traces it, instead of an output that requires grad and fails at ``backward()`` with
    PyTorch's generic message (a break test, thirty-third session).

    Raises:
        ValueError: naming the inputs that require grad.
    """
    from mla_sink.core.validate import grad_inputs, no_backward_error

    raise no_backward_error(grad_inputs(*(inputs[i] for i in _GRAD_POSITIONS)) or ["an input"])


def _no_backward(ctx, *grads):
    """Never reached: :func:`_refuse_grad` refuses every forward that would record a backward."""
    raise RuntimeError("mla_sink's decode operators have no backward")


# the out-of-place operator only: PyTorch takes no autograd formula for a mutating one (``sparse_mla_decode_out``)
torch.library.register_autograd("mla_sink::sparse_mla_decode", _no_backward, setup_context=_refuse_grad)


def _document(op_def: Any, packet: Any) -> None:
    """Give an operator the docstring of its Python definition where ``help()`` and ``inspect.getdoc`` look: the
    ``CustomOpDef`` (whose class text they showed) and the ``torch.ops.mla_sink`` packet (which had none)."""
    op_def.__doc__ = packet.__doc__ = op_def._init_fn.__doc__


_document(sparse_mla_decode_op, torch.ops.mla_sink.sparse_mla_decode)
_document(sparse_mla_decode_out_op, torch.ops.mla_sink.sparse_mla_decode_out)
