"""Print a :class:`~mla_sink.core.plan.LaunchPlan` (``mla-sink explain`` and ``mla-sink info``).

The text and the JSON are made from the plan record alone: the rule table's selection (path, row,
grouped rejections: :func:`mla_sink.dispatch.explain`) and the path's launch (the Triton kernel, tiles
and split count with the tuning rows that chose them, or the AITER call).
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from mla_sink.core.kv_layout import BF16_EXACT_SCALE_EXP
from mla_sink.core.platform import arch_of
from mla_sink.paths.aiter.chunks import AiterChunkedCall
from mla_sink.paths.triton.plan import MAX_GRID_TOKENS, combine_programs, token_ranges

#: one name per kernel: the kernel's name in the tuning table, its file, and what explain prints
KERNEL_FILES = {
    "portable": "mla_sink/kernels/triton/portable.py",
    "gluon_seesaw": "mla_sink/kernels/gluon/gluon_seesaw.py",
    "gluon_fp8": "mla_sink/kernels/gluon/gluon_fp8.py",
}


def launch_lines(plan: Any) -> list[str]:
    """The lines that describe ``plan.launch`` (empty for the reference or a token-free plan)."""
    launch = plan.launch
    if plan.path == "triton" and launch is not None:
        return _triton_lines(plan, launch)
    if plan.path.startswith("aiter") and plan.num_tokens is not None:
        if launch is None:
            return [f"  aiter call at T={plan.num_tokens}: none (no tokens)"]
        lines = [f"  aiter call at T={plan.num_tokens}: {launch}"]
        chunked = isinstance(launch, AiterChunkedCall)
        if chunked:  # each chunk one AITER call, planned for its token count
            full = launch.num_chunks - (len(launch.calls) - 1)  # chunks of the full size (the first call's)
            each = " each" if full > 1 else ""
            lines.append(f"    {_count(full, 'chunk')} of {_count(launch.chunk_tokens, 'token')}{each}: "
                         f"{launch.calls[0]}")
            if len(launch.calls) == 2:
                lines.append(f"    the last chunk, of {_count(launch.calls[1].num_tokens, 'token')}: {launch.calls[1]}")
        if launch.needs_meta_param and "min_kv_splits" in plan.params:
            lines.append(f"    split count: max(AITER's own heuristic, {plan.params['min_kv_splits']})"
                         f"{', for each chunk' if chunked else ''}, asked from AITER when the plan is made on a "
                         "machine where it is importable")
        return lines
    return []


def _count(n: int, noun: str) -> str:
    """``n noun`` with the noun in the plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _triton_lines(plan: Any, launch: Any) -> list[str]:
    T = plan.num_tokens
    if T == 0:  # nothing runs (as the AITER launch says it; the JSON's launch is null)
        return ["  triton launch at T=0: none (a call of no tokens launches nothing)"]
    sms = plan.platform.num_sms
    if plan.platform.arch == arch_of("cpu"):  # Triton's interpreter: one program at a time, no SMs
        where = "Triton's CPU interpreter"
    else:
        where = f"on {sms} SM(s)" if sms is not None else "SM count unknown"
    if launch.num_kv_splits is None:  # a Gluon row needs the split count: the kernel is not decided yet
        lines = [f"  triton launch at T={T} ({where}): kernel not decided",
                 "    splits and kernel depend on the SM count: pass --sms N (without it, the portable kernel's row "
                 "and the Gluon rows' split requirement are shown)"]
    else:
        lines = [f"  triton launch at T={T} ({where}): kernel {launch.kernel} "
                 f"({KERNEL_FILES.get(launch.kernel, '?')})"]
        tiles = (f"BLOCK_H={launch.block_h} BLOCK_N={launch.block_n} num_warps={launch.num_warps} "
                 f"num_stages={launch.num_stages}")
        if launch.kernel != "portable":  # a Gluon kernel fixes its own tiles; the row's serve a fallback
            tiles = f"the kernel's own tiles (on a fallback to the portable kernel: {tiles})"
        rounded = (f" (topk rounded up to whole blocks of {launch.block_n} ids)"
                   if launch.ids_per_split > plan.spec.topk else "")
        lines.append(f"    {launch.num_kv_splits} KV split(s) of {launch.ids_per_split} ids{rounded}; {tiles}")
        if launch.num_kv_splits > 1:  # the split launch's partials merge in the combine kernel
            programs = combine_programs(T, plan.spec.num_heads, launch.combine_block_h, launch.combine_block_d)
            lines.append(f"    combine: {launch.combine_block_h} heads x {launch.combine_block_d} value columns a "
                         f"program, {programs} programs (mla_sink/kernels/triton/combine.py)")
    ranges = token_ranges(T) if T is not None else None
    if ranges is not None and len(ranges) > 1:  # the tokens sit on a grid dimension CUDA caps
        lines.append(f"    the call runs as {len(ranges)} launches, over token ranges of {ranges[0][1]} tokens, the "
                     f"last shorter (a CUDA grid's y / z dimension holds {MAX_GRID_TOKENS})")
    lines.append(f"    tiles and split policy: row {launch.tuning_row} (tables/triton_tuning.yaml): {launch.why}")
    if launch.kernel_row != launch.tuning_row:
        lines.append(f"    kernel: row {launch.kernel_row}: {launch.kernel_why}")
    arrangement = gluon_fp8_arrangement(plan)
    if arrangement is not None:
        lines.append(f"    arrangement: row {arrangement['row']} (tables/gluon_fp8.yaml): {arrangement['summary']}; "
                     f"{arrangement['why']}")
    producer = gluon_seesaw_producer(plan)
    if producer is not None:
        lines.append(f"    producer: row {producer['row']} (tables/gluon_seesaw.yaml): {producer['producer_regs']} "
                     f"registers (second consumer {producer['consumer_regs']}); {producer['why']}")
    if launch.exact_recompute:
        lo, hi = BF16_EXACT_SCALE_EXP
        lines.append("    recompute: a second gluon_seesaw launch of the same grid, gated per program by the first "
                     "launch's flags, reads every tile scale exactly (seesaw_fp8.KV_DS_EXACT); the first flags the "
                     f"programs that meet a scale other than 0 or a power of two in [2^{lo}, 2^{hi}]"
                     + ("; launched as a programmatic dependent of the first (split launch)"
                        if (launch.num_kv_splits or 1) > 1 else ""))
    if launch.per_call:  # a condition of each call's data pointers, which no plan sees
        lines.append(f"    per call: {launch.kernel} {launch.per_call}")
    for row_id, reason in getattr(launch, "rejected_kernels", ()):
        lines.append(f"    ✗ {row_id}: {reason}")
    if launch.fallback:
        lines.append(f"    fallback: {launch.fallback}")
    return lines


#: The summary's clause for ``rope_by_second``: the kernel copies the RoPE only from 16-byte aligned rows, which the
#: launch configuration does not know (``gluon_fp8.rows_16b`` of the call's ``kv_cache``).
_ROPE_BY_SECOND = (", the RoPE copied by the second consumer (on 16-byte aligned rows; otherwise gathered by the "
                   "producer)")
#: The clause of :func:`gluon_fp8_arrangement`'s summary for ``producer_ahead``.
_PRODUCER_AHEAD = ", each producer's next step in flight (on 16-byte aligned rows)"
#: The clause of :func:`gluon_fp8_arrangement`'s summary for ``pv_overlap``.
_PV_OVERLAP = ", the first consumer's half of P V in flight behind the next block's scores (on 16-byte aligned rows)"


def gluon_fp8_arrangement(plan: Any) -> Optional[dict]:
    """The ``tables/gluon_fp8.yaml`` row of a plan whose Triton launch runs ``gluon_fp8`` with a known split count:
    ``{row, path, head_block, ctas_per_token, consumer_regs, producer_regs, producer_rows, lines, deferred_row_sum,
    scores_only, early_ids, staged_ids, warp_max, rope_by_second, meta_by_second, l2_prefetch, producers,
    producer_ahead, pv_overlap, summary, why}`` (every clause of
    ``summary`` is a field) (``head_block``: heads of one CTA,
    ``ctas_per_token``: ``cdiv(H, head_block)``; ``summary``: the arrangement in a few words), or ``None`` for any
    other plan.
    Needs neither Triton nor a GPU; a configuration the table refuses (the tuning table never sends one) gives
    ``{row, path: None, summary: "refused", why: the refusal}``."""
    from mla_sink.kernels.gluon import tuning

    launch = plan.launch
    if plan.path != "triton" or launch is None or launch.kernel != "gluon_fp8" or launch.num_kv_splits is None:
        return None
    spec = plan.spec
    key = (spec.kv_dtype, spec.q_dtype, spec.num_heads, launch.num_kv_splits > 1,
           tuning.cta_blocks(launch.ids_per_split, spec.topk))
    sel = tuning.fp8_selection(*key)
    if sel.refused:
        return dict(row=sel.row.id if sel.row else None, path=None, summary="refused", why=sel.reason)
    arr = tuning.fp8_arrangement(*key)
    producers = "producer" if arr.producers == 1 else f"{arr.producers} producers (one a ring stage) each"
    regs = (f"second consumer {arr.consumer_regs} / {producers} {arr.producer_regs} registers, the first consumer "
            "(the default partition) what they leave")
    groups = arr.ctas_per_token(spec.num_heads)
    summary = (f"{sel.path}, {arr.head_block}-head blocks{f' ({groups} CTAs a token)' if groups > 1 else ''}, {regs}, "
               f"{arr.producer_rows} rows a producer step"
               f"{', whole lines' if arr.lines else ''}, the row sum "
               f"{'deferred' if arr.deferred_row_sum else 'once a block'}"
               f"{', the first consumer on the scores only (the second all of P V)' if arr.scores_only else ''}"
               f"{', the first ids loaded before q' if arr.early_ids else ''}"
               f"{', the ids staged by the producer in shared memory' if arr.staged_ids else ''}"
               f"{', the block maximum per warp' if arr.warp_max else ''}"
               f"{_ROPE_BY_SECOND if arr.rope_by_second else ''}"
               f"{', the ids and tile scales loaded by the second consumer' if arr.meta_by_second else ''}"
               f"{', the L2 asked for 256 bytes a row load' if arr.l2_prefetch else ''}"
               f"{_PRODUCER_AHEAD if arr.producer_ahead else ''}"
               f"{_PV_OVERLAP if arr.pv_overlap else ''}")
    return dict(row=arr.row, path=sel.path, head_block=arr.head_block, ctas_per_token=groups,
                consumer_regs=arr.consumer_regs, producer_regs=arr.producer_regs, producer_rows=arr.producer_rows,
                lines=arr.lines, deferred_row_sum=arr.deferred_row_sum, scores_only=arr.scores_only,
                early_ids=arr.early_ids, staged_ids=arr.staged_ids, warp_max=arr.warp_max,
                rope_by_second=arr.rope_by_second, meta_by_second=arr.meta_by_second, l2_prefetch=arr.l2_prefetch,
                producers=arr.producers, producer_ahead=arr.producer_ahead, pv_overlap=arr.pv_overlap,
                summary=summary, why=arr.why)


def gluon_seesaw_producer(plan: Any) -> Optional[dict]:
    """The ``tables/gluon_seesaw.yaml`` row of a plan whose Triton launch runs ``gluon_seesaw``:
    ``{row, producer_regs, consumer_regs, why}`` (the producer's and the second consumer's ``setmaxnreg`` registers
    for the call's KV dtype), or
    ``None`` for any other plan (or a KV dtype the table does not declare). Needs neither Triton nor a GPU."""
    from mla_sink.kernels.gluon import tuning

    launch = plan.launch
    if plan.path != "triton" or launch is None or launch.kernel != "gluon_seesaw":
        return None
    if plan.spec.kv_dtype not in tuning.seesaw_kv_dtypes():
        return None
    sel = tuning.seesaw_selection(plan.spec.kv_dtype)
    return dict(row=sel.row.id, producer_regs=sel.params["producer_regs"], consumer_regs=sel.params["consumer_regs"],
                why=sel.row.why)


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return {k: _plain(v) for k, v in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _launch_count(num_tokens: Optional[int]) -> Optional[int]:
    """The launches (each with the plan's splits) a call of ``num_tokens`` tokens runs as: one per token range
    (:func:`~mla_sink.paths.triton.plan.token_ranges`), none for no tokens; ``None`` when the count is unknown."""
    return None if num_tokens is None else len(token_ranges(num_tokens))


def _forced_selection(plan: Any) -> dict:
    """The selection part of a plan forced onto a path without a selection (the reference: no row consulted), with
    the keys :func:`dispatch.selection_to_dict` gives, so every document has one shape (the forced reference's had
    a bare ``row`` string and no ``table``, ``values``, ``reason`` or rejections: a break test, forty-third
    session)."""
    from mla_sink.core.select import FORCED_REFERENCE_WHY, mla_table, table_fields

    row = dict(id=plan.row_id, path=plan.path, refuse=None, paths=[], params={},
               why=FORCED_REFERENCE_WHY, source="mla_sink/core/reference.py", line=None)
    table = mla_table()
    values = {k: v for k, v in table_fields(plan.spec, plan.platform).items() if k in table.fields}
    return dict(table=table.name, values=_plain(values), path=plan.path,
                params=_plain(plan.params), refused=False, reason="", row=row, rejected_paths=[], rejected=[])


def plan_to_dict(plan: Any, selection: Optional[Any] = None) -> dict:
    """The plan record as JSON-ready data: the rule table's selection (when given: path, row, params,
    rejections grouped by path) and the plan's ``key``, ``spec``, ``platform``, ``num_tokens`` and
    ``launch`` (on the triton path with its kernel file, ``None`` while the SM count leaves the kernel open, and
    ``token_ranges``: the launches the call runs as; on an AITER path the call, or a call in token chunks with its
    ``calls``, ``num_chunks``, ``chunk_tokens``, ``why`` and the chunks' common ``path``, ``row_id``, ``num_heads``,
    ``topk``, ``out_dtype`` and ``return_lse``, as a single call has them; ``None`` for a call of no tokens, which
    launches nothing, on every path, as the text says)."""
    from mla_sink import dispatch
    from mla_sink.core.records import call_key

    doc = dispatch.selection_to_dict(selection) if selection is not None else _forced_selection(plan)
    doc.update(key=call_key(plan.spec, plan.platform), spec=_plain(plan.spec), platform=_plain(plan.platform),
               need_lse=plan.spec.need_lse, num_tokens=plan.num_tokens,
               launch=None if plan.num_tokens == 0 else _plain(plan.launch))
    if isinstance(plan.launch, AiterChunkedCall) and doc["launch"] is not None:
        c = plan.launch  # the chunks' common values at the top, as a single call has them
        doc["launch"].update(num_chunks=c.num_chunks, chunk_tokens=c.chunk_tokens, why=c.why, path=c.path,
                             row_id=c.row_id, num_heads=c.num_heads, topk=c.topk, out_dtype=c.out_dtype,
                             return_lse=c.return_lse)
    if doc["launch"] is not None and plan.path == "triton":
        doc["launch"]["token_ranges"] = _launch_count(plan.num_tokens)
        if plan.launch.num_kv_splits is None:  # the SM count decides splits and kernel: both stay open
            doc["launch"].update(kernel=None, kernel_row=None, kernel_why=None, kernel_file=None)
        else:
            doc["launch"]["kernel_file"] = KERNEL_FILES.get(plan.launch.kernel)
            arrangement = gluon_fp8_arrangement(plan)
            if arrangement is not None:
                doc["launch"]["gluon_fp8_arrangement"] = arrangement
            producer = gluon_seesaw_producer(plan)
            if producer is not None:
                doc["launch"]["gluon_seesaw_producer"] = producer
    return doc
