"""Programmatic dependent launch (sm90+) from inside a Gluon kernel, shared by the kernels whose split
launches the combine kernel follows as a programmatic dependent (:mod:`mla_sink.kernels.gluon.gluon_seesaw`,
:mod:`mla_sink.kernels.gluon.gluon_fp8`). Source: the PTX ISA, ``griddepcontrol``."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def launch_dependents(x):
    """``griddepcontrol.launch_dependents``: this CTA no longer holds back the launch of a programmatic
    dependent grid, which may then start on the SMs this grid leaves idle and waits (``griddepcontrol.wait``)
    for this grid's completion before it reads what the grid wrote (``x``: any scalar; the instruction
    takes no operand)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0 $1", "=r,r", [x], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def wait_primary(x):
    """``griddepcontrol.wait``: block until the grid this one was launched as a programmatic dependent of has
    completed and its memory is visible (a no-op for a grid launched plainly; ``x``: any scalar, as for
    :func:`launch_dependents`)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0 $1", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)
