"""Execute the ``triton`` path: a :class:`~mla_sink.core.plan.LaunchPlan` whose ``launch`` is a
:class:`~mla_sink.paths.triton.plan.TritonLaunch` (kernel, tiles, split count: all decided while planning).

:func:`prepare_triton` turns a plan and one call's tensors into a runner for every later call with the
same tensor metadata (shapes, strides, dtypes, devices): the scalar arguments, the grids and the
constexprs are fixed once; each call then allocates its outputs and launches. On a GPU the compiled
kernel is launched directly (:class:`CompiledLaunch`): Triton's launcher binds and specialises every
argument on every call, which costs more host time than the kernel takes at small T.

Kernels: ``portable`` (:mod:`mla_sink.kernels.triton.portable`) with the split-KV ``combine``
(:mod:`mla_sink.kernels.triton.combine`), and on sm90 the warp-specialised ``gluon_seesaw`` (with the
same combine when split) and ``gluon_fp8`` (:mod:`mla_sink.kernels.gluon`). The Gluon
kernels read unit-stride rows, and the seesaw gathers with 16-byte ``cp.async`` at strides that are multiples of
its path's ``topk: {multiple_of: N}`` in ``tables/triton_tuning.yaml``: those are facts of the call signature
(:attr:`CallSpec.gather_aligned <mla_sink.core.records.CallSpec>`, ``unit_rows``), requirements of the Gluon paths
in that table, so a call without them is planned on the portable kernel, and a Gluon plan handed tensors without
them is refused when its runner is prepared (:class:`PlanMismatchError`). The data pointers are per call: a seesaw call
whose pointers are not 16-byte aligned runs the portable kernel (:attr:`TritonLaunch.per_call
<mla_sink.paths.triton.plan.TritonLaunch>` says so). A Gluon kernel that fails to COMPILE here (another
Triton release) is recorded (:func:`mla_sink.core.plan.mark_kernel_failed`): the call and every later
plan use the portable kernel, and the plan says why. Any other error propagates.

On the CPU the kernels run through Triton's interpreter (:mod:`mla_sink.kernels.triton.interpreter`).
The interpreter truncates fp32 -> bf16 casts toward zero; a bf16 output is therefore written in fp32
and rounded to nearest by PyTorch, as the GPU rounds.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional

import attrs
import torch

from mla_sink.core import kv_layout
from mla_sink.core.dtypes import (DS_MLA_KEYS, DTYPE_KEYS, FNUZ_KEYS, FP8_KEYS, FP16_EXACT_KEYS, kv_dtype_key,
                                  out_dtype_for)
from mla_sink.core.inputs import DecodeInputs
from mla_sink.core.records import D_QK, D_V, MAX_ROWS
from mla_sink.kernels.triton.combine import combine_launch_args
from mla_sink.kernels.triton.math import LOG2E as _LOG2E
from mla_sink.paths.triton.plan import (MAX_GRID_TOKENS, POINTER_ALIGN, PORTABLE, all_heads_block,
                                        gather_strides_aligned, rows_unit_stride, seesaw_strides_ok, token_ranges)

Result = tuple[torch.Tensor, torch.Tensor]

D_ROPE = D_QK - D_V
# POINTER_ALIGN (mla_sink.paths.triton.plan): Triton specialises pointer arguments on this alignment (bytes); a
# compiled kernel is reused only for tensors with the same alignment pattern.
LOG2E = _LOG2E.value  # the kernels' one definition (mla_sink.kernels.triton.math)
#: ``MLA_SINK_TRITON_FAST_LAUNCH=0`` launches through Triton's ``kernel[grid](...)`` on every call.
FAST_LAUNCH = os.environ.get("MLA_SINK_TRITON_FAST_LAUNCH", "1") != "0"


#: What Triton's MLIR pass manager says when a pass fails while it compiles a kernel (``PassManager::run failed``,
#: raised as a plain ``RuntimeError`` from its C++ bindings, triton/_C/libtriton: ``ir.cc``).
MLIR_PASS_FAILURE = "PassManager::run failed"


class MLIRPassError(RuntimeError):
    """A kernel Triton could not compile because one of its MLIR passes failed: a compile failure like
    ``CompilationError``, told apart from the other ``RuntimeError`` s of a first call (a CUDA error at the launch,
    which must propagate) by Triton's message :data:`MLIR_PASS_FAILURE`. Raised by :class:`CompiledLaunch` from
    the ``RuntimeError`` it wraps."""


def _compile_errors() -> tuple:
    """The exception types Triton raises when a kernel cannot be compiled or loaded here, and
    :class:`MLIRPassError`, which :class:`CompiledLaunch` raises for a failed MLIR pass."""
    errors: list = [MLIRPassError]
    try:
        from triton.compiler.errors import CompilationError

        errors.append(CompilationError)
    except ImportError:  # pragma: no cover - very old Triton
        pass
    try:
        from triton.runtime.errors import OutOfResources

        errors.append(OutOfResources)
    except ImportError:  # pragma: no cover
        pass
    try:  # ptxas refusing the PTX (Triton's autotuner counts it as a compile failure too)
        from triton.runtime.errors import PTXASError

        errors.append(PTXASError)
    except ImportError:  # pragma: no cover - Triton before 3.3
        pass
    return tuple(errors)


class CompiledLaunch:
    """One Triton kernel on one grid with fixed constexprs, launched without per-call argument binding.

    The first call (per pointer-alignment pattern) goes through ``jit_fn[grid](...)``, which compiles
    (or loads from Triton's cache) and returns the compiled kernel; later calls hand the arguments
    straight to the compiled kernel's launcher. Integer arguments are fixed by the caller's cache key
    (shapes and strides), so Triton's integer specialisation cannot change between calls; pointer
    alignment is checked on every call.

    Args:
        jit_fn: the ``@triton.jit`` / ``@gluon.jit`` function.
        grid: the launch grid (1 to 3 ints).
        constexprs: the constexpr arguments by name.
        options: launch options (``num_warps``, ``num_stages``).
        dynamic: names of the arguments given per call, in the order ``__call__`` takes them.
        static: the other non-constexpr arguments by name (ints and floats fixed for this runner).
    """

    def __init__(self, jit_fn: Any, grid: tuple, constexprs: dict, options: dict, dynamic: tuple, static: dict,
                 device_index: int = 0):
        self.jit_fn = jit_fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.constexprs = constexprs
        self.options = options
        self.dynamic = dynamic
        self.device_index = device_index
        names = list(jit_fn.arg_names)
        self._template = [constexprs.get(n, static.get(n)) for n in names]
        self._slots = [names.index(n) for n in dynamic]
        # the per-call arguments lead every kernel's signature here: the rest is one fixed tail
        self._tail = tuple(self._template[len(dynamic):]) if self._slots == list(range(len(dynamic))) else None
        self._launchers: dict = {}

    def _bind(self, args: tuple) -> tuple:
        if self._tail is not None:
            return args + self._tail
        full = list(self._template)
        for i, a in zip(self._slots, args):
            full[i] = a
        return tuple(full)

    def __call__(self, align: Any, *args: Any) -> None:
        """Launch on ``args`` (the ``dynamic`` arguments in order); ``align`` is the caller's key of the
        tensors' pointer alignment (:func:`alignment_key`)."""
        launcher = self._launchers.get(align) if FAST_LAUNCH else None
        if launcher is not None:
            run, function, metadata, runner = launcher
            if _no_launch_hooks():
                # what Triton's own launcher does when no launch hook is set (triton/compiler/compiler.py,
                # CompiledKernel.__getitem__), on the current stream of the tensors' device
                g = self.grid
                run(g[0], g[1], g[2], _current_stream(self.device_index), function, metadata, None, None, None,
                    *self._bind(args))
            else:  # a profiler's launch hooks: Triton's runner calls them
                runner(*self._bind(args))
            return
        named = dict(zip(self.jit_fn.arg_names, self._bind(args)))
        for name in self.constexprs:
            named.pop(name)
        try:
            compiled = self.jit_fn[self.grid](**named, **self.constexprs, **self.options)
        except RuntimeError as e:  # a failed MLIR pass is a compile failure; any other error (CUDA's) propagates
            if MLIR_PASS_FAILURE in str(e) and not isinstance(e, MLIRPassError):
                raise MLIRPassError(f"{getattr(self.jit_fn, '__name__', 'kernel')}: {e}") from e
            raise
        if FAST_LAUNCH and compiled is not None and hasattr(compiled, "__getitem__"):
            runner = compiled[self.grid]  # also loads the module (function handle) on this device
            self._launchers[align] = (compiled.run, compiled.function, compiled.packed_metadata, runner)


def _current_stream(device_index: int) -> int:
    """The raw handle of the current CUDA stream of a device (what Triton's launcher reads)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


try:  # Triton's runtime settings (launch hooks); older releases keep them elsewhere: then always the runner
    from triton import knobs as _KNOBS
except ImportError:  # pragma: no cover
    _KNOBS = None


def _no_launch_hooks() -> bool:
    """Whether no launch hook (a profiler's) is registered with Triton: its hook chains are empty (Triton
    3.6 and 3.9 keep ``HookChain`` objects there), so a launch may skip them and their metadata."""
    if _KNOBS is None:
        return False
    rt = _KNOBS.runtime
    return all(h is None or not getattr(h, "calls", True) for h in (rt.launch_enter_hook, rt.launch_exit_hook))


def alignment_key(*tensors: Optional[torch.Tensor]) -> Any:
    """``True`` when every given tensor's data pointer is a multiple of :data:`POINTER_ALIGN` (the common
    case: one integer test), else the per-tensor pattern. Tensors the launcher allocates itself need not
    be passed: the caching allocator aligns every block to 512 bytes."""
    ptrs = [t.data_ptr() for t in tensors if t is not None]
    mask = 0
    for p in ptrs:
        mask |= p
    if mask % POINTER_ALIGN == 0:
        return True
    return tuple(p % POINTER_ALIGN == 0 for p in ptrs)


@functools.lru_cache(maxsize=1024)
def _compiled(kernel: str, device_index: int, dtypes: tuple, grid: tuple, constexprs: tuple, options: tuple,
              dynamic: tuple, static: tuple) -> CompiledLaunch:
    """One :class:`CompiledLaunch` per kernel, device (its loaded module), tensor dtypes (Triton specialises
    on them), grid, constexprs, options and fixed scalars."""
    from mla_sink.kernels.triton.combine import combine_jit
    from mla_sink.kernels.triton.portable import portable_jit

    if kernel == "gluon_seesaw":
        from mla_sink.kernels.gluon.gluon_seesaw import sparse_mla_decode_seesaw_kernel as jit_fn
    elif kernel == "gluon_fp8":
        from mla_sink.kernels.gluon.gluon_fp8 import sparse_mla_decode_fp8_ws_kernel as jit_fn
    else:
        jit_fn = {"portable": portable_jit, "combine": combine_jit}[kernel]
    return CompiledLaunch(jit_fn, grid, dict(constexprs), dict(options), dynamic, dict(static), device_index)


_PORTABLE_DYNAMIC = ("Q", "KV", "IDX", "SINKS", "TOPK_LEN", "Q_SCALE", "KV_SCALE", "OUT", "LSE", "PART_OUT",
                     "PART_LSE", "sm_scale", "logit_cap")
_COMBINE_DYNAMIC = ("PART_OUT", "PART_LSE", "SINKS", "OUT", "LSE")
_SEESAW_DYNAMIC = ("Q", "KV", "IDX", "SINKS", "TOPK_LEN", "OUT", "LSE", "PART_OUT", "PART_LSE", "KV_SCALE", "REDO",
                   "sm_scale")
_FP8_DYNAMIC = ("Q", "KV", "IDX", "SINKS", "TOPK_LEN", "KV_SCALE", "OUT", "LSE", "PART_OUT", "PART_LSE", "sm_scale")


def prepare_triton(plan: Any, x: DecodeInputs) -> Callable[[DecodeInputs], Result]:
    """A runner of ``plan`` for every call whose tensors have the metadata of ``x``'s.

    Args:
        plan: a :class:`~mla_sink.core.plan.LaunchPlan` with path ``triton`` and ``launch`` planned for
            ``x``'s token count (kernel, tiles and split count fixed).
        x: one call's validated tensors (:class:`~mla_sink.core.inputs.DecodeInputs`).

    Returns:
        ``run(x) -> (out, lse)``: ``out [T, H, 512]`` (q's dtype; bf16 for fp8 q; written into ``x.out``
        when given) = sink-free output times ``sigmoid(lse - sink)``, 0 on rows with no valid id;
        ``lse`` fp32 ``[T, H]``, natural log, sink excluded, ``-inf`` on rows with no valid id.

    Raises:
        ValueError: a plan without a complete Triton launch (no split count: planned without an SM count).
    """
    launch = plan.launch
    if launch is None or launch.num_kv_splits is None:
        raise ValueError(f"plan {plan.row_id!r} has no complete Triton launch (split count unknown: plan it with "
                         "a Platform that knows its num_sms)")
    T, H, _ = x.q.shape
    out_dtype = out_dtype_for(plan.spec.q_dtype)
    device = x.q.device
    if T == 0:
        return lambda x, lse=None: _outputs(x, (0, H), out_dtype, device, lse)
    if T > MAX_GRID_TOKENS:
        return _token_ranges(plan, x, out_dtype, device)
    if launch.kernel != PORTABLE and launch.kernel in _failed_kernels():  # a plan made before its kernel failed here
        plan = _portable_plan(plan)
        launch = plan.launch
    if launch.kernel == "gluon_seesaw":
        return _seesaw_runner(plan, launch, x, out_dtype, device)
    if launch.kernel == "gluon_fp8":
        return _gluon_fp8_runner(plan, launch, x, out_dtype, device)
    return _portable_runner(plan, launch, x, out_dtype, device)


def _failed_kernels() -> Any:
    """The kernels recorded as failing to compile here (:func:`mla_sink.core.plan.failed_kernels`)."""
    from mla_sink.core.plan import failed_kernels

    return failed_kernels()


def _token_ranges(plan: Any, x: DecodeInputs, out_dtype: torch.dtype, device: torch.device):
    """A runner of a call of more than :data:`MAX_GRID_TOKENS` tokens: one launch (or launch and combine) per
    token range (:func:`~mla_sink.paths.triton.plan.token_ranges`: 65532 tokens, the last range shorter), each
    writing its rows of one ``out`` and ``lse``. The ranges' runners are prepared here, once: the full ranges share
    one (same metadata), the last its own. A range whose Gluon kernel fails to compile falls back (one warning); the
    ranges after it, in this call and later ones, take the portable kernel's runners without trying it again."""
    T, H, _ = x.q.shape
    ranges = token_ranges(T, MAX_GRID_TOKENS)
    state = {"kernel": plan.launch.kernel, "runners": _range_runners(plan, x, ranges)}

    def run(x_call: DecodeInputs, lse: Optional[torch.Tensor] = None) -> Result:
        out, lse = _outputs(x_call, (T, H), out_dtype, device, lse)
        x_call = x_call._replace(out=out)
        for a, b in ranges:
            state["runners"][b - a](x_call.token_slice(a, b), lse[a:b])
            if state["kernel"] != PORTABLE and state["kernel"] in _failed_kernels():  # this range fell back
                # prepared on this call's tensors (metadata only): the runner keeps no call's tensors alive
                state.update(kernel=PORTABLE, runners=_range_runners(_portable_plan(plan), x_call, ranges))
        return out, lse

    return run


def _range_runners(plan: Any, x: DecodeInputs, ranges: list) -> dict:
    """A prepared runner per range length of ``ranges`` (on the rows of the first range of that length)."""
    runners: dict = {}
    for a, b in ranges:
        if b - a not in runners:
            runners[b - a] = prepare_triton(plan, x.token_slice(a, b))
    return runners


def _outputs(x: DecodeInputs, th: tuple, out_dtype: torch.dtype, device: torch.device, lse=None) -> Result:
    out = x.out if x.out is not None else torch.empty((*th, D_V), dtype=out_dtype, device=device)
    return out, lse if lse is not None else torch.empty(th, dtype=torch.float32, device=device)


def _portable_runner(plan, launch, x: DecodeInputs, out_dtype: torch.dtype, device: torch.device):
    """A runner of the portable kernel (with the combine when split)."""
    spec = plan.spec
    T, H, _ = x.q.shape
    topk = x.indices.shape[1]
    interp = device.type == "cpu"
    splits = launch.num_kv_splits
    split = splits > 1
    q_fp8, kv_fp8 = spec.q_dtype in FP8_KEYS, spec.kv_dtype in FP8_KEYS
    ds = spec.kv_dtype in DS_MLA_KEYS  # the 656-byte V3.2 rows: tile scales inside the rows, no kv_scale
    f16 = kv_fp8 and launch.fp8_f16
    # the interpreter truncates fp32 -> bf16 casts: the kernel writes fp32 and PyTorch rounds to nearest, as
    # the GPU does (harmless for the other output dtypes, whose numpy casts round)
    stage_fp32 = interp
    has_sinks, has_len, cap = x.sinks is not None, x.topk_length is not None, spec.logit_cap
    constexprs = dict(
        BLOCK_H=launch.block_h, BLOCK_N=launch.block_n, D_NOPE=D_V, D_ROPE=D_ROPE,
        HAS_SINKS=has_sinks, HAS_TOPK_LEN=has_len, HAS_CAP=cap > 0,
        Q_FP8=q_fp8, KV_FP8=kv_fp8, Q_FNUZ=spec.q_dtype in FNUZ_KEYS, KV_FNUZ=spec.kv_dtype in FNUZ_KEYS,
        SPLIT=split, UPCAST=interp, FP8_F16=f16, ROW_SCALE=f16 and spec.q_dtype not in FP16_EXACT_KEYS,
        EVEN=not has_len and topk % launch.block_n == 0, KV_DS_MLA=ds, DS_TILE=kv_layout.TILE,
    )
    options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages)
    out_strides = (H * D_V, D_V) if (x.out is None or stage_fp32) else (x.out.stride(0), x.out.stride(1))
    num_hb = -(-H // launch.block_h)
    copy_q = x.q.stride(-1) != 1  # the kernel assumes unit innermost strides: such inputs are copied
    copy_idx = x.indices.stride(-1) != 1
    q_strides = (H * D_QK, D_QK) if copy_q else (x.q.stride(0), x.q.stride(1))
    kv_block_size, stride_kv = kv_layout.row_addressing(x.kv_cache)
    static = dict(
        # an fp8_ds_mla pool is addressed in bytes: row id at (id // kv_block_size) * stride_kv + (id % kv_block_size)
        # * 656, kv_block_size = 1 (stride_kv = its row stride) for [N, 656] and for pages without gaps between
        # them, block_size for other [blocks, block_size, 656] (kv_layout.row_addressing)
        num_heads=H, num_rows=min(x.num_kv_rows, MAX_ROWS),
        kv_block_size=kv_block_size,
        topk=topk, ids_per_split=launch.ids_per_split,
        stride_qt=q_strides[0], stride_qh=q_strides[1], stride_kv=stride_kv,
        stride_it=topk if copy_idx else x.indices.stride(0), stride_ot=out_strides[0], stride_oh=out_strides[1],
        stride_lt=H, stride_lh=1,
        stride_pt=splits * H * D_V if split else 0, stride_ps=H * D_V if split else 0,
        stride_ph=D_V if split else 0, stride_plt=splits * H if split else 0, stride_pls=H if split else 0,
    )
    grid = (num_hb, splits, T)
    cap_arg = float(cap) if cap > 0 else 1.0  # unused by the kernel without HAS_CAP
    if interp:
        decode = InterpretedLaunch("portable", grid, constexprs, _PORTABLE_DYNAMIC, static)
        combine = _interpreted_combine(launch, x, splits, out_strides) if split else None
    else:
        dtypes = tuple(None if t is None else t.dtype
                       for t in (x.q, x.kv_cache, x.indices, x.sinks, x.topk_length, x.q_scale, x.kv_scale, x.out))
        index = device.index if device.index is not None else torch.cuda.current_device()
        decode = _compiled("portable", index, dtypes, grid, tuple(constexprs.items()), tuple(options.items()),
                           _PORTABLE_DYNAMIC, tuple(static.items()))
        combine = _combine_launch(launch, x, index, dtypes, splits, out_strides) if split else None
    # fnuz is decoded from its bits inside the kernel (Triton has no fnuz type on NVIDIA or in numpy)
    q_bits, kv_bits = constexprs["Q_FNUZ"], constexprs["KV_FNUZ"]

    def run(x: DecodeInputs, lse: Optional[torch.Tensor] = None) -> Result:
        q = x.q.contiguous() if copy_q else x.q
        kv_cache = x.kv_cache.view(torch.uint8) if kv_bits else x.kv_cache
        indices = x.indices.contiguous() if copy_idx else x.indices
        topk_length = _contiguous_topk_length(x)  # the kernel reads TOPK_LEN + t
        out = x.out if x.out is not None else torch.empty((T, H, D_V), dtype=out_dtype, device=q.device)
        out_k = torch.empty((T, H, D_V), dtype=torch.float32, device=q.device) if stage_fp32 else out
        if lse is None:
            lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
        if split:
            part_out = torch.empty((T, splits, H, D_V), dtype=torch.float32, device=q.device)
            part_lse = torch.empty((T, splits, H), dtype=torch.float32, device=q.device)
        else:
            part_out = part_lse = lse
        sinks = x.sinks if x.sinks is not None else lse
        align = alignment_key(q, x.kv_cache, indices, x.sinks, topk_length, x.q_scale, x.kv_scale, x.out, lse)
        decode(align, q.view(torch.uint8) if q_bits else q, kv_cache, indices, sinks,
               topk_length if topk_length is not None else lse, x.q_scale if q_fp8 else lse,
               x.kv_scale if kv_fp8 else lse, out_k, lse, part_out, part_lse, x.sm_scale, cap_arg)
        if combine is not None:
            combine(align, part_out, part_lse, sinks, out_k, lse)
        if out_k is not out:
            out.copy_(out_k)
        return out, lse

    return run


class InterpretedLaunch:
    """One kernel on one grid through Triton's CPU interpreter, called like :class:`CompiledLaunch`
    (``align`` is ignored: the interpreter does not specialise)."""

    def __init__(self, name: str, grid: tuple, constexprs: dict, dynamic: tuple, static: dict):
        self.name, self.grid, self.constexprs, self.dynamic, self.static = name, grid, constexprs, dynamic, static

    def __call__(self, align: Any, *args: Any) -> None:
        from mla_sink.kernels.triton.interpreter import interpreted, interpreter_stdlib

        with interpreter_stdlib():
            interpreted(self.name)[self.grid](**dict(zip(self.dynamic, args)), **self.static, **self.constexprs)


def _combine_args(launch, x: DecodeInputs, splits: int, out_strides: tuple, pdl: bool = False) -> tuple:
    """``(grid, constexprs, static)`` of the split-KV combine of a launch (fp32 partials
    ``[T, splits, H, 512]``, base-2 LSEs ``[T, splits, H]``), its tile from the tuning row."""
    T, H, _ = x.q.shape
    cbh = min(launch.combine_block_h, all_heads_block(H))
    return combine_launch_args(T, H, splits, out_strides, x.sinks is not None, cbh, min(launch.combine_block_d, D_V),
                               wait_primary=pdl)


def _combine_launch(launch, x: DecodeInputs, index: int, dtypes: tuple, splits: int, out_strides: tuple,
                    pdl: bool = False):
    """The compiled split-KV combine of a launch on device ``index``; ``pdl``: launched as a programmatic
    dependent of the kernel before it (which lets it launch early), waiting for that grid first."""
    grid, constexprs, static = _combine_args(launch, x, splits, out_strides, pdl)
    options = (("num_warps", 4), ("num_stages", 1)) + ((("launch_pdl", True),) if pdl else ())
    return _compiled("combine", index, dtypes, grid, tuple(constexprs.items()), options,
                     _COMBINE_DYNAMIC, tuple(static.items()))


def _interpreted_combine(launch, x: DecodeInputs, splits: int, out_strides: tuple):
    """The split-KV combine of a launch through the CPU interpreter."""
    grid, constexprs, static = _combine_args(launch, x, splits, out_strides)
    return InterpretedLaunch("combine", grid, constexprs, _COMBINE_DYNAMIC, static)


class PlanMismatchError(ValueError):
    """A Gluon plan handed tensors without the stride facts it was planned for (``CallSpec.gather_aligned`` /
    ``unit_rows``): the plan was made for other tensors (e.g. a spec built by hand and its plan given straight to
    :func:`prepare_triton`). Calls through :func:`mla_sink.sparse_mla_decode`, :func:`mla_sink.run` and the layer are
    planned from their tensors' facts and never meet it."""


def _check_planned_strides(plan, x: DecodeInputs, seesaw: bool) -> None:
    """Once per call signature (when a Gluon runner is prepared): the tensors have the strides the plan's Gluon
    kernel gathers with, which the tuning table's requirements of its path promise - unit-stride rows
    (``unit_rows``) for both, and for the seesaw (``seesaw``) every gather stride a multiple of the table's ``N``
    (:func:`mla_sink.paths.triton.plan.seesaw_strides_ok`: ``gather_aligned`` with ``topk: {multiple_of: N}``).

    Raises:
        PlanMismatchError: they do not (the plan was made for other tensors), naming the fact and the strides.
    """
    ok = seesaw_strides_ok(x.q, x.kv_cache, x.indices) if seesaw else rows_unit_stride(x.q, x.kv_cache, x.indices)
    if ok:
        return
    facts = {"gather_aligned": gather_strides_aligned(x.q, x.kv_cache, x.indices),
             "unit_rows": rows_unit_stride(x.q, x.kv_cache, x.indices)}
    said = ", ".join(f"{k}={str(v).lower()}" for k, v in facts.items())
    raise PlanMismatchError(
        f"the plan names {plan.launch.kernel} (spec {plan.spec}), but these tensors' strides are not those it was "
        f"planned for ({said}; topk={x.indices.shape[1]}; strides q {tuple(x.q.stride())}, kv_cache "
        f"{tuple(x.kv_cache.stride())}, indices {tuple(x.indices.stride())}; tables/triton_tuning.yaml): plan the "
        "call from its own tensors (mla_sink.describe, mla_sink.core.describe.spec_for_tensors)")


def _portable_instead(plan, x: DecodeInputs, out_dtype: torch.dtype, device: torch.device):
    """The portable kernel's runner for a call the planned Gluon kernel cannot gather (its split count:
    the tuning row's, which the portable kernel shares)."""
    return _portable_runner(plan, attrs.evolve(plan.launch, kernel=PORTABLE, exact_recompute=False), x, out_dtype,
                            device)


def _gluon_launches(kernel: str, dynamic: tuple, launch, x: DecodeInputs, device: torch.device, grid: tuple,
                    static: dict, constexprs: dict, options: dict, out_strides: tuple) -> tuple:
    """``(decode, combine)`` of a Gluon kernel's runner: the compiled ``kernel`` launch (``dynamic`` its
    per-call arguments; ``grid``, ``static``, ``constexprs``, ``options`` from its launch-args function,
    completed here with the call's sinks and ``topk_length`` flags) and, for a split launch, the compiled
    combine (else ``None``). The combine is launched as a programmatic dependent of the kernel before it:
    the Gluon kernels let it launch as soon as all their CTAs run (``LAUNCH_DEPENDENTS``), so its launch
    overlaps their work; it waits for the grid before it (``griddepcontrol.wait``) first."""
    constexprs.update(HAS_SINKS=x.sinks is not None, HAS_TOPK_LEN=x.topk_length is not None)
    dtypes = tuple(None if t is None else t.dtype for t in (x.q, x.kv_cache, x.indices, x.sinks, x.topk_length, x.out))
    index = device.index if device.index is not None else torch.cuda.current_device()
    decode = _compiled(kernel, index, dtypes, grid, tuple(constexprs.items()), tuple(options.items()), dynamic,
                       tuple(static.items()))
    splits = launch.num_kv_splits
    combine = _combine_launch(launch, x, index, dtypes, splits, out_strides, pdl=True) if splits > 1 else None
    return decode, combine


def _seesaw_runner(plan, launch, x: DecodeInputs, out_dtype: torch.dtype, device: torch.device):
    """A runner for the seesaw kernel (:mod:`mla_sink.kernels.gluon.gluon_seesaw`), with the split-KV
    combine when split; a compile failure falls back to the portable kernel, as does a call whose data pointers are
    not :data:`POINTER_ALIGN`-byte aligned (per call: :attr:`TritonLaunch.per_call
    <mla_sink.paths.triton.plan.TritonLaunch>`). The strides are the plan's (``gather_aligned``, ``unit_rows``),
    checked here once per signature (:class:`PlanMismatchError`)."""
    _check_planned_strides(plan, x, seesaw=True)
    from mla_sink.kernels.gluon.gluon_seesaw import seesaw_launch_args

    T, H, _ = x.q.shape
    splits = launch.num_kv_splits
    split = splits > 1
    kv_dtype = plan.spec.kv_dtype
    kv_fp8 = kv_dtype in FP8_KEYS or kv_dtype in DS_MLA_KEYS  # read as bytes
    out_strides = (H * D_V, D_V) if x.out is None else (x.out.stride(0), x.out.stride(1))
    grid, static, constexprs, options = seesaw_launch_args(
        x.q, x.kv_cache.view(torch.uint8) if kv_fp8 else x.kv_cache, x.indices, num_kv_splits=splits,
        ids_per_split=launch.ids_per_split, out_strides=out_strides, kv_dtype=kv_dtype)
    decode, combine = _gluon_launches("gluon_seesaw", _SEESAW_DYNAMIC, launch, x, device, grid, static, constexprs,
                                      options, out_strides)
    # V3.2 rows: the seesaw decodes tiles into bf16, exact only for power-of-two scales; it flags (and stops
    # on) the programs that meet any other scale, and a second launch of the same grid, gated per program by those
    # flags, recomputes exactly those, reading every scale exactly (seesaw_fp8.KV_DS_EXACT) into the same outputs
    # or partials (split: one combine after it). After a split launch it is a programmatic dependent of the
    # seesaw (its programs wait for the flags, griddepcontrol.wait): 0.2-1.0 us less at T=2; after an unsplit one
    # it is launched plainly, as a dependent measured up to 2.7% slower there (BENCHMARKS.md, twenty-second session).
    redo = None
    if launch.exact_recompute:  # the planner's record (TritonLaunch.exact_recompute)
        e_grid, e_static, e_constexprs, e_options = seesaw_launch_args(
            x.q, x.kv_cache.view(torch.uint8), x.indices, num_kv_splits=splits, ids_per_split=launch.ids_per_split,
            out_strides=out_strides, kv_dtype=kv_dtype, exact=True, gated=True)
        redo, _ = _gluon_launches("gluon_seesaw", _SEESAW_DYNAMIC, launch, x, device, e_grid, e_static, e_constexprs,
                                  dict(e_options, launch_pdl=True) if split else e_options, out_strides)
    errors = _compile_errors()
    unaligned: list = []  # the portable runner, made on the first call with a misaligned pointer

    def run(x: DecodeInputs, lse: Optional[torch.Tensor] = None) -> Result:
        topk_length = _contiguous_topk_length(x)
        align = alignment_key(x.q, x.kv_cache, x.indices, x.sinks, topk_length, x.out, lse)
        if align is not True:
            if not unaligned:
                unaligned.append(_portable_instead(plan, x, out_dtype, device))
            return unaligned[0](x, lse)
        out, lse, part_out, part_lse = _call_buffers(x, lse, splits, out_dtype)
        sinks = x.sinks if x.sinks is not None else lse
        flags = torch.empty((T, grid[0] * grid[1]), dtype=torch.int32, device=x.q.device) if redo is not None else lse
        try:
            decode(align, x.q, x.kv_cache.view(torch.uint8) if kv_fp8 else x.kv_cache, x.indices, sinks,
                   topk_length if topk_length is not None else lse, out, lse, part_out, part_lse,
                   x.kv_scale if x.kv_scale is not None else lse, flags, x.sm_scale)
            if redo is not None:  # the flagged programs, recomputed exactly (gated by their flags)
                redo(align, x.q, x.kv_cache.view(torch.uint8), x.indices, sinks,
                     topk_length if topk_length is not None else lse, out, lse, part_out, part_lse, lse, flags,
                     x.sm_scale)
        except errors as e:
            return _fall_back(plan, "gluon_seesaw", e, x, lse)
        if split:
            combine(align, part_out, part_lse, sinks, out, lse)
        return out, lse

    return run


def _gluon_fp8_runner(plan, launch, x: DecodeInputs, out_dtype: torch.dtype, device: torch.device):
    """A runner for the sm90 fp8 kernel (:mod:`mla_sink.kernels.gluon.gluon_fp8`: a per-tensor e4m3fn cache or
    the 656-byte V3.2 rows, read exactly for every scale), with the split-KV combine (a programmatic
    dependent) when split; a compile failure falls back to the portable kernel. Its rows are the plan's
    (``unit_rows``), checked here once per signature (:class:`PlanMismatchError`); any strides and pointers are
    taken (a pool whose rows are not 16-byte aligned takes the kernel's ``gl.load`` gather)."""
    _check_planned_strides(plan, x, seesaw=False)
    from mla_sink.kernels.gluon.gluon_fp8 import ROW_ALIGN, fp8_launch_args

    H = x.q.shape[1]
    splits = launch.num_kv_splits
    split = splits > 1
    ds = plan.spec.kv_dtype in DS_MLA_KEYS  # the rows carry their scales: no kv_scale
    out_strides = (H * D_V, D_V) if x.out is None else (x.out.stride(0), x.out.stride(1))
    grid, static, constexprs, options = fp8_launch_args(x.q, x.kv_cache, x.indices, num_kv_splits=splits,
                                                        ids_per_split=launch.ids_per_split, out_strides=out_strides,
                                                        kv_dtype=plan.spec.kv_dtype)
    decode, combine = _gluon_launches("gluon_fp8", _FP8_DYNAMIC, launch, x, device, grid, static, constexprs, options,
                                      out_strides)
    # the producer's hinted loads need 16-byte aligned rows (rows_16b): a pool whose pointer is not (the strides
    # are the plan's) takes the same kernel gathering with gl.load (compiled at its first such call)
    unaligned, _ = (_gluon_launches("gluon_fp8", _FP8_DYNAMIC, launch, x, device, grid, static,
                                    dict(constexprs, ROWS_16B=False), options, out_strides)
                    if constexprs["ROWS_16B"] else (decode, None))
    errors = _compile_errors()

    def run(x: DecodeInputs, lse: Optional[torch.Tensor] = None) -> Result:
        topk_length = _contiguous_topk_length(x)
        align = alignment_key(x.q, x.kv_cache, x.indices, x.sinks, topk_length, x.out, lse)
        out, lse, part_out, part_lse = _call_buffers(x, lse, splits, out_dtype)
        sinks = x.sinks if x.sinks is not None else lse
        # validated calls always carry kv_scale with an e4m3 cache; a one made per call (not cached) is
        # filled in a CUDA graph's replay too; V3.2 rows: a placeholder the kernel never reads
        if ds:
            kv_scale = lse
        else:
            kv_scale = x.kv_scale if x.kv_scale is not None else torch.ones(1, dtype=torch.float32, device=x.q.device)
        launch_decode = decode if align is True or x.kv_cache.data_ptr() % ROW_ALIGN == 0 else unaligned
        try:
            launch_decode(align, x.q, x.kv_cache, x.indices, sinks, topk_length if topk_length is not None else lse,
                          kv_scale, out, lse, part_out, part_lse, x.sm_scale)
        except errors as e:
            return _fall_back(plan, launch.kernel, e, x, lse)
        if split:
            combine(align, part_out, part_lse, sinks, out, lse)
        return out, lse

    return run


def _contiguous_topk_length(x: DecodeInputs) -> Optional[torch.Tensor]:
    """The call's ``topk_length`` with unit stride, as every kernel here reads it (a copy only when strided)."""
    topk_length = x.topk_length
    if topk_length is not None and topk_length.stride(0) != 1:
        topk_length = topk_length.contiguous()
    return topk_length


def _call_buffers(x: DecodeInputs, lse: Optional[torch.Tensor], splits: int, out_dtype: torch.dtype) -> tuple:
    """``(out, lse, part_out, part_lse)`` of one Gluon launch: ``out [T, H, 512]`` (``x.out`` when given) and
    fp32 ``lse [T, H]`` (``lse`` when given); with ``splits > 1`` fresh fp32 partials ``[T, splits, H, 512]``
    and base-2 LSEs ``[T, splits, H]`` for the combine, else ``lse`` twice (a placeholder the kernel never
    reads)."""
    T, H, _ = x.q.shape
    dev = x.q.device
    out = x.out if x.out is not None else torch.empty((T, H, D_V), dtype=out_dtype, device=dev)
    if lse is None:
        lse = torch.empty((T, H), dtype=torch.float32, device=dev)
    if splits > 1:
        return (out, lse, torch.empty((T, splits, H, D_V), dtype=torch.float32, device=dev),
                torch.empty((T, splits, H), dtype=torch.float32, device=dev))
    return out, lse, lse, lse


def _fall_back(plan, kernel: str, error: BaseException, x: DecodeInputs, lse: Optional[torch.Tensor]) -> Result:
    """Record the compile failure (every later plan names the portable kernel and why) and run this
    call on the portable kernel, into the caller's ``lse`` buffer when one was given (a token range's rows of the
    whole call's, :func:`_token_ranges`)."""
    import warnings

    from mla_sink.core.plan import mark_kernel_failed

    reason = f"{type(error).__name__}: {str(error)[:300]}"
    mark_kernel_failed(kernel, reason)
    warnings.warn(f"mla_sink: kernel {kernel} failed to compile here ({reason[:200]}); the portable kernel serves "
                  "these calls (mla-sink explain shows the reason)", RuntimeWarning, stacklevel=4)
    return prepare_triton(_portable_plan(plan), x)(x, lse)


def _portable_plan(plan: Any) -> Any:
    """``plan`` made again once a Gluon kernel is marked failed: the planner names the portable kernel."""
    import attrs

    from mla_sink.core.plan import build_plan

    replanned = build_plan(plan.spec, plan.platform, num_tokens=plan.num_tokens,
                           path=None if plan.row_id != "forced" else plan.path)
    if replanned.launch.kernel != PORTABLE:  # pragma: no cover - the planner honours failed kernels
        replanned = attrs.evolve(replanned, launch=attrs.evolve(replanned.launch, kernel=PORTABLE,
                                                                 exact_recompute=False))
    return replanned


def triton_plan_for(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
                    sinks: Optional[torch.Tensor] = None, logit_cap: float = 0.0,
                    num_kv_splits: Optional[int] = None, kernel: Optional[str] = None) -> Any:
    """The ``triton`` :class:`~mla_sink.core.plan.LaunchPlan` of a call on the tensors' device (tests,
    benchmarks): ``plan.launch`` names the kernel, tiles and split count. ``num_kv_splits`` forces the split
    count; ``kernel='portable'`` keeps the Gluon kernels out."""
    import attrs

    from mla_sink.core.describe import tensor_facts
    from mla_sink.core.plan import build_plan, failed_kernels
    from mla_sink.core.platform import detect_platform
    from mla_sink.core.records import CallSpec
    from mla_sink.paths.triton.plan import plan_triton_launch

    spec = CallSpec(q_dtype=DTYPE_KEYS[q.dtype], kv_dtype=kv_dtype_key(kv_cache), num_heads=q.shape[1],
                    topk=indices.shape[1], sinks=sinks is not None, need_lse=True, logit_cap=logit_cap,
                    **tensor_facts(DecodeInputs(q, kv_cache, indices)))
    platform = detect_platform(q.device)
    plan = build_plan(spec, platform, path="triton")
    launch = plan_triton_launch(arch=platform.arch, q_dtype=spec.q_dtype, kv_dtype=spec.kv_dtype,
                                num_heads=spec.num_heads, num_tokens=q.shape[0], topk=spec.topk,
                                logit_cap=spec.logit_cap, gluon=platform.gluon and kernel != "portable",
                                num_sms=platform.num_sms or 1, num_kv_splits=num_kv_splits,
                                failed=failed_kernels(),  # as build_plan: a kernel that failed to compile is not named
                                gather_aligned=spec.gather_aligned, unit_rows=spec.unit_rows)
    return attrs.evolve(plan, num_tokens=q.shape[0], launch=launch)


def sparse_mla_decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sinks: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    *,
    topk_length: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    kv_scale: Optional[torch.Tensor] = None,
    logit_cap: float = 0.0,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    num_kv_splits: Optional[int] = None,
    kernel: Optional[str] = None,
    config: Any = None,
) -> Result:
    """The ``triton`` path on one call, planned here (tests and benchmarks; engines use
    :func:`mla_sink.sparse_mla_decode`, which plans once per shape).

    Args:
        q: ``[T, H, 576]`` bf16 / fp16 / fp8 (e4m3fn or e4m3fnuz), innermost stride 1.
        kv_cache: ``[N, 576]`` rows (one shared KV head; value = first 512 columns), innermost stride 1; or
            the 656-byte ``fp8_ds_mla`` rows, uint8 ``[N, 656]`` / ``[num_blocks, block_size, 656]``
            (:func:`mla_sink.core.validate.check_ds_mla_cache`), with bf16/fp16 q and no ``kv_scale``.
        indices: int32 ``[T, topk]``; ``-1``, negative and ``>= N`` ids are skipped wherever they sit.
        sinks: optional fp32 ``[H]`` natural-log sink logits (not scaled by ``sm_scale``), any stride.
        sm_scale: multiplies ``q.k``; default ``576 ** -0.5``.
        topk_length: optional int32 ``[T]``; only the first ``topk_length[t]`` ids of row t are used.
        q_scale, kv_scale: fp32 ``[1]`` / ``[]`` dequantisation scales for fp8 q / fp8 KV.
        logit_cap: ``> 0`` soft-caps the scaled logits, ``s = cap * tanh(s / cap)``.
        out: optional ``[T, H, 512]`` output buffer (q's dtype; bf16 for fp8 q; fp32 for a DCP partial).
        lse: optional fp32 ``[T, H]`` buffer (contiguous), written in full.
        num_kv_splits: force the KV split count (default: the tuning table's, for this device's SMs).
        kernel: force ``portable`` (default: the tuning table's kernel).
        config: a :class:`~mla_sink.paths.triton.plan.TritonConfig` overriding the tuning table's tiles
            and split policy (tile sweeps).

    Returns:
        ``(out, lse)`` as :func:`prepare_triton` describes.

    Raises:
        ValueError: ``num_kv_splits`` given and not a positive int, ``kernel`` neither None nor ``'portable'``.
            Tensors are not validated here (:mod:`mla_sink.core.validate` does that for the public entry points),
            except what :func:`mla_sink.paths.prepare_runner` checks per call (an ``fp8_ds_mla`` pointer).
    """
    import attrs

    if num_kv_splits is not None and (isinstance(num_kv_splits, bool) or not isinstance(num_kv_splits, int)
                                      or num_kv_splits < 1):
        raise ValueError(f"'num_kv_splits' must be None or an int >= 1 (got {num_kv_splits!r})")
    if kernel is not None and kernel != PORTABLE:  # a misspelt name was ignored (the table's kernel ran)
        raise ValueError(f"'kernel' must be None (the tuning table's kernel) or {PORTABLE!r} (got {kernel!r})")
    plan = triton_plan_for(q, kv_cache, indices, sinks=sinks, logit_cap=logit_cap, num_kv_splits=num_kv_splits,
                           kernel=kernel)
    launch, spec, platform = plan.launch, plan.spec, plan.platform
    if config is not None:  # hand-built tiles (tests, sweeps): the portable kernel with them
        from mla_sink.paths.triton.plan import portable_launch

        launch = portable_launch(config, num_heads=spec.num_heads, num_tokens=q.shape[0], topk=spec.topk,
                                 num_sms=platform.num_sms or 1, num_kv_splits=num_kv_splits)
    plan = attrs.evolve(plan, num_tokens=q.shape[0], launch=launch)
    sinks = sinks.contiguous() if sinks is not None else None  # the kernels read them at unit stride
    x = DecodeInputs(q=q, kv_cache=kv_cache, indices=indices,
                     sm_scale=D_QK ** -0.5 if sm_scale is None else float(sm_scale), sinks=sinks,
                     topk_length=topk_length, q_scale=q_scale, kv_scale=kv_scale, out=out, logit_cap=logit_cap)
    from mla_sink.paths import prepare_runner  # with the per-call checks every entry point's runner makes

    return prepare_runner(plan, x)(x, lse)
