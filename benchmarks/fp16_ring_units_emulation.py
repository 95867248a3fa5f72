"""Emulation in float64 of the fp16 ring's per-tile units for V3.2 rows (fifty-seventh session, issue #12;
benchmarks/gluon_fp8_ds_fp16_ring.patch): how far each way of storing ``P_t = P * scale_t`` for the ``P V`` wgmma
takes one CTA's ``O^T`` from the exact sum, on adversarial tile scales and scores.

- ``bf16``: main's kernels - ``P_t`` rounded once to bf16 (8 significant bits, fp32's range).
- ``fp16 units``: the patch - ``P_t * 2^(14 - e_t)`` rounded to fp16 (11 bits), ``2^e_t`` the smallest power of two
  at or above a running bound on every ``|P * scale_t|`` seen (the old bound times the softmax's ``alpha``, or the
  block's largest), floored at ``2^-100``; each tile's accumulator moved between units by ``alpha * 2^(e_old -
  e_new)`` (exact powers of two) and taken out of its unit at the end.

Both run the same online softmax over 64-id blocks (its ``alpha`` and ``P`` in float64, as the kernels' fp32 ones
are close to), with the codes (integers in [-448, 448]) as the values; the error is ``max |O - O_exact| / max
|O_exact|`` over the tile's values and heads. Runs on the CPU:

    python3 benchmarks/fp16_ring_units_emulation.py [OUT.json]
"""

from __future__ import annotations

import json
import math
import sys

import torch

#: ids a block, value columns a tile, tiles a row, heads (16: the alternate blocks' head block).
BLOCK_N, TILE, TILES, HEADS = 64, 128, 4, 16
#: The lowest unit exponent (gluon_fp8's ``UNIT_FLOOR`` in the patch).
UNIT_FLOOR = -100


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """The patch's ``_ceil_log2``: ``((bits + 0x7FFFFF) >> 23) - 127`` of float32 ``x``."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return ((bits + 0x7FFFFF) >> 23) - 127


def unit(bound: torch.Tensor) -> torch.Tensor:
    """The patch's ``_unit``: ``max(ceil_log2(bound), UNIT_FLOOR)``."""
    return torch.clamp(ceil_log2(bound), min=UNIT_FLOOR)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """``2^k`` in float64 for integer ``k``."""
    return torch.exp2(k.to(torch.float64))


def o_t(blocks: list, scales: torch.Tensor, values: torch.Tensor, mode: str) -> torch.Tensor:
    """``O^T`` ``[512, HEADS]`` of the online softmax's ``blocks`` (``(alpha, P)`` per block) by ``mode``."""
    acc = torch.zeros(TILES * TILE, HEADS, dtype=torch.float64)
    bound = torch.zeros(TILES, HEADS, dtype=torch.float32)
    for b, (alpha, p) in enumerate(blocks):
        sc = scales[b * BLOCK_N:(b + 1) * BLOCK_N]
        v = values[b * BLOCK_N:(b + 1) * BLOCK_N]
        for t in range(TILES):
            cols = slice(t * TILE, (t + 1) * TILE)
            x = p.to(torch.float32) * sc[:, t:t + 1].to(torch.float32)
            if mode == "bf16":
                acc[cols] = acc[cols] * alpha + v[:, cols].T @ x.to(torch.bfloat16).to(torch.float64)
            else:
                e_old = unit(bound[t])
                bound[t] = torch.maximum(bound[t] * alpha.to(torch.float32), x.abs().amax(0))
                e_new = unit(bound[t])
                factor = alpha * pow2(torch.clamp(e_old - e_new, min=-126))
                p_t = (x.to(torch.float64) * pow2(14 - e_new)[None, :]).to(torch.float16).to(torch.float64)
                acc[cols] = acc[cols] * factor[None, :] + v[:, cols].T @ p_t
    if mode != "bf16":
        for t in range(TILES):
            acc[t * TILE:(t + 1) * TILE] *= pow2(unit(bound[t]) - 14)[None, :]
    return acc


def error(scores: torch.Tensor, scales: torch.Tensor, seed: int = 0) -> dict:
    """``{mode: relative error}`` of one CTA's ``O^T`` for ``scores`` ``[ids, HEADS]`` (base 2) and ``scales``
    ``[ids, 4]``."""
    g = torch.Generator().manual_seed(seed)
    n = scores.shape[0]
    values = torch.randint(-448, 449, (n, TILES * TILE), generator=g).to(torch.float64)
    p_exact = torch.exp2(scores - scores.amax(0))
    exact = torch.cat([values[:, t * TILE:(t + 1) * TILE].T @ (p_exact * scales[:, t:t + 1]) for t in range(TILES)])
    blocks, m = [], torch.full((HEADS,), -math.inf, dtype=torch.float64)
    for b in range(n // BLOCK_N):
        s = scores[b * BLOCK_N:(b + 1) * BLOCK_N]
        m_new = torch.maximum(m, s.amax(0))
        blocks.append((torch.nan_to_num(torch.exp2(m - m_new), nan=0.0), torch.exp2(s - m_new)))
        m = m_new
    top = exact.abs().amax()
    return {mode: float((o_t(blocks, scales, values, mode) - exact).abs().amax() / top) for mode in ("bf16", "fp16")}


def cases(n: int = 32 * BLOCK_N) -> dict:
    """The adversarial cases: ``{name: (scores, scales)}``."""
    g = torch.Generator().manual_seed(1)
    rnd = torch.randn(n, HEADS, generator=g, dtype=torch.float64) * 3
    ones = torch.ones(n, TILES, dtype=torch.float64)
    peaked, tiny = rnd.clone(), ones.clone()
    peaked[5] += 60  # one id carries every head's softmax ...
    tiny[5] = 2.0 ** -40  # ... and has a tiny scale
    rising = torch.arange(n, dtype=torch.float64)[:, None] / BLOCK_N * 0.99 + rnd * 0.003  # alpha ~ 1/2 a block
    zero_block = ones.clone()
    zero_block[:BLOCK_N] = 0.0
    return {
        "power-of-two scales 2^-7": (rnd, ones * 2.0 ** -7),
        "amax / 448 scales": (rnd, torch.rand(n, TILES, generator=g, dtype=torch.float64) * 0.01 + 1e-4),
        "scales spanning 2^60 per row": (rnd, torch.exp2(torch.randint(-30, 31, (n, TILES), generator=g).double())),
        "scales 2^-125 and 2^100": (rnd, torch.exp2(torch.tensor([-125.0, 100.0])[torch.randint(0, 2, (n, TILES),
                                                                                              generator=g)].double())),
        "softmax on one row of scale 2^-40": (peaked, tiny),
        "scores rising a bit a block": (rising, ones),
        "a block of zero scales": (rnd, zero_block),
    }


def main(path: str = "") -> None:
    """Print (and with ``path`` write as JSON) each case's relative error in both modes."""
    report = {name: error(s, sc) for name, (s, sc) in cases().items()}
    for name, r in report.items():
        print(f"{name:36s} bf16 P_t {r['bf16']:.2e}   fp16 units {r['fp16']:.2e}")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
