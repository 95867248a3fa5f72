"""The trees of the fiftieth session's probe of a cheaper V3.2 code conversion (issue #12's one missed bar, V3.2
H=32 T=256 on the H200, where the producer and the first consumer both sit at the period: BENCHMARKS.md, fiftieth
session). Main's producer converts each pair of V3.2 codes e4m3 -> f16x2 -> two f32 -> bf16x2 (``_to_tile``: per
thread and block 128 ``F2FP.F16``, 256 ``HADD2.F32``, 128 ``F2FP.BF16``, 512 of its 761 instructions a step at 32
heads, AOT sm90). The ``f16`` route keeps the one exact ``cvt`` to f16x2 and moves the f16 bits into bf16's
places with a shift and two logic operations (SASS: one ``SHF``, two ``LOP3``): the bf16 holds ``code * 2^-112``
exactly (f16's exponent bias 15 read with bf16's 127; every e4m3 value is a normal f16, so no bf16 subnormal), and
the consumers undo the ``2^-112`` with powers of two only - q's latent part scaled per head so that its largest |q|
is ``2^56`` (``_stage_q``, as e4m3 scales q into fp16's range; the row exponent clamped to [-68, 60]), its RoPE part
to 1, the tile scales by ``2^56`` (they scale both the scores and ``P_t``) and the output by ``2^56``
(``_out_scale``). Every product and sum is main's times a power of two, so the outputs must be bitwise equal to
main's (the A/B's ``max_abs_diff_vs_first``), barring tile scales from ``2^72 (1 - 2^-9)`` up (``P_t`` overflows
bf16), ``P * scale * |code|`` below ``2^-70`` (fp32 subnormals) and ``sm_scale`` outside ``[2^-58, 2^67]``. The
branch's tests/test_gluon_fp8_route.py replays the PTX for all 256 codes and checks the units in float64.

- ``main``: :data:`BASE` as it is;
- ``f16r``: the f16 route; an e4m3 NaN code (0x7F, 0xFF) becomes a finite value (wrong: main keeps NaN);
- ``route``: the commit :data:`ROUTE` (``wip/f16-route``), the f16 route as it would merge, NaN kept by taking
  each f16's sign as the f16 times 0 (one ``HMUL2`` a pair in place of the sign's mask; 820 instructions a step).

One call (carry ``out`` and ``.peers``): the A/B over the few-heads cases, the GPU tests of the winner and the grid
with FlashMLA (:file:`device_ab_then_grid.sh`):

    PYTHONPATH=. python3 benchmarks/ds_f16_route_trees.py out
    bash benchmarks/device_ab_then_grid.sh $OUT m1=../out/main xr=../out/f16r n=../out/route m2=../out/main

(``xr``: a probe, timed but never picked as the winner: benchmarks/pick_winner.py.) Timed in the fifty-first session
on an H100: both lose (V3.2 H=32 T=256 route 207.9, f16r 215.1 against 200.4-201.0 us; BENCHMARKS.md), so the
route is not merged (benchmarks/gluon_fp8_f16_route.patch).
"""

from __future__ import annotations

import os
import sys

from tree_ab import archive_tree, build_trees

KERNEL = os.path.join("mla_sink", "kernels", "gluon", "gluon_fp8.py")
#: The commit the trees are archived from (fiftieth session: main, whose kernels are 18b59d3's).
BASE = "9d548cc"

#: e4m3x2 -> f16x2 (exact), then each f16's exponent and mantissa shifted into bf16's places and its sign kept: bf16
#: ``code * 2^-112``. pack=4: ``$2`` four codes, ``$0`` / ``$1`` two bf16 each (the lower element in the lower half).
_ROUTE = r"""{
.reg .b16 lo, hi;
.reg .b32 h0, h1, t0, t1, s0, s1;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 h0, lo;
cvt.rn.f16x2.e4m3x2 h1, hi;
shr.b32 t0, h0, 3;
and.b32 t0, t0, 0x0FFF0FFF;
and.b32 s0, h0, 0x80008000;
or.b32 $0, t0, s0;
shr.b32 t1, h1, 3;
and.b32 t1, t1, 0x0FFF0FFF;
and.b32 s1, h1, 0x80008000;
or.b32 $1, t1, s1;
}"""
_TO_TILE = "        return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(dtype)\n"
_SCALES = "    sc = gl.load(rows[:, None] + t[None, :], mask=ok[:, None], other=0.0)\n"
_Q = """    if KV_DS_MLA:  # bf16 q as it is
        q_n.index(0).store(qn.to(dt))
        q_r.index(0).store(qr.to(dt))
        scale_smem.store(gl.full([BLOCK_H], sm_scale * LOG2E, gl.float32, gl.SliceLayout(1, ld_l)))
"""
_Q_ROUTE = """    if KV_DS_MLA:  # the f16 route: latent q to 2^56 a head row, RoPE q to 1
        qn = qn.to(gl.float32)
        qr = qr.to(gl.float32)
        qmax = gl.maximum(gl.max(_finite_abs(qn), axis=1), gl.max(_finite_abs(qr), axis=1))
        row_exp = gl.minimum(gl.maximum(gl.ceil(gl.log2(gl.maximum(qmax, 1e-30))), -68.0), 60.0)
        q_n.index(0).store((qn * gl.exp2(56.0 - row_exp)[:, None]).to(dt))
        q_r.index(0).store((qr * gl.exp2(-row_exp)[:, None]).to(dt))
        scale_smem.store(gl.exp2(row_exp) * (sm_scale * LOG2E))
"""
_OUT = "        scale = 1.0 / l_safe\n"


def _edits() -> list:
    """The f16 route's edits of gluon_fp8.py, without the NaN operations."""
    call = f"gl.inline_asm_elementwise({_ROUTE!r}, \"=r,=r,r\", [codes], dtype=gl.bfloat16, is_pure=True, pack=4)"
    return [(_TO_TILE, f"        return {call}\n"),
            (_SCALES, _SCALES.replace("other=0.0)", "other=0.0) * 72057594037927936.0  # 2^56")),
            (_Q, _Q_ROUTE),
            (_OUT, "        scale = 72057594037927936.0 / l_safe  # 2^56: the f16 route's value unit\n")]


VARIANTS = {"main": [], "f16r": _edits()}
#: The f16 route as it would merge (local branch ``wip/f16-route``): the kernel's ``_E4M3_BF16`` keeping NaN, its
#: constants and docstrings, and tests/test_gluon_fp8_route.py.
ROUTE = "a936798"


def main(out_dir: str = "out") -> None:
    build_trees(BASE, out_dir, KERNEL, VARIANTS)
    print(archive_tree(ROUTE, os.path.join(out_dir, "route")))


if __name__ == "__main__":
    main(*sys.argv[1:])
