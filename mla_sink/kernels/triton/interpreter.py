"""Run the Triton kernels on CPU tensors through Triton's interpreter, without ``TRITON_INTERPRET=1``.

The interpreter does no bf16 arithmetic (docs/DESIGN.md, triton-lang/triton#11584): kernels take an
``UPCAST`` constexpr, true only here, that casts half tiles to fp32 first.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import numpy as np
import triton.language as tl

@functools.lru_cache(maxsize=None)
def interpreted(name: str):
    """The interpreter version of a kernel (CPU tensors), built without needing TRITON_INTERPRET=1.

    Triton 3.6 and 3.9 both construct it as ``InterpretedFunction(fn)`` and launch it as ``fn[grid](...)``.
    """
    from triton.runtime.interpreter import InterpretedFunction

    from mla_sink.kernels.triton.combine import combine_jit
    from mla_sink.kernels.triton.portable import portable_jit

    fn = {"portable": portable_jit, "combine": combine_jit}[name]
    return InterpretedFunction(fn.fn)


_INTERPRETER_LOCK = threading.RLock()  # the swap below is process-wide: one interpreted launch at a time


@contextlib.contextmanager
def interpreter_stdlib():
    """Make ``tl.sum``, ``tl.max``, ``tl.zeros``... and the kernels' shared helpers
    (:mod:`mla_sink.kernels.triton.math`, called through their module) callable by the interpreter for
    the duration of a launch.

    Without ``TRITON_INTERPRET=1`` at import, Triton's standard library functions are ``JITFunction``s,
    which refuse to be called outside a compiled kernel. The interpreter build of them is what
    ``TRITON_INTERPRET=1`` would have made at import time: ``InterpretedFunction(f.fn)``. They are
    swapped in for the launch and restored afterwards (one object per function, so the interpreter's
    identity checks of combine functions such as ``tl.standard._sum_combine`` still hold).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    try:  # imported lazily by Triton's argument mangling; it asserts the stdlib is unpatched
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # pragma: no cover - absent in older Triton
        pass
    from mla_sink.kernels.triton import math as kmath

    with _INTERPRETER_LOCK:  # the patched modules are global: CPU calls from several threads take turns
        modules = [tl, tl.standard, tl.math, tl.core, kmath]  # kmath: the kernels' shared helpers
        replaced: dict[int, object] = {}
        saved = []
        for mod in modules:
            for name, obj in list(vars(mod).items()):
                if isinstance(obj, JITFunction):
                    new = replaced.setdefault(id(obj), InterpretedFunction(obj.fn))
                    saved.append((mod, name, obj))
                    setattr(mod, name, new)
        try:
            # masked lanes compute with -inf by design, and NaN in referenced KV rows gives NaN out (the
            # reference's semantics): numpy's floating-point warnings there ("invalid value", "All-NaN
            # slice") are not the caller's, and under warnings-as-errors they would abort the launch
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                yield
        finally:
            for mod, name, obj in reversed(saved):
                setattr(mod, name, obj)

