"""The tensors of one call, bundled as an immutable record that every path's launcher takes.

A ``typing.NamedTuple`` rather than an attrs class: it is immutable too, and ``torch.compile``
traces its construction (a frozen attrs ``__init__`` goes through ``object.__setattr__``, which
Dynamo cannot trace), so ``run()`` compiles with ``fullgraph=True``.
"""

from __future__ import annotations

from typing import Optional

from typing import NamedTuple

import torch

from mla_sink.core.kv_layout import num_rows


class DecodeInputs(NamedTuple):
    """Tensors and scalars of one sparse MLA decode call (validated by :mod:`mla_sink.core.validate`).

    Building one checks nothing: :func:`mla_sink.run` checks the scalars (``ValueError``) and the call the
    tensors. The positional order is the fields' order below: ``sm_scale`` comes before ``sinks`` here, after it
    in :func:`mla_sink.sparse_mla_decode` - pass them by name.

    Attributes:
        q: ``[T, H, 576]`` bf16 / fp16 / fp8 (``float8_e4m3fn``, ``float8_e4m3fnuz``; any token and head strides;
            innermost stride 1).
        kv_cache: ``[N, 576]`` one shared KV head, page size 1; value = first 512 columns; or the
            656-byte ``fp8_ds_mla`` rows, uint8 ``[N, 656]`` or ``[num_blocks, block_size, 656]``
            (:mod:`mla_sink.core.kv_layout`).
        indices: int32 ``[T, topk]`` global row ids; ``-1`` and ids outside ``[0, N)`` = skip, anywhere.
        sm_scale: multiplies ``q.k`` before the natural-exp softmax, a real in ``[2^-126, 2^126]``; ``None`` (the
            default) means ``576 ** -0.5`` (:func:`mla_sink.run` fills it in).
        sinks: optional fp32 ``[H]`` natural-log sink logits (not scaled by ``sm_scale``).
        topk_length: optional int32 ``[T]``; only the first ``topk_length[t]`` ids of row t are used.
        q_scale: fp32 ``[1]`` or ``[]`` dequantisation scale of fp8 q (value = stored * scale), else ``None``.
        kv_scale: fp32 ``[1]`` or ``[]`` dequantisation scale of fp8 KV, else ``None`` (``None`` for ``fp8_ds_mla``).
        out: optional caller-provided ``[T, H, 512]`` output buffer (q's dtype; bf16 for fp8 q).
        logit_cap: ``> 0`` soft-caps scaled scores (``logit_cap * tanh(s / logit_cap)``, then in
            ``[2^-126, 2^126]``); a finite ``<= 0`` disables.
    """

    q: torch.Tensor
    kv_cache: torch.Tensor
    indices: torch.Tensor
    sm_scale: Optional[float] = None
    sinks: Optional[torch.Tensor] = None
    topk_length: Optional[torch.Tensor] = None
    q_scale: Optional[torch.Tensor] = None
    kv_scale: Optional[torch.Tensor] = None
    out: Optional[torch.Tensor] = None
    logit_cap: float = 0.0

    def signature(self) -> tuple:
        """What a prepared runner depends on: every tensor's type, dtype, shape, strides, device, ``requires_grad``,
        negative bit and layout (not its data or pointer), and ``logit_cap``. Calls of one signature share a runner,
        which reads ``sm_scale`` and the tensors per call.

        Raises:
            AttributeError, TypeError: a field that is not a tensor where one is due (the caller's full checks
                name it).
        """
        return (_tensor_meta(self.q), _tensor_meta(self.kv_cache), _tensor_meta(self.indices), _tensor_meta(self.sinks),
                _tensor_meta(self.topk_length), _tensor_meta(self.q_scale), _tensor_meta(self.kv_scale),
                _tensor_meta(self.out), self.logit_cap)

    def has_freed_storage(self) -> bool:
        """Whether a tensor with elements has no memory: its storage's data pointer is null, as
        ``untyped_storage().resize_(0)`` leaves it (the storage's, not the tensor's: a view at an offset has the
        offset as its own pointer, a second break test). A prepared signature's later calls test this (about 0.15 us
        a tensor), since their tensors may be new ones of the same metadata; a freed tensor then takes a first call's
        checks, which name it, where it had read from address 0 (a break test, sixty-third session). True too for a
        tensor whose storage cannot be read (``torch.func.vmap``'s), which those checks refuse. For real tensors only
        (a FakeTensor warns): the signature keeps their type."""
        try:
            for t in (self.q, self.kv_cache, self.indices, self.sinks, self.topk_length, self.q_scale, self.kv_scale,
                      self.out):
                if t is not None and t.untyped_storage().data_ptr() == 0 and t.numel():
                    return True
        except (NotImplementedError, RuntimeError):  # a storage that cannot be read (a torch.func transform's tensor,
            return True  # whose metadata may match a real call's): the first call's checks refuse it by name
        return False

    @property
    def num_tokens(self) -> int:
        """T: ``q.shape[0]``, the call's tokens (decode queries)."""
        return self.q.shape[0]

    @property
    def num_kv_rows(self) -> int:
        """N: ``kv_cache.shape[0]``, or ``num_blocks * block_size`` of a paged ``[num_blocks, block_size, 656]``."""
        return num_rows(self.kv_cache)

    @property
    def device(self) -> torch.device:
        """q's device, the one every tensor of a checked call is on."""
        return self.q.device

    def token_slice(self, a: int, b: int) -> "DecodeInputs":
        """Tokens ``a <= t < b`` of the call: its rows of ``q``, ``indices``, ``topk_length`` and ``out`` (views,
        no copy); the pool, sinks and scales are shared by every token and kept."""
        return self._replace(q=self.q[a:b], indices=self.indices[a:b],
                             topk_length=None if self.topk_length is None else self.topk_length[a:b],
                             out=None if self.out is None else self.out[a:b])


def _tensor_meta(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """A tensor's metadata for :meth:`DecodeInputs.signature` (``None`` stays ``None``)."""
    if t is None:
        return None
    # the layout too: an mkldnn tensor has a dense one's strides, and matched a dense call's prepared signature,
    # which skipped the refusal (a break test, thirty-ninth session); and the type: a FakeTensor (no data) has a real
    # tensor's metadata and device, and matched a real call's signature (forty-first session); and whether it is a
    # zero tensor or a conjugated view, which the first call of a signature refuses and a later one skipped to the
    # launch (a zero tensor reached Triton's "invalid python storage" RuntimeError: sixty-second session)
    return (type(t), t.dtype, t.shape, t.stride(), t.device, t.requires_grad, t.is_neg(), t.is_conj(),
            t._is_zerotensor(), t.layout)
