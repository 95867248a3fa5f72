"""select: (CallSpec, Platform) -> the kernel path, by the rule table ``tables/mla_decode.yaml``.

The table is the only place priority lives; this module only turns the records into the table's
fields and wraps the generic engine of :mod:`dispatch`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Optional

from mla_sink import dispatch

from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import call_key, CallSpec, check_records, Platform
from mla_sink.core.tables import load_checked_table

log = logging.getLogger("mla_sink")

#: Paths the runtime can launch (the table checker proves every row names one of the table's paths;
#: tests prove this set equals the table's).
KNOWN_PATHS = (
    "aiter_persistent",
    "aiter_lse",
    "aiter_lse_single_split",
    "aiter_lse_fp8_two_split",
    "triton",
    "reference",
)


class NoKernelError(RuntimeError):
    """A valid call that no rule-table row accepts, or that a row explicitly refuses (a ``RuntimeError``).

    Raised by :func:`plan_call` and everything that plans (:func:`mla_sink.prepare`, :func:`mla_sink.run`,
    :func:`mla_sink.sparse_mla_decode`, the layer, the operators); ``mla-sink explain`` prints the same text and
    exits with status 2.

    Attributes:
        selection: the :class:`dispatch.Selection` (winning refusal row or none, and every rejected row).
        explanation: the full text ``mla-sink explain`` prints for the same call.
    """

    def __init__(self, explanation: str, selection: Any) -> None:
        super().__init__(explanation)
        self.explanation = explanation
        self.selection = selection

    def __reduce__(self) -> tuple:  # pickled and copied with both arguments (a worker process's refusal keeps its text)
        return type(self), (self.explanation, self.selection), dict(self.__dict__)  # and any notes added to it


@functools.lru_cache(maxsize=None)
def mla_table() -> "dispatch.RuleTable":
    """The shipped ``mla_decode`` rule table, loaded, schema-checked and proven by the table checker
    (no gap, no shadowed row, path requirements hold) once per process.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed.
    """
    return load_checked_table("mla_decode", check_mla_table, paths=KNOWN_PATHS)  # no path the runtime cannot launch


#: Why a call forced onto the reference runs it (the forced plan's row in ``mla-sink explain --json``).
FORCED_REFERENCE_WHY = "forced: the float64 reference runs anywhere; no row consulted"
#: What explain says of a call forced onto the reference (:func:`explain_call`, ``mla-sink explain --path reference``).
FORCED_REFERENCE = f"  → reference   ({FORCED_REFERENCE_WHY})"


def check_mla_table(table: "dispatch.RuleTable") -> None:
    """What the runtime relies on in ``tables/mla_decode.yaml`` beyond the generic checker and the declared paths
    (:func:`mla_table` loads it with :data:`KNOWN_PATHS` as the only paths: an unknown one loaded, and a call it won
    then failed naming ``--path``, a break test, forty-third session): no refusal row binds ``reference`` (a forced
    reference is always honoured, :func:`plan_call`, so such a row would refuse in :func:`select` what runs); and each
    row's params are those its path's planner reads (:func:`mla_sink.paths.aiter.plan.check_mla_params`).

    Raises:
        dispatch.TableError: naming the file, line, path or row and what is allowed.
    """
    from mla_sink.paths.aiter.plan import check_mla_params  # the params each path's planner reads

    where = table.source_file or table.name
    for row in table.rows:
        if row.is_refusal and "reference" in row.paths:
            raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: a refusal row cannot bind 'reference' "
                                      f"(a call forced onto the reference always runs it)")
    check_mla_params(table)


def platform_fields(platform: Platform) -> dict[str, Any]:
    """The field values of ``tables/mla_decode.yaml`` that describe the machine (not the call), from the record:
    ``arch``, ``cuda_arch``, ``aiter_version``, ``aiter_experimental`` and ``triton``. Raises nothing (the record
    was checked when made)."""
    return {
        "arch": platform.arch,
        "cuda_arch": platform.cuda_arch,
        "aiter_version": platform.aiter_version,
        "aiter_experimental": platform.aiter_experimental,
        "triton": platform.triton,
    }


def path_platform_failures(path: str, platform: Platform) -> tuple:
    """The requirements of ``path`` (its ``requires`` in the table) that fail on ``platform`` for every call.

    Only the conditions on the machine's fields (:func:`platform_fields`) are evaluated; whether a
    given call shape is served is :func:`select`'s answer.

    Args:
        path: a path of the table. platform: the machine.

    Returns:
        The ``dispatch.Failure`` records (empty when the machine meets every such requirement).

    Raises:
        KeyError: ``path`` is not a path of the table.
    """
    return path_requirement_failures(path, platform_fields(platform))


def path_requirement_failures(path: str, values: dict[str, Any]) -> tuple:
    """The requirements of ``path`` (its ``requires`` in the table) on the given fields that these values fail; the
    conditions on other fields are not evaluated. A launcher checks the facts of its first call's tensors with it
    (e.g. ``{"kv_cache_bytes": ...}``), for a plan made for other tensors.

    Args:
        path: a path of the table. values: field name -> value, e.g. ``{"kv_cache_bytes": 2 ** 33}``.

    Returns:
        The ``dispatch.Failure`` records (empty when the values meet every such requirement).

    Raises:
        KeyError: ``path`` is not a path of the table.
    """
    fails = (cond.failure(values[cond.field]) for cond in mla_table().paths[path].requires if cond.field in values)
    return tuple(f for f in fails if f is not None)


def table_fields(spec: CallSpec, platform: Platform) -> dict[str, Any]:
    """The field values ``tables/mla_decode.yaml`` matches on, from the two records (:func:`platform_fields` and the
    call's dtypes, heads, LSE need, logit cap, row packing and pool bytes), plus ``sinks``, ``dcp_world_size`` and
    ``topk``, which no row matches and ``explain`` shows. Raises nothing (the records were checked when made)."""
    return {
        **platform_fields(platform),
        "q_dtype": spec.q_dtype,
        "kv_dtype": spec.kv_dtype,
        "num_heads": spec.num_heads,
        "need_lse": spec.need_lse,
        "logit_cap": spec.logit_cap,
        "kv_rows_packed": spec.kv_rows_packed,
        "kv_cache_bytes": spec.kv_cache_bytes,
        # informative only (not matched by rows; shown by explain):
        "sinks": spec.sinks,
        "dcp_world_size": spec.dcp_world_size,
        "topk": spec.topk,
    }


def check_path(path: Optional[str], *, unset: str = "None") -> None:
    """Refuse a forced path that is not a path of the table.

    Args:
        path: the forced path, or None (the table chooses).
        unset: how the caller's interface says "no forced path", for the message: ``None`` (the function, the
            layer, ``run``), ``''`` (the ``torch.ops`` operators, whose ``path`` is a str), or a CLI's wording.

    Raises:
        ValueError: ``path`` is neither None nor one of :data:`KNOWN_PATHS` (the message names both).
    """
    if path is not None and path not in KNOWN_PATHS:
        raise ValueError(f"'path' must be one of {KNOWN_PATHS}, or {unset} to let the table choose (got {path!r})")


def select(spec: CallSpec, platform: Platform, *, path: Optional[str] = None) -> "dispatch.Selection":
    """Run the rule table for one call; never raises for a refusal (see :func:`plan_call`).

    Args:
        spec: the call (:class:`CallSpec`). platform: where it runs (:class:`Platform`).
        path: force one path: only rows naming it are considered (for tests and engines that pin a path).
            ``'reference'`` is always honoured, as :func:`plan_call` and :func:`explain_call` honour it (the reference
            runs anywhere): the selection names it with no row and no params, no row consulted.

    Returns:
        The ``dispatch.Selection``: ``path`` (``None`` when refused), the winning ``row`` (``None`` when no row
        matched) and its merged ``params``, ``refused`` (a refusal row won or no row matched) with its
        ``reason``, and every ``rejected`` row before the winner with its failed conditions.

    Raises:
        ValueError: ``spec`` / ``platform`` not the records, or ``path`` not a path of the table.
    """
    check_records(spec, platform)
    check_path(path)
    if path == "reference":  # no row names it: the table alone would answer "no row matched" where plan_call runs it
        table = mla_table()
        values = {k: v for k, v in table_fields(spec, platform).items() if k in table.fields}  # as select gives
        return dispatch.Selection(table=table.name, values=values, row=None, path="reference", params={},
                                  refused=False, reason="")
    return mla_table().select(table_fields(spec, platform), only_paths=None if path is None else (path,))


def explain_call(spec: CallSpec, platform: Platform, *, path: Optional[str] = None) -> str:
    """The text ``mla-sink explain`` prints for a call's path (without the launch lines, which need a token count:
    ``mla-sink explain --tokens``, :func:`mla_sink.tools.explain.launch_lines`): key, chosen path and params, its
    row, and the rejected rows grouped by path, each mismatch stated once (:func:`dispatch.explain`). A refused call
    gives its refusal row's text; never raises for it.

    Args:
        spec: the call (:class:`CallSpec`). platform: where it runs (:class:`Platform`).
        path: consider only rows naming this path (as ``mla-sink explain --path``); ``'reference'`` is always
            honoured, as :func:`plan_call` honours it (:data:`FORCED_REFERENCE`).

    Returns:
        The explanation as one multi-line ``str``, first line the call's key (:func:`mla_sink.call_key`).

    Raises:
        ValueError: ``spec`` / ``platform`` not the records, or ``path`` not a path of the table (:func:`select`).
    """
    if path == "reference":  # always honoured, as plan_call honours it: no row is consulted
        check_records(spec, platform)
        return f"{call_key(spec, platform)}\n{FORCED_REFERENCE}"
    return dispatch.explain(select(spec, platform, path=path), key=call_key(spec, platform))


def plan_call(spec: CallSpec, platform: Platform, *, path: Optional[str] = None) -> LaunchPlan:
    """select + plan: the :class:`LaunchPlan` of a call.

    ``path='reference'`` is always honoured (the reference runs anywhere; ``row_id='forced'``);
    any other forced path must be named by a row that accepts the call, and refusal rows binding that path
    (``paths`` in the table) still refuse it.

    Args:
        spec: the call (:class:`CallSpec`). platform: where it runs (:class:`Platform`).
        path: force this path instead of the table's first match (``None``: the table chooses).

    Returns:
        The :class:`LaunchPlan`: ``path``, the winning row's ``params`` and ``row_id`` (``'forced'`` for the
        reference), with ``spec`` and ``platform``.

    Raises:
        ValueError: ``spec`` or ``platform`` is not the record, or ``path`` is not a path of the table.
        NoKernelError: the table refuses the call or no row accepts it (message = full explanation).
    """
    check_records(spec, platform)
    if path == "reference":
        return LaunchPlan(path="reference", params={}, spec=spec, platform=platform, row_id="forced")
    selection = select(spec, platform, path=path)
    if selection.refused or selection.path is None:
        raise NoKernelError(dispatch.explain(selection, key=call_key(spec, platform)), selection)
    log.debug("%s -> %s (row %s)", call_key(spec, platform), selection.path, selection.row.id)
    return LaunchPlan(
        path=selection.path,
        params=dict(selection.params or {}),
        spec=spec,
        platform=platform,
        row_id=selection.row.id,
    )
