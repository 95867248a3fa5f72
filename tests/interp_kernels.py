"""Small ``@triton.jit`` kernels that run one of the shared kernel helpers (:mod:`mla_sink.kernels.triton.math`) on
their own, for tests under Triton's interpreter. Imported inside the tests that use them (Triton at import)."""

from __future__ import annotations

import triton
import triton.language as tl

from mla_sink.kernels.triton import math as kmath


@triton.jit
def rope_scores_kernel(Q, K, OUT, H: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    """``OUT [H, N] fp32 = kmath.ds_mla_rope_scores(Q [H, D], K [N, D])``, every tensor contiguous."""
    h = tl.arange(0, H)
    n = tl.arange(0, N)
    d = tl.arange(0, D)
    q = tl.load(Q + h[:, None] * D + d[None, :])
    k = tl.load(K + n[:, None] * D + d[None, :])
    tl.store(OUT + h[:, None] * N + n[None, :], kmath.ds_mla_rope_scores(q, k))
