"""Ahead-of-time sm90 compilation of the Gluon kernels for the ptxas tests (no GPU needed): a kernel and the
constexprs / integer arguments its launcher gives a call are compiled by Triton for sm90, then assembled by
Triton's bundled ptxas, whose report (spills, wgmma serialisation warnings) and SASS the tests read.

Needs the Triton release the kernels are written for (its Gluon API: Triton 3.6, as on the H200 image) with
its bundled ptxas and cuobjdump; :func:`require` skips the calling test module elsewhere (CI installs a newer
Triton whose Gluon API differs).
"""

from __future__ import annotations

import os
import subprocess

import pytest


def require():
    """``(triton, bin_dir)``, or skip the calling module: Triton, its Gluon API and its bundled ptxas and
    cuobjdump are needed."""
    triton = pytest.importorskip("triton")
    gluon_lang = pytest.importorskip("triton.experimental.gluon.language")
    if not hasattr(gluon_lang, "thread_barrier"):
        pytest.skip(f"Triton {triton.__version__}: not the Gluon API the kernels are written for",
                    allow_module_level=True)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bin_dir, b)) for b in ("ptxas", "cuobjdump")):
        pytest.skip("Triton's bundled ptxas / cuobjdump are missing", allow_module_level=True)
    return triton, bin_dir


def compile_sm90(fn, constexprs: dict, scalars: dict, ptrs: dict, num_warps: int):
    """Compile the ``@gluon.jit`` kernel ``fn`` for sm90: ``ptrs`` maps its tensor arguments to Triton
    pointer types (``"*bf16"``), ``scalars`` its integer arguments to the values a call gives them (marked
    16-divisible where they are, as the launcher's specialisation sees them); ``sm_scale`` is fp32."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ptrs:
            signature[name] = ptrs[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            assert name in scalars, name
            signature[name] = "i32"
            if scalars[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


#: Triton pointer types of the gluon_fp8 kernel's tensor arguments other than ``KV`` (whose type follows the cache).
FP8_KERNEL_PTRS = {"Q": "*bf16", "IDX": "*i32", "SINKS": "*fp32", "TOPK_LEN": "*i32", "KV_SCALE": "*fp32",
                   "OUT": "*bf16", "LSE": "*fp32", "PART_OUT": "*fp32", "PART_LSE": "*fp32"}


def compile_gluon_fp8(constexprs: dict, scalars: dict, kv_ptr: str, num_warps: int):
    """:func:`compile_sm90` of ``gluon_fp8.sparse_mla_decode_fp8_ws_kernel`` with the constexprs and scalars of its
    launch args (:func:`mla_sink.kernels.gluon.gluon_fp8.fp8_launch_args`) and ``KV`` of type ``kv_ptr``
    (``"*fp8e4nv"`` for an e4m3 cache, ``"*u8"`` for V3.2 rows)."""
    from mla_sink.kernels.gluon import gluon_fp8

    return compile_sm90(gluon_fp8.sparse_mla_decode_fp8_ws_kernel, constexprs, scalars,
                        dict(FP8_KERNEL_PTRS, KV=kv_ptr), num_warps)


def assemble(kernel, bin_dir: str, tmp_path) -> tuple[str, str]:
    """``(ptxas -v report, SASS)`` of a compiled kernel, assembled for sm_90a by Triton's bundled ptxas."""
    ptx = tmp_path / "k.ptx"
    ptx.write_text(kernel.asm["ptx"])
    cubin = tmp_path / "k.cubin"
    log = subprocess.run([os.path.join(bin_dir, "ptxas"), "-arch=sm_90a", "-v", str(ptx), "-o", str(cubin)],
                         capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", str(cubin)],
                          capture_output=True, text=True, check=True).stdout
    return log, sass
