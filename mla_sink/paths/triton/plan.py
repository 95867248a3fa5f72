"""The launch plan of the ``triton`` path: which kernel runs a call, with which tiles and KV splits.

Everything that depends on the hardware or the dtypes is a row of ``tables/triton_tuning.yaml``, whose
paths are the kernels (``portable``, ``gluon_seesaw``, ``gluon_fp8``). :func:`plan_triton_launch` is the one
pure function that builds a call's :class:`TritonLaunch`, by two lookups of that table:

1. with ``num_kv_splits = None``: no Gluon row can match (each needs a split count), so the first
   ``portable`` row that does gives the tiles and the split policy (:func:`triton_config`);
2. the split count is computed from the shapes and the SM count (:func:`split_plan`, pure);
3. with that count: a Gluon row placed before the portable row it overrides names the kernel where its
   conditions (arch, Gluon dialect, dtypes, head count, split count, no soft cap, ``topk``) hold; otherwise the
   same portable row wins again (portable rows never test ``num_kv_splits``).

:func:`tuning_table` checks, every time the table loads, that the rule-table checker finds no gap and no
shadowed row, and the structure this two-step lookup relies on.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Optional

import attrs

from mla_sink.dispatch import readonly
from mla_sink.core.dtypes import DS_MLA_KEYS
from mla_sink.core.records import COUNT_MAX, D_V
from mla_sink.core.tables import load_checked_table

#: The kernel of every ``portable`` row: the one the first lookup always yields and the one a Gluon
#: kernel that failed to compile falls back to.
PORTABLE = "portable"
#: The seesaw kernel, whose V3.2 launches carry an exact recompute (:attr:`TritonLaunch.exact_recompute`).
SEESAW = "gluon_seesaw"
#: The tuning table's paths: every kernel the Triton launcher can run.
KERNELS = (PORTABLE, SEESAW, "gluon_fp8")

#: CUDA caps a grid's y and z dimensions at 65535 (CUDA C++ Programming Guide, "Features and Technical
#: Specifications": maximum y- or z-dimension of a grid of thread blocks; AMD GPUs under HIP allow 65536, so the
#: smaller bound serves both). Every Triton kernel here puts the tokens on one of them (the decode kernels on z, the
#: combine and the DCP merge on y), so a call of more tokens runs as launches over ranges of at most this many
#: tokens each (:func:`token_ranges`, :func:`mla_sink.paths.triton.launch.prepare_triton`).
MAX_GRID_TOKENS = 65535
#: A token range below the last is a multiple of this many tokens (65532 at the bound above): 4-byte per-token
#: values (``topk_length``; ``lse`` at any head count) then start every range 16-byte aligned, as the Gluon kernels'
#: pointers must be (a misaligned range would take the portable kernel).
RANGE_ALIGN = 4


def token_ranges(num_tokens: int, limit: int = MAX_GRID_TOKENS) -> list:
    """The consecutive token ranges ``[(a, b), ...]`` a call of ``num_tokens`` tokens runs as: one range when it
    fits a grid (``<= limit``: :data:`MAX_GRID_TOKENS`), none for no tokens; otherwise ranges of the largest
    multiple of :data:`RANGE_ALIGN` up to ``limit`` (the whole ``limit`` when it is smaller: tests lower it), the
    last one shorter."""
    if num_tokens <= limit:
        return [(0, num_tokens)] if num_tokens > 0 else []
    step = limit - limit % RANGE_ALIGN if limit >= RANGE_ALIGN else limit
    return [(a, min(a + step, num_tokens)) for a in range(0, num_tokens, step)]

#: The field of the tuning table whose ``multiple_of`` requirement on the ``gluon_seesaw`` path is the multiple the
#: seesaw's gather strides must be (:func:`seesaw_stride_multiple`): contiguous ``indices [T, topk]`` have the row
#: stride ``topk``, so the lookups reject the seesaw rows for another ``topk`` and the launcher checks the strides of
#: the call's own tensors against the same multiple.
TOPK_FIELD = "topk"

#: The :class:`~mla_sink.core.records.CallSpec` fields (and tuning-table fields) of the strides the Gluon kernels
#: gather with: ``gather_aligned`` (:func:`gather_strides_aligned`; the ``gluon_seesaw`` path requires it) and
#: ``unit_rows`` (:func:`rows_unit_stride`; both Gluon paths require it). :func:`_check_structure` checks the table
#: requires them so, since the launchers take a Gluon plan as the promise that these hold for the call's tensors.
GATHER_FIELD = "gather_aligned"
UNIT_ROWS_FIELD = "unit_rows"
#: The paths that must require each of the fields above ``{eq: true}`` (what their launchers rely on).
_STRIDE_REQUIREMENTS = {SEESAW: (GATHER_FIELD, UNIT_ROWS_FIELD), "gluon_fp8": (UNIT_ROWS_FIELD,)}
#: Bytes every data pointer of a ``gluon_seesaw`` call must be a multiple of (its 16-byte ``cp.async`` gathers; Triton
#: also specialises pointer arguments on it). Per call, so no plan can see it: the seesaw's runner checks each call's
#: pointers and runs the portable kernel for a call where one is not (:attr:`TritonLaunch.per_call`).
POINTER_ALIGN = 16


def gather_strides_aligned(q, kv_cache, indices) -> bool:
    """:attr:`CallSpec.gather_aligned <mla_sink.core.records.CallSpec>`: whether ``q``'s token and head strides and
    ``kv_cache``'s first stride (its row stride; a paged V3.2 cache's block stride) are multiples of
    :func:`seesaw_stride_multiple` (the tuning table's ``N``), and ``indices``' row stride is one too or is ``topk``
    (contiguous ids, whose row stride the seesaw path's ``topk: {multiple_of: N}`` tests). Tensors with the contiguous
    strides of their shape have it (as explain's default assumes; a dimension of size 1 counts with the stride it has,
    which torch's ``is_contiguous`` ignores: ``[:, :2048]`` of a ``[1, 2049]`` tensor has row stride 2049 and plans
    the portable kernel); with that ``topk`` requirement it makes every stride the seesaw gathers
    with a multiple of ``N`` (:func:`seesaw_strides_ok`). Strides in elements; reads metadata only.

    Args:
        q: ``[T, H, 576]`` tensor. kv_cache: ``[N, 576]`` or the V3.2 uint8 ``[N, 656]`` /
            ``[num_blocks, block_size, 656]`` tensor. indices: ``[T, topk]`` tensor (any dtypes: only strides read).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped tuning table is malformed.
    """
    multiple = seesaw_stride_multiple()
    row = indices.stride(0)
    return (all(s % multiple == 0 for s in (q.stride(0), q.stride(1), kv_cache.stride(0)))
            and (row % multiple == 0 or row == indices.shape[1]))


def seesaw_strides_ok(q, kv_cache, indices) -> bool:
    """Whether every stride the ``gluon_seesaw`` kernel gathers with (``q``'s token and head strides, ``kv_cache``'s
    first stride, ``indices``' row stride, in elements) is a multiple of :func:`seesaw_stride_multiple` and the rows
    are unit-stride (:func:`rows_unit_stride`): what its launcher checks once per signature, which a seesaw plan
    promises (``gather_aligned``, ``unit_rows`` and ``topk: {multiple_of: N}`` are its path's requirements).
    Tensors as :func:`gather_strides_aligned` takes them.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped tuning table is malformed.
    """
    # the plan's facts, with the seesaw path's topk rule applied to the ids' row stride itself
    return (gather_strides_aligned(q, kv_cache, indices) and indices.stride(0) % seesaw_stride_multiple() == 0
            and rows_unit_stride(q, kv_cache, indices))


def rows_unit_stride(q, kv_cache, indices) -> bool:
    """Whether the rows of ``q``, ``kv_cache`` and ``indices`` are unit-stride (``stride(-1) == 1``), as the Gluon
    kernels read them: :attr:`CallSpec.unit_rows <mla_sink.core.records.CallSpec>`. Reads metadata only (tensors as
    :func:`gather_strides_aligned` takes them)."""
    return all(t.stride(-1) == 1 for t in (q, kv_cache, indices))


#: Smallest head block: ``tl.dot`` needs at least 16 rows (M), so fewer heads are padded to 16 (the
#: combine kernel's head block takes the same floor).
MIN_BLOCK_H = 16

#: Params of a portable row (every one required) -> :class:`TritonConfig` attribute.
_PARAM_NAMES = {
    "BLOCK_H": "block_h", "BLOCK_N": "block_n", "num_warps": "num_warps", "num_stages": "num_stages",
    "max_kv_splits": "max_kv_splits", "min_ids_per_split": "min_ids_per_split",
    "split_waves": "split_waves", "split_min_fill": "split_min_fill", "combine_block_h": "combine_block_h",
    "combine_block_d": "combine_block_d", "min_combine_block_d": "min_combine_block_d", "fp8_f16": "fp8_f16",
}


def all_heads_block(num_heads: int) -> int:
    """The head block that holds every one of ``num_heads`` heads: ``max(MIN_BLOCK_H, next_pow2(num_heads))`` (16
    is ``tl.dot``'s smallest M), the bound every head block of a launch, a combine or a DCP merge is clamped to."""
    return max(MIN_BLOCK_H, 1 << max(0, (num_heads - 1).bit_length()))


def is_pow2(n: object) -> bool:
    """``n`` is an int (not a bool) and a positive power of two: the shape of every tile size."""
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


#: :class:`TritonConfig` attribute -> its param in the table (named so in the validators' errors).
_ATTR_PARAMS = {v: k for k, v in _PARAM_NAMES.items()}
#: Triton launches 1-32 warps a program (a power of two).
MAX_WARPS = 32
#: The largest head block, id block or combine head block a tuning row may give: a ``[BLOCK_N, 576]`` tile of 256
#: ids is 147,456 elements (288 KB in bf16, beyond any GPU's shared memory; the interpreter caps a tensor at 2^20
#: elements); the shipped rows give at most 64.
MAX_TILE = 256
#: The most software-pipeline stages a tuning row may give (each holds a KV tile in shared memory; the rows give 1-3).
MAX_STAGES = 8


def _int_in(low: int, high: int = COUNT_MAX, pow2: bool = False, divides: int = 0):
    """An attrs validator: an int (not a bool) in ``[low, high]``, a power of two if ``pow2``, dividing ``divides``
    if given; the error names the table param (``BLOCK_N``, ``num_warps``, ...) and what is allowed."""
    def check(_, attribute, value) -> None:
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        ok = ok and (not pow2 or is_pow2(value)) and (not divides or divides % value == 0)
        if not ok:
            allowed = (f"a power of two in [{low}, {high}]" if pow2 else f"an int in [{low}, {high}]") + (
                f" dividing {divides}" if divides else "")
            raise ValueError(f"param {_ATTR_PARAMS.get(attribute.name, attribute.name)!r} must be {allowed} "
                             f"(got {value!r})")
    return check


def _finite(low: float, inclusive: bool):
    """An attrs validator: a finite real (int or float, not a bool) above ``low`` (or equal, if ``inclusive``)."""
    def check(_, attribute, value) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low or (value == low and not inclusive):
            raise ValueError(f"param {_ATTR_PARAMS.get(attribute.name, attribute.name)!r} must be a finite number "
                             f"{'>=' if inclusive else '>'} {low} (got {value!r})")
    return check


def _bool(_, attribute, value) -> None:
    """An attrs validator: a bool (a YAML ``true`` / ``false``)."""
    if not isinstance(value, bool):
        raise ValueError(f"param {_ATTR_PARAMS.get(attribute.name, attribute.name)!r} must be true or false "
                         f"(got {value!r})")


def _not_above_combine(cfg, _, value) -> None:
    """An attrs validator: ``min_combine_block_d`` may not exceed ``combine_block_d``, since the combine narrows its
    columns from the latter down to the former (:func:`combine_block_d_for`)."""
    if value > cfg.combine_block_d:
        raise ValueError(f"param 'min_combine_block_d' must be <= combine_block_d={cfg.combine_block_d} "
                         f"(got {value})")


@attrs.frozen
class TritonConfig:
    """Tiles and split policy of the portable kernel: the params of a ``portable`` row of the tuning
    table (:func:`triton_config`), or built by hand (tests, sweeps), every one given.

    Attributes:
        block_h: head block (a power of two >= 16); clamped per call by :meth:`block_h_for`.
        block_n: ids gathered per loop step (a power of two >= 16).
        num_warps, num_stages: Triton launch options.
        max_kv_splits: upper bound on KV splits per token.
        min_ids_per_split: lower bound on ids per split.
        split_waves: target programs per SM when splitting.
        split_min_fill: split only when the unsplit grid has fewer than this fraction of the SMs' programs.
        combine_block_h: head block of the combine kernel.
        combine_block_d: value columns per combine program (a power of two dividing 512).
        min_combine_block_d: the narrowest columns :func:`combine_block_d_for` narrows ``combine_block_d`` to
            (a power of two, at most ``combine_block_d``).
        fp8_f16: with fp8 KV, compute in fp16 tiles (one-instruction fp8 -> fp16 conversion; bf16 q is
            scaled per head row by a power of two to fit fp16) instead of bf16 tiles.
        row, why, source: the table row that produced it (``"explicit"`` and empty when built by hand).

    Raises:
        ValueError: a value outside what is allowed above (naming the table's param), checked at construction,
            so a tuning row with one is refused when the table loads (:func:`_check_structure`).
    """

    block_h: int = attrs.field(validator=_int_in(MIN_BLOCK_H, MAX_TILE, pow2=True))
    block_n: int = attrs.field(validator=_int_in(MIN_BLOCK_H, MAX_TILE, pow2=True))
    num_warps: int = attrs.field(validator=_int_in(1, MAX_WARPS, pow2=True))
    num_stages: int = attrs.field(validator=_int_in(1, MAX_STAGES))
    max_kv_splits: int = attrs.field(validator=_int_in(1))
    min_ids_per_split: int = attrs.field(validator=_int_in(1))
    split_waves: float = attrs.field(validator=_finite(0.0, inclusive=False))
    split_min_fill: float = attrs.field(validator=_finite(0.0, inclusive=True))
    combine_block_h: int = attrs.field(validator=_int_in(1, MAX_TILE, pow2=True))
    combine_block_d: int = attrs.field(validator=_int_in(1, D_V, pow2=True, divides=D_V))
    min_combine_block_d: int = attrs.field(validator=[_int_in(1, D_V, pow2=True, divides=D_V),
                                                      _not_above_combine])
    fp8_f16: bool = attrs.field(validator=_bool)
    row: str = "explicit"
    why: str = ""
    source: str = ""

    def block_h_for(self, num_heads: int) -> int:
        """Head block for ``num_heads`` heads: ``min(block_h, max(MIN_BLOCK_H, next_pow2(num_heads)))``."""
        return min(self.block_h, all_heads_block(num_heads))


@attrs.frozen
class TritonLaunch:
    """How the Triton launcher runs one call; built by :func:`plan_triton_launch` (or :func:`portable_launch`
    for a hand-built :class:`TritonConfig`). Pure data: printable by ``mla-sink explain``.

    Attributes:
        kernel: the tuning table's path: ``"portable"`` (:mod:`mla_sink.kernels.triton.portable`, plus
            :mod:`mla_sink.kernels.triton.combine` when split), ``"gluon_seesaw"``
            (:mod:`mla_sink.kernels.gluon.gluon_seesaw`, plus the combine when split) or ``"gluon_fp8"``
            (:mod:`mla_sink.kernels.gluon.gluon_fp8`).
        kernel_row, kernel_why: the row that named the kernel (the second lookup's winner; the tuning row
            when the split count is open or a Gluon kernel fell back).
        tuning_row, why, source: the portable row that gave the tiles and the split policy.
        block_h, block_n, num_warps, num_stages: the portable kernel's head block (already clamped to the
            call's head count), ids per step and Triton launch options.
        combine_block_h, combine_block_d: the combine kernel's tile (heads clamped like ``block_h``; columns
            narrowed for small batches by :func:`combine_block_d_for`).
        fp8_f16: with fp8 KV, fp16 tiles instead of bf16 (the row's param; unused without fp8 KV).
        num_kv_splits, ids_per_split: KV splits per token (1 = no combine) and ids per split (a multiple
            of ``block_n``); ``None`` when the SM count is unknown and no count was forced.
        rejected_kernels: ``(row id, reason)`` of each Gluon row the deciding lookup rejected (the
            second; the first when the split count is open), the reason listing every failed condition.
        fallback: why the kernel is ``portable`` although a Gluon row matched (it failed to compile here);
            ``None`` otherwise. (A ``topk`` the seesaw does not take is a failed requirement of its path in the
            table: its rows are among ``rejected_kernels``.)
        exact_recompute: the seesaw on V3.2 rows (``fp8_ds_mla``): it decodes tiles into bf16, exact only for
            scales of 0 or a power of two (:data:`mla_sink.core.kv_layout.BF16_EXACT_SCALE_EXP`), and flags the
            programs that meet any other scale; a second launch of the same grid, gated by those flags, recomputes
            them reading every scale exactly (:mod:`mla_sink.kernels.gluon.gluon_seesaw`). Set by the planner, read
            by the launcher and ``mla-sink explain``; only with ``kernel="gluon_seesaw"``.
        per_call: what the launcher checks on each call, which no plan can see, and does when it fails: on
            ``gluon_seesaw``, a call whose data pointers are not all :data:`POINTER_ALIGN`-byte aligned runs the
            portable kernel (with this launch's tiles and split count); ``None`` for the other kernels (the stride
            facts are the call signature's: :attr:`CallSpec.gather_aligned <mla_sink.core.records.CallSpec>` and
            ``unit_rows``, requirements of the Gluon paths in the table, so their rows are among
            ``rejected_kernels`` for a call without them).
    """

    kernel: str = attrs.field(validator=attrs.validators.in_(KERNELS))
    kernel_row: str
    kernel_why: str
    tuning_row: str
    why: str
    source: str
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    combine_block_h: int
    combine_block_d: int
    fp8_f16: bool
    num_kv_splits: Optional[int]
    ids_per_split: Optional[int]
    rejected_kernels: tuple = ()
    fallback: Optional[str] = None
    exact_recompute: bool = attrs.field(default=False)
    per_call: Optional[str] = None

    @exact_recompute.validator
    def _recompute_needs_the_seesaw(self, attribute, value) -> None:
        if value and self.kernel != SEESAW:
            raise ValueError(f"exact_recompute is the {SEESAW} kernel's second launch (got kernel={self.kernel!r})")


def _check_structure(table) -> None:
    """What the two-lookup plan relies on, beyond the generic checker (see the module docstring).

    Raises:
        dispatch.TableError: the table's paths are not :data:`KERNELS`; a row refuses; a portable row tests
            ``num_kv_splits``, lacks a param (or has an unknown one) or gives one a value :class:`TritonConfig`
            refuses (type, range, power of two; ``min_combine_block_d`` above ``combine_block_d``); a Gluon row has
            params or can match ``num_kv_splits = None``; the ``gluon_seesaw`` path does not require ``topk`` to be
            a multiple of one number (:func:`_stride_multiple`); a Gluon path does not require ``{eq: true}`` of the
            stride fields its launcher relies on (``gather_aligned`` and ``unit_rows`` for the seesaw, ``unit_rows``
            for ``gluon_fp8``). A row's params are those the lookups read: its own
            over its path's defaults.
    """
    from mla_sink import dispatch

    where = table.source_file or table.name
    if tuple(table.paths) != KERNELS:
        raise dispatch.TableError(f"{where}: the paths must be the kernels {KERNELS} (got {tuple(table.paths)})")
    _stride_multiple(table)
    for path, fields in _STRIDE_REQUIREMENTS.items():
        required = {c.field for c in table.paths[path].requires if c.op == "eq" and c.arg is True}
        for field in fields:
            if field not in required:
                raise dispatch.TableError(
                    f"{where}:{table.paths[path].line}: path {path!r} must require {field}: {{eq: true}} (its "
                    f"launcher takes a {path} plan as the promise that the call's tensors have it: "
                    "mla_sink/paths/triton/launch.py)")
    for row in table.rows:
        if row.is_refusal:  # the lookups need a kernel for every call the mla_decode table sent to the triton path
            raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: the tuning table has no refusal rows "
                                      f"(every row names a kernel, one of {KERNELS}; tables/mla_decode.yaml decides "
                                      "which calls the triton path serves)")
        params = table.row_params(row)  # what the lookups read: the row's own params over its path's defaults
        tests_splits = [c for c in row.when if c.field == "num_kv_splits"]
        if row.path != PORTABLE:  # a Gluon row also needs what its path requires
            tests_splits += [c for c in table.paths[row.path].requires if c.field == "num_kv_splits"]
        if row.path == PORTABLE:
            if tests_splits:
                raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: a portable row must not test "
                                          "num_kv_splits (the second lookup must find the first one's row again)")
            if set(params) != set(_PARAM_NAMES):
                raise dispatch.TableError(
                    f"{where}:{row.line}: row {row.id!r}: a portable row gives exactly the params "
                    f"{sorted(_PARAM_NAMES)}, its path's defaults included (missing "
                    f"{sorted(set(_PARAM_NAMES) - set(params))}, unknown {sorted(set(params) - set(_PARAM_NAMES))})")
            try:  # each param's type and range (TritonConfig's validators), before any call plans with them
                TritonConfig(**{_PARAM_NAMES[k]: v for k, v in params.items()})
            except ValueError as exc:
                raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: {exc}") from None
        else:
            if params:
                raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: a Gluon row takes no params, nor "
                                          f"does its path (the tiles come from the portable row; got {dict(params)})")
            if all(c.holds(None) for c in tests_splits):
                raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: a Gluon row must need a split "
                                          "count (e.g. num_kv_splits: 1), or the first lookup could pick it")


def _stride_multiple(table) -> int:
    """The ``N`` of the ``gluon_seesaw`` path's requirement ``topk: {multiple_of: N}`` in the tuning table ``table``.

    Raises:
        dispatch.TableError: the path requires no such multiple, or more than one (its launcher checks the call's
            strides against exactly one).
    """
    from mla_sink import dispatch

    found = [c.arg for c in table.paths[SEESAW].requires if c.field == TOPK_FIELD and c.op == "multiple_of"]
    if len(found) != 1:
        where = table.source_file or table.name
        line = table.paths[SEESAW].line
        raise dispatch.TableError(
            f"{where}:{line}: path {SEESAW!r} must require {TOPK_FIELD}: {{multiple_of: N}} once (the strides its "
            f"gather takes: contiguous indices have the row stride topk, and the launcher checks the call's q, "
            f"kv_cache and indices strides against N; got {len(found)})")
    return found[0]


@functools.lru_cache(maxsize=None)
def seesaw_stride_multiple() -> int:
    """The multiple (in elements) that every stride the ``gluon_seesaw`` kernel gathers with must be: the ``N`` of
    its path's requirement ``topk: {multiple_of: N}`` in ``tables/triton_tuning.yaml`` (16: Triton marks an integer
    argument 16-divisible only when it is). The plan rejects the seesaw rows for a ``topk`` that is not one (the row
    stride of contiguous ``indices``); :func:`mla_sink.paths.triton.launch.prepare_triton` checks the strides of
    ``q``, ``kv_cache`` and ``indices`` against it once per call signature. Cached.

    Returns:
        ``N``, a positive int.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed (:func:`tuning_table`).
    """
    return _stride_multiple(tuning_table())


@functools.lru_cache(maxsize=None)
def tuning_table():
    """``tables/triton_tuning.yaml``, loaded, proven by the rule-table checker (every combination of the
    declared domains gets a row, no row is shadowed) and checked for the two-lookup structure, once
    per process.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed.
    """
    return load_checked_table("triton_tuning", _check_structure)


@functools.lru_cache(maxsize=None)
def _lookup(arch: str, q_dtype: str, kv_dtype: str, num_heads: int, num_tokens: int, logit_cap: float,
            gluon: bool, num_kv_splits: Optional[int], topk: int, gather_aligned: bool = True,
            unit_rows: bool = True):
    """The tuning table's :class:`dispatch.Selection` for one set of field values.

    Raises:
        LookupError: no row matches.
    """
    sel = tuning_table().select(dict(arch=arch, q_dtype=q_dtype, kv_dtype=kv_dtype, num_heads=num_heads,
                                     num_tokens=num_tokens, logit_cap=float(logit_cap), gluon=gluon,
                                     num_kv_splits=num_kv_splits, topk=topk, gather_aligned=gather_aligned,
                                     unit_rows=unit_rows))
    if sel.row is None or sel.path is None:
        from mla_sink import dispatch

        raise LookupError(f"no row of the Triton tuning table serves this call:\n{dispatch.explain(sel)}")
    return sel


@functools.lru_cache(maxsize=None)
def triton_config(arch: str, q_dtype: str, kv_dtype: str, num_heads: int, num_tokens: int, *, topk: int,
                  logit_cap: float = 0.0, gluon: bool = False) -> TritonConfig:
    """Tiles and split policy for one call shape: the first lookup of ``tables/triton_tuning.yaml``
    (``num_kv_splits = None``, so its winner is a ``portable`` row). Cached.

    Args:
        arch: compile target (``sm90``, ``gfx942``, ``cpu``, ...).
        q_dtype, kv_dtype: dtype keys (``bf16``, ``fp16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``, ``fp8_ds_mla``).
        num_heads: H. num_tokens: T. topk: ids per token (an int >= 1). logit_cap: ``<= 0`` for none.
        gluon: Triton's Gluon dialect imports.

    Raises:
        LookupError: no row matches (the table's last row catches every GPU), or the winner is not a
            portable row (impossible for a table :func:`tuning_table` accepted).
        ValueError: a dtype key outside the table's closed domain.
    """
    sel = _lookup(arch, q_dtype, kv_dtype, num_heads, num_tokens, float(logit_cap), bool(gluon), None, topk)
    if sel.path != PORTABLE:
        raise LookupError(f"the tuning table's first lookup chose {sel.path!r} (row {sel.row.id}), not {PORTABLE!r}")
    return TritonConfig(row=sel.row.id, why=sel.row.why, source=sel.row.source,
                        **{_PARAM_NAMES[k]: v for k, v in sel.params.items()})


def num_kv_splits_for(cfg: TritonConfig, num_tokens: int, num_head_blocks: int, topk: int, num_sms: int) -> int:
    """KV splits per token: 1 when ``T * head blocks`` fills the GPU, else enough to reach ``split_waves``.

    A pure function of shapes and the SM count (no device data), so it is safe under CUDA-graph capture.
    """
    programs = max(1, num_tokens * num_head_blocks)
    if programs >= cfg.split_min_fill * num_sms:
        return 1
    want = math.ceil(cfg.split_waves * num_sms / programs)
    most = max(1, math.ceil(topk / cfg.min_ids_per_split))
    return max(1, min(want, cfg.max_kv_splits, most))


def combine_block_h_for(cfg: TritonConfig, num_heads: int) -> int:
    """Heads per combine program: the tuning row's ``combine_block_h``, clamped like ``block_h``. Pure."""
    return min(cfg.combine_block_h, all_heads_block(num_heads))


def combine_block_d_for(cfg: TritonConfig, num_tokens: int, num_heads: int, num_sms: Optional[int]) -> int:
    """Value columns per combine program: the tuning row's ``combine_block_d``, halved (down to its
    ``min_combine_block_d``) while the combine's programs (``T x head blocks x 512 / columns``) would
    not cover every SM once. Small batches are the ones that split, and their combine is a short, latency
    bound launch: more, narrower programs each wait on less. Pure."""
    block_d = min(cfg.combine_block_d, D_V)
    block_h = combine_block_h_for(cfg, num_heads)
    if num_sms is None:
        return block_d
    while block_d > cfg.min_combine_block_d and combine_programs(num_tokens, num_heads, block_h, block_d) < num_sms:
        block_d //= 2
    return block_d


def combine_programs(num_tokens: int, num_heads: int, block_h: int, block_d: int) -> int:
    """Programs of a combine launch over ``num_tokens`` tokens (at least one) with ``block_h x block_d`` tiles:
    ``T x head blocks x 512 / columns`` (:func:`combine_block_d_for`'s measure, and what explain prints). Pure."""
    return max(1, num_tokens) * -(-num_heads // block_h) * (D_V // block_d)


#: Params of a row of ``tables/dcp_merge.yaml`` (both required).
_MERGE_PARAMS = ("combine_block_h", "combine_block_d")


def _check_merge_rows(table) -> None:
    """Every row of ``tables/dcp_merge.yaml`` gives exactly its two params: ``combine_block_h`` a power of two
    ``>= MIN_BLOCK_H`` (or null: every head), ``combine_block_d`` a power of two dividing 512.

    Raises:
        dispatch.TableError: naming the row and its line.
    """
    from mla_sink import dispatch

    where = table.source_file or table.name
    for row in table.rows:
        if row.path is None:
            continue
        params = table.row_params(row)  # what dcp_merge_tile reads: the row's own params over its path's defaults
        h, d = params.get("combine_block_h"), params.get("combine_block_d")
        if set(params) != set(_MERGE_PARAMS) or not (h is None or (is_pow2(h) and h >= MIN_BLOCK_H)) \
                or not (is_pow2(d) and D_V % d == 0):
            raise dispatch.TableError(
                f"{where}:{row.line}: row {row.id!r}: a merge row gives exactly the params {list(_MERGE_PARAMS)}, "
                f"its path's defaults included: combine_block_h a power of two >= {MIN_BLOCK_H} or null, "
                f"combine_block_d a power of two dividing {D_V} (got {dict(params)})")


@functools.lru_cache(maxsize=None)
def dcp_merge_table():
    """``tables/dcp_merge.yaml`` (the DCP merge's tile), loaded, proven by the rule-table checker (every arch
    gets a row, no row is shadowed) and its params checked, once per process.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed.
    """
    return load_checked_table("dcp_merge", _check_merge_rows, paths=("merge",))


@functools.lru_cache(maxsize=None)
def dcp_merge_tile(arch: str, num_heads: int) -> tuple[int, int]:
    """``(heads, value columns)`` of one program of the DCP merge (``combine_states_triton`` without a ``tile``,
    :mod:`mla_sink.paths.triton.launch`) on ``arch``: the row of ``tables/dcp_merge.yaml``, its heads clamped to
    ``max(MIN_BLOCK_H, next_pow2(num_heads))`` (every head when the row says null). Pure; cached.

    Args:
        arch: compile target of the partials' device (``Platform.arch``: ``sm90``, ``gfx942``, ``cpu``, ...).
        num_heads: H (>= 1).

    Raises:
        LookupError: no row serves ``arch`` (impossible for a table :func:`dcp_merge_table` accepted).
    """
    sel = dcp_merge_table().select({"arch": arch})
    if sel.row is None or sel.path is None:
        from mla_sink import dispatch

        raise LookupError(f"no row of the DCP merge table serves this call:\n{dispatch.explain(sel)}")
    heads = all_heads_block(num_heads)
    block_h = sel.params["combine_block_h"]
    return (heads if block_h is None else min(block_h, heads)), sel.params["combine_block_d"]


def split_plan(cfg: TritonConfig, num_tokens: int, num_heads: int, topk: int, num_sms: Optional[int],
               requested: Optional[int] = None) -> tuple[int, int]:
    """``(num_kv_splits, ids_per_split)`` of a launch: ``requested`` splits (default
    :func:`num_kv_splits_for`, which needs ``num_sms``), at most one per ``block_n`` ids, rounded so
    every split but the last holds a whole number of ``block_n`` blocks. Pure."""
    if requested is None:
        requested = num_kv_splits_for(cfg, num_tokens, -(-num_heads // cfg.block_h_for(num_heads)), topk, num_sms)
    ids = max(topk, 1)
    splits = max(1, min(int(requested), -(-ids // cfg.block_n)))
    ids_per_split = -(-(-(-ids // splits)) // cfg.block_n) * cfg.block_n
    return -(-ids // ids_per_split), ids_per_split


def portable_launch(config: TritonConfig, *, num_heads: int, num_tokens: int, topk: int, num_sms: Optional[int],
                    num_kv_splits: Optional[int] = None) -> TritonLaunch:
    """The portable kernel's :class:`TritonLaunch` with ``config``'s tiles (a tuning row's, or hand-built
    for tests and sweeps). Pure.

    Args:
        num_heads: H. num_tokens: T. topk: ids per token.
        num_sms: SMs of the device (1 for the CPU interpreter), or ``None`` when unknown.
        num_kv_splits: force a split count (capped at one per ``block_n`` ids); ``None`` lets
            :func:`num_kv_splits_for` pick it, which needs ``num_sms``: without either, the split count
            stays ``None`` (open).
    """
    splits = ids_per_split = None
    if num_sms is not None or num_kv_splits is not None:
        splits, ids_per_split = split_plan(config, num_tokens, num_heads, topk, num_sms, requested=num_kv_splits)
    return TritonLaunch(
        kernel=PORTABLE, kernel_row=config.row, kernel_why=config.why,
        tuning_row=config.row, why=config.why, source=config.source,
        block_h=config.block_h_for(num_heads), block_n=config.block_n,
        num_warps=config.num_warps, num_stages=config.num_stages,
        combine_block_h=combine_block_h_for(config, num_heads),
        combine_block_d=combine_block_d_for(config, num_tokens, num_heads, num_sms), fp8_f16=config.fp8_f16,
        num_kv_splits=splits, ids_per_split=ids_per_split,
    )


def _rejected_kernels(sel) -> tuple:
    """``(what, why)`` for the kernel rows a lookup rejected, as ``mla-sink explain`` says them: Gluon paths
    whose ``requires`` fail share one entry naming their rows; every other rejected Gluon row has its own;
    one statement per field, each reason given once."""
    from mla_sink import dispatch

    def rows(ids):
        return f"{'row' if len(ids) == 1 else 'rows'} {', '.join(ids)}"

    reasons = dispatch.ReasonsOnce()
    out: list = []
    shared: dict = {}  # the statements of failed requirements -> index in out
    for kind, name, ids, fails in dispatch.rejection_groups(sel):
        if kind == "path" and name != PORTABLE:
            said = tuple(dispatch.statements(fails))
            if said in shared:
                label, text = out[shared[said]]
                out[shared[said]] = (f"{label}, {name} ({rows(ids)})", text)
            else:
                shared[said] = len(out)
                out.append((f"{name} ({rows(ids)})", "; ".join(dispatch.statements(reasons(fails)))))
        elif kind == "row" and ids not in (None, PORTABLE):  # ("row", row id, its path, failures)
            out.append((name, "; ".join(dispatch.statements(reasons(fails)))))
    return tuple(out)


_NO_FAILURES: Mapping[str, str] = readonly({})


def plan_triton_launch(*, arch: str, q_dtype: str, kv_dtype: str, num_heads: int, num_tokens: int, topk: int,
                       logit_cap: float, gluon: bool, num_sms: Optional[int], num_kv_splits: Optional[int] = None,
                       failed: Mapping[str, str] = _NO_FAILURES, gather_aligned: bool = True,
                       unit_rows: bool = True) -> TritonLaunch:
    """The :class:`TritonLaunch` of one call: kernel, tiles and KV splits, from two lookups of
    ``tables/triton_tuning.yaml`` (module docstring). Pure: no device query, safe under CUDA-graph capture
    and testable on the CPU.

    Args:
        arch: compile target (``Platform.arch``: ``sm90``, ``gfx942``, ``cpu``, ...).
        q_dtype, kv_dtype: dtype keys (``bf16``, ``fp16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``).
        num_heads: H. num_tokens: T. topk: ids per token (index columns).
        logit_cap: the call's soft cap (``<= 0``: none).
        gluon: whether Triton's Gluon dialect imports here (``Platform.gluon``).
        num_sms: SMs of the device (1 for the CPU interpreter); ``None`` leaves the split count, and so
            the kernel, open (``num_kv_splits``/``ids_per_split`` ``None``, kernel ``portable``, the
            Gluon rows' rejections from the first lookup): ``mla-sink explain`` then says they depend on it.
        num_kv_splits: force a split count (tests, benches); needs no ``num_sms``.
        failed: kernel name -> compile error text of the kernels that failed to compile here: a Gluon
            kernel in it is replaced by the portable one, with ``fallback`` saying why. (A ``topk`` the seesaw does
            not take fails its path's requirement in the table: :func:`seesaw_stride_multiple`.)
        gather_aligned, unit_rows: the call's stride facts (:attr:`CallSpec.gather_aligned
            <mla_sink.core.records.CallSpec>`, ``unit_rows``; default True: contiguous tensors): requirements of the
            Gluon paths in the table, so a call without them is planned on the portable kernel, the Gluon rows
            rejected with the table's reason.

    Returns:
        The :class:`TritonLaunch`; a ``gluon_seesaw`` one carries :attr:`TritonLaunch.per_call` (the per-call
        pointer check).

    Raises:
        LookupError: no tuning row serves the call.
        ValueError: a dtype key outside the table's domain.
    """
    cfg = triton_config(arch, q_dtype, kv_dtype, num_heads, num_tokens, topk=topk, logit_cap=logit_cap, gluon=gluon)
    launch = portable_launch(cfg, num_heads=num_heads, num_tokens=num_tokens, topk=topk, num_sms=num_sms,
                             num_kv_splits=num_kv_splits)
    sel = _lookup(arch, q_dtype, kv_dtype, num_heads, num_tokens, float(logit_cap), bool(gluon), launch.num_kv_splits,
                  topk, bool(gather_aligned), bool(unit_rows))
    rejected = _rejected_kernels(sel)
    if sel.path == PORTABLE:  # the first lookup's row again (portable rows never test num_kv_splits)
        return attrs.evolve(launch, rejected_kernels=rejected)
    if sel.path in failed:
        return attrs.evolve(launch, rejected_kernels=rejected,
                            fallback=f"{sel.path} (row {sel.row.id}) failed to compile here: {failed[sel.path]}")
    return attrs.evolve(launch, kernel=sel.path, kernel_row=sel.row.id, kernel_why=sel.row.why,
                        rejected_kernels=rejected, exact_recompute=sel.path == SEESAW and kv_dtype in DS_MLA_KEYS,
                        per_call=SEESAW_PER_CALL if sel.path == SEESAW else None)


#: :attr:`TritonLaunch.per_call` of a ``gluon_seesaw`` launch (what its runner checks on every call).
SEESAW_PER_CALL = (f"runs the portable kernel (this launch's tiles and splits) for a call whose data pointers (q, "
                   f"kv_cache, indices, sinks, topk_length, out, lse) are not all {POINTER_ALIGN}-byte aligned (the "
                   f"seesaw gathers with {POINTER_ALIGN}-byte cp.async; checked per call, no plan sees pointers)")
