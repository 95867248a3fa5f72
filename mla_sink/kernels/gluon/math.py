"""The math the Gluon kernels (:mod:`~mla_sink.kernels.gluon.gluon_seesaw`, :mod:`~mla_sink.kernels.gluon.gluon_fp8`)
share, as ``@gluon.jit`` helpers (a Gluon kernel calls Gluon functions only; Triton inlines them).

:data:`LOG2E` is the Triton kernels' constant (:mod:`mla_sink.kernels.triton.math`), one value for every
kernel. :func:`sink_scale` is the Gluon twin of :func:`mla_sink.kernels.triton.math.sink_scale`.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mla_sink.kernels.triton.math import LOG2E

__all__ = ["LOG2E", "sink_scale"]


@gluon.jit
def sink_scale(scale, sink, lse2, empty):
    """The sink epilogue: ``scale * sigmoid(lse - sink)`` per head, 0 on empty rows.

    ``sigmoid(lse - sink) = 1 / (1 + 2^((sink - lse) log2 e))``: ``sink = -inf`` gives ``scale``,
    ``sink = +inf`` gives 0. ``scale``: what the factor multiplies (the row's ``1 / l``, times
    ``kv_scale`` for fp8 KV); ``sink``: fp32 natural-log sink logits (``-inf`` for padded heads);
    ``lse2``: the base-2 sink-free LSE (``-inf`` on empty rows); ``empty``: rows with no valid id. All
    of one layout (one value per head).
    """
    diff = gl.where(empty, 0.0, sink * LOG2E - lse2)  # no -inf - -inf on empty rows
    return gl.where(empty, 0.0, scale / (1.0 + gl.exp2(diff)))
