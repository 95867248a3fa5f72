"""The Gluon kernels' launch tables: ``tables/gluon_fp8.yaml`` (the few-heads fp8 kernel's consumer arrangement,
head block, register split, producer steps and row sums per kv dtype, q dtype, head count, split and blocks a CTA)
and
``tables/gluon_seesaw.yaml`` (the seesaw's producer registers per KV dtype). The measurements behind every number
are the rows' ``why`` and ``source``.

Each table is loaded, proven by the rule-table checker (every combination of the declared domains gets one row, no
row is shadowed) and checked for what its lookups need, once per process; each lookup is cached, and the launchers
(:func:`mla_sink.kernels.gluon.gluon_fp8.fp8_launch_args`,
:func:`mla_sink.kernels.gluon.gluon_seesaw.seesaw_launch_args`) call them once per launch configuration, when a
runner is prepared. Imports neither Triton nor torch: ``mla-sink
explain`` reads the arrangement on any machine.
"""

from __future__ import annotations

import functools

import attrs

from mla_sink.core.dtypes import DS_MLA_KEYS
from mla_sink.core.tables import load_checked_table

#: The path of ``tables/gluon_fp8.yaml``: the consumers' one arrangement, both on every block with ``O^T`` split by
#: value columns. The alternate scores (alternate blocks' scores, ``P V`` split by columns) served e4m3's unsplit
#: 32-head launches from the twenty-sixth session until the seventy-fourth, and the alternate blocks (each consumer
#: every other block) 16-head long ranges until the seventy-sixth, when the column split with two producers took
#: their rows (BENCHMARKS.md); both left the kernel with them.
COLUMN_SPLIT = "column_split"
#: The paths of ``tables/gluon_fp8.yaml``.
FP8_PATHS = (COLUMN_SPLIT,)
#: Every param a path row of ``tables/gluon_fp8.yaml`` gives (its path's defaults included) -> its type.
FP8_PARAMS = {"head_block": int, "consumer_regs": int, "producer_regs": int, "producer_rows": int, "lines": bool,
              "deferred_row_sum": bool, "scores_only": bool, "early_ids": bool, "staged_ids": bool,
              "warp_max": bool, "rope_by_second": bool, "meta_by_second": bool, "l2_prefetch": bool,
              "producers": int, "producer_ahead": bool, "pv_overlap": bool}
#: The params of ``tables/gluon_seesaw.yaml``'s rows (their path's defaults included) -> type.
SEESAW_PARAMS = {"producer_regs": int, "consumer_regs": int}
#: ``setmaxnreg`` takes a multiple of :data:`REG_STEP` registers in ``[REG_MIN, REG_MAX]``.
REG_MIN, REG_MAX, REG_STEP = 24, 256, 8
#: Ids per block of the gluon_fp8 kernel (its ``BLOCK_N`` is this; the wgmma M of ``S^T``): a producer step's rows
#: divide it.
BLOCK_IDS = 64
#: The head blocks the gluon_fp8 kernel is built for (its ``BLOCK_H``, the wgmma N of both swapped GEMMs): a token's
#: ``H`` heads take ``cdiv(H, head_block)`` CTAs (head groups).
HEAD_BLOCKS = (16, 32)
#: Rows of one pass of the producer's layouts (4 warps x 2 rows a warp): a producer step's rows are a multiple.
ROWS_PER_PASS = 8
#: 32-bit registers of an sm90 SM's register file, which a CTA's warpgroups share (one CTA an SM), and threads of a
#: warpgroup (CUDA C Programming Guide, compute capability 9.0).
REGISTER_FILE, WARPGROUP_THREADS = 65536, 128
#: Producer warpgroups an arrangement may have: one, or two that fill alternate ring stages (``producers``).
PRODUCER_COUNTS = (1, 2)
#: Ring stages of the gluon_fp8 kernel (its ``STAGES`` is this): two producers fill one each, alternately.
RING_STAGES = 2


def partition_regs(warpgroups: int) -> int:
    """Registers per thread-slot that ``warpgroups`` warpgroups' ``setmaxnreg`` counts add up to: the register file
    split evenly, each share rounded down to :data:`REG_STEP` - 504 for three (two consumers and a producer), 512
    for four (two producers), as the SASS of every arrangement has them. The default partition (the first consumer)
    gets what the workers leave, which must itself be a legal count."""
    return REGISTER_FILE // (WARPGROUP_THREADS * warpgroups) // REG_STEP * REG_STEP * warpgroups


#: The fields of ``tables/gluon_fp8.yaml`` that its lookups fill (:func:`fp8_selection`) -> (type, closed): the
#: counts are open ints, so that every head and block count is answered (and checked) and not only the declared ones.
FP8_FIELDS = {"kv_dtype": ("str", True), "q_dtype": ("str", True), "num_heads": ("int", False),
              "split": ("bool", False), "blocks": ("int", False)}
#: The params that are ``setmaxnreg`` register counts.
_REG_PARAMS = ("consumer_regs", "producer_regs")


@attrs.frozen
class Fp8Arrangement:
    """How one ``gluon_fp8`` launch configuration runs: a path row of ``tables/gluon_fp8.yaml`` with its merged
    params (:func:`fp8_arrangement`).

    Attributes:
        row, why, source: the row that chose it (``tables/gluon_fp8.yaml``).
        head_block: heads of one CTA (the wgmma N dimension); a token's ``H`` heads take ``cdiv(H, head_block)``
            CTAs (head groups).
        consumer_regs, producer_regs: ``setmaxnreg`` registers of the two worker partitions (the table's
            description says which partitions those are).
        producer_rows: rows the producer gathers per step (64: whole blocks).
        lines: the producer loads whole 128-byte lines (8 codes a lane, 16 lanes a row).
        deferred_row_sum: the consumers that compute scores keep the softmax's row sum per thread (``[ids, heads]``)
            and sum it over ids once at the end, instead of once a block (``DEFER_ROW_SUM``).
        scores_only: the first consumer computes only the scores, the softmax and ``P`` and the second accumulates
            all of ``P V`` (``SCORES_ONLY``).
        early_ids: with V3.2 rows, the first consumer loads the first block's ids and the first two blocks' RoPE ids
            before it stages q, and each later block's ids a block ahead (``EARLY_IDS``; the kernel reads it for
            V3.2 rows only).
        staged_ids: the producer stores each block's checked ids in shared memory and the consumers read them there
            once the block's stage is filled, instead of loading them from ``indices`` before it (``STAGED_IDS``);
            per-tensor e4m3 caches only (V3.2's consumers need the ids before the stage is filled, for the tile
            scales' loads).
        warp_max: the first consumer takes each block's maximum over ids as each warp's maximum over its 16 ids and
            one ``[4, heads]`` exchange through shared memory behind one barrier, instead of the generic reduction
            across its four warps (``WARP_MAX``).
        rope_by_second: with V3.2 rows, the second consumer copies every block's bf16 RoPE (two blocks ahead,
            signalled by an mbarrier) instead of the first (``ROPE_BY_SECOND``; the kernel reads it where the RoPE
            is copied: 16-byte aligned V3.2 rows).
        meta_by_second: with V3.2 rows (not with ``early_ids``), the second consumer loads each block's ids and tile
            scales two blocks ahead and publishes the mask and scales in shared memory, which the first reads a
            block ahead (``META_BY_SECOND``).
        l2_prefetch: the producer's asm row loads (16-byte aligned rows) ask the L2 for the 256-byte block a miss
            falls in (``gluon_fp8.L2_PREFETCH_HINT``); otherwise they load 32-byte sectors only (``L2_PREFETCH``).
        producers: producer warpgroups, one of :data:`PRODUCER_COUNTS`: one, or two that fill alternate ring stages
            (blocks 0, 2, .. and 1, 3, ..), each with ``producer_regs`` registers and two block periods for its
            gather and conversion (``PRODUCERS``).
        producer_ahead: each of two producers keeps its next step's rows in flight while it converts and stores
            this step's (a block's second step loaded before the wait for its free stage), on 16-byte aligned V3.2
            rows with steps of less than a block (``PRODUCER_AHEAD``, ``gluon_fp8._producer_ahead``).
        pv_overlap: with V3.2 rows, ``rope_by_second`` and ``meta_by_second`` (not ``scores_only``), the first
            consumer leaves its half of a block's ``P V`` in flight behind the next block's score wgmmas and releases
            the block's stage once it has waited for both (``PV_OVERLAP``).
    """

    row: str
    why: str
    source: str
    head_block: int
    consumer_regs: int
    producer_regs: int
    producer_rows: int
    lines: bool
    deferred_row_sum: bool
    scores_only: bool = False
    early_ids: bool = False
    staged_ids: bool = False
    warp_max: bool = False
    rope_by_second: bool = False
    meta_by_second: bool = False
    l2_prefetch: bool = True
    producers: int = 1
    producer_ahead: bool = False
    pv_overlap: bool = False

    def ctas_per_token(self, num_heads: int) -> int:
        """CTAs one token's ``num_heads`` heads take: ``cdiv(H, head_block)`` (head groups)."""
        return -(-int(num_heads) // self.head_block)


def _error(table, row, message: str):
    from mla_sink import dispatch

    return dispatch.TableError(f"{table.source_file or table.name}:{row.line}: row {row.id!r}: {message}")


def _check_params(table, row, params: dict, wanted: dict) -> None:
    """A path row's merged params are exactly ``wanted`` (name -> type), registers legal for ``setmaxnreg`` and the
    other ints positive.

    Raises:
        dispatch.TableError: naming the file, the row's line and id, and the param.
    """
    missing, unknown = sorted(set(wanted) - set(params)), sorted(set(params) - set(wanted))
    if missing or unknown:
        raise _error(table, row, f"params must be exactly {sorted(wanted)} with its path's defaults "
                                 f"(missing {missing}, unknown {unknown})")
    for key, kind in wanted.items():
        value = params[key]
        if type(value) is not kind:
            raise _error(table, row, f"params {key}: expected {kind.__name__}, got {value!r}")
        if kind is int and value <= 0:
            raise _error(table, row, f"params {key}: expected a positive int, got {value!r}")
        if key in _REG_PARAMS and not (REG_MIN <= value <= REG_MAX and value % REG_STEP == 0):
            raise _error(table, row, f"params {key}: setmaxnreg takes a multiple of {REG_STEP} in "
                                     f"[{REG_MIN}, {REG_MAX}], got {value!r}")


def _admits(row, kv_dtypes) -> bool:
    """Whether a row of tables/gluon_fp8.yaml can match a cache of one of ``kv_dtypes`` (no ``kv_dtype`` condition
    excludes it)."""
    return any(all(c.holds(key) for c in row.when if c.field == "kv_dtype") for key in kv_dtypes)


def _admits_ds_mla(row) -> bool:
    """Whether a row of tables/gluon_fp8.yaml can match a V3.2 cache (no ``kv_dtype`` condition excludes it)."""
    return _admits(row, DS_MLA_KEYS)


def check_fp8_table(table) -> None:
    """What :func:`fp8_arrangement` relies on beyond the generic checker: the paths are :data:`FP8_PATHS`; every
    path row gives every param of :data:`FP8_PARAMS` (defaults included) with a legal value (``producer_rows`` a
    divisor of :data:`BLOCK_IDS` and a multiple of :data:`ROWS_PER_PASS`; ``producers`` one of
    :data:`PRODUCER_COUNTS`; the workers' registers leave the default partition a legal count of
    :func:`partition_regs`; ``staged_ids`` only on rows whose
    ``kv_dtype`` excludes the V3.2 rows; ``producer_ahead`` only on rows whose ``kv_dtype`` excludes every cache
    but the V3.2 rows, with two producers, steps of less than a block and whole lines; ``pv_overlap`` only there too,
    with ``rope_by_second`` and ``meta_by_second`` and not ``scores_only``); its head block
    one of :data:`HEAD_BLOCKS` (a row matching more heads runs ``cdiv(H, head_block)`` CTAs a token); a path's
    defaults are known params of the right type even where every row overrides them; and every head count and block
    count gets a row, the values on either side of each row's thresholds included, not only the declared ones
    (``dispatch.check_table(thresholds=True)``: a launch meets every value).

    Args:
        table: tables/gluon_fp8.yaml as :func:`dispatch.load_table` returns it (the shipped file or an edited copy).

    Raises:
        dispatch.TableError: naming the file, the row and the field or param.
    """
    from mla_sink import dispatch

    where = table.source_file or table.name
    if tuple(table.paths) != FP8_PATHS:
        raise dispatch.TableError(f"{where}: the paths must be the arrangements {FP8_PATHS} (got {tuple(table.paths)})")
    fields = {name: (f.type, f.closed) for name, f in table.fields.items()}
    if fields != FP8_FIELDS:
        raise dispatch.TableError(f"{where}: the fields must be {FP8_FIELDS} as (type, closed), got {fields}")
    for name, spec in table.paths.items():
        for key, value in spec.params.items():
            if key not in FP8_PARAMS:
                raise dispatch.TableError(f"{where}:{spec.line}: path {name!r}: params {key}: not a param, expected "
                                          f"one of {sorted(FP8_PARAMS)}")
            if type(value) is not FP8_PARAMS[key]:
                raise dispatch.TableError(f"{where}:{spec.line}: path {name!r}: params {key}: expected "
                                          f"{FP8_PARAMS[key].__name__}, got {value!r}")
    errors = [p for p in dispatch.check_table(table, thresholds=True) if p.level == "error"]
    if errors:
        raise dispatch.TableError(f"{where}: the rows checked at every declared value and on either side of each "
                                  "row's head and block thresholds: " + "; ".join(map(str, errors)))
    others_than_ds = sorted(set(table.fields["kv_dtype"].domain) - DS_MLA_KEYS)  # the caches of 576-byte rows
    for row in table.rows:
        if row.is_refusal:
            continue
        params = table.row_params(row)
        _check_params(table, row, params, FP8_PARAMS)
        rows = params["producer_rows"]
        if BLOCK_IDS % rows or rows % ROWS_PER_PASS:
            raise _error(table, row, f"params producer_rows: expected a divisor of {BLOCK_IDS} (the ids of a block) "
                                     f"and a multiple of {ROWS_PER_PASS} (a pass of the producer's warps), got {rows}")
        producers = params["producers"]
        if producers not in PRODUCER_COUNTS:
            raise _error(table, row, f"params producers: expected one of {PRODUCER_COUNTS} (producer warpgroups), "
                                     f"got {producers!r}")
        total = partition_regs(2 + producers)  # two consumers and the producers
        left = total - params["consumer_regs"] - producers * params["producer_regs"]
        if not REG_MIN <= left <= REG_MAX:
            raise _error(table, row, f"params consumer_regs + producers x producer_regs: the default partition gets "
                                     f"{total} - {params['consumer_regs']} - {producers} x {params['producer_regs']} = "
                                     f"{left} registers, outside [{REG_MIN}, {REG_MAX}]")
        if params["staged_ids"] and _admits_ds_mla(row):
            raise _error(table, row, f"params staged_ids: only rows whose kv_dtype excludes {sorted(DS_MLA_KEYS)} "
                                     f"(V3.2's consumers load each block's ids before its stage is filled, for the "
                                     f"tile scales' loads)")
        if params["producer_ahead"]:
            if (_admits(row, others_than_ds) or params["producers"] != RING_STAGES
                    or params["producer_rows"] >= BLOCK_IDS or not params["lines"]):
                raise _error(table, row, "params producer_ahead: only rows whose kv_dtype is the V3.2 rows "
                                         f"{sorted(DS_MLA_KEYS)}, with producers {RING_STAGES}, producer_rows below "
                                         f"{BLOCK_IDS} and lines (each producer holds two steps of whole lines of "
                                         "latent codes)")
        if params["pv_overlap"] and (not (params["rope_by_second"] and params["meta_by_second"])
                                     or params["scores_only"] or _admits(row, others_than_ds)):
            raise _error(table, row, "params pv_overlap: only with rope_by_second and meta_by_second, not with "
                                     "scores_only, on rows whose kv_dtype is the V3.2 rows (the first consumer's "
                                     "loop has no global load then, and its half of P V to leave in flight)")
        if params["meta_by_second"] and params["early_ids"]:
            raise _error(table, row, "params meta_by_second: not with early_ids (the second consumer loads every "
                                     "block's ids, the first none)")
        if params["head_block"] not in HEAD_BLOCKS:
            raise _error(table, row, f"params head_block: expected one of {HEAD_BLOCKS} (the kernel's head blocks), "
                                     f"got {params['head_block']!r}")


def check_seesaw_table(table) -> None:
    """Every row of ``tables/gluon_seesaw.yaml`` names a path and gives :data:`SEESAW_PARAMS` (defaults included).

    Args:
        table: tables/gluon_seesaw.yaml as :func:`dispatch.load_table` returns it (the shipped file or an edited copy).

    Raises:
        dispatch.TableError: naming the file, the row and the param.
    """
    for row in table.rows:
        if row.is_refusal:
            raise _error(table, row, "the seesaw's table has no refusal rows (the tuning table decides which "
                                     "calls the kernel serves)")
        _check_params(table, row, table.row_params(row), SEESAW_PARAMS)


@functools.cache
def _load(name: str):
    """``tables/<name>.yaml`` loaded, proven by the checker and checked for its lookups (once per process).

    Raises:
        dispatch.TableError: a malformed table (file, line, row and field named).
        dispatch.TableCheckError: a gap or a shadowed row.
    """
    # the seesaw's table has one path, its kernel; gluon_fp8's check names its own paths (the arrangements)
    check, paths = {"gluon_fp8": (check_fp8_table, None), "gluon_seesaw": (check_seesaw_table, ("gluon_seesaw",))}[name]
    return load_checked_table(name, check, paths=paths)


def gluon_fp8_table():
    """``tables/gluon_fp8.yaml`` as a checked :class:`dispatch.RuleTable` (cached).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed.
    """
    return _load("gluon_fp8")


def gluon_seesaw_table():
    """``tables/gluon_seesaw.yaml`` as a checked :class:`dispatch.RuleTable` (cached).

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed.
    """
    return _load("gluon_seesaw")


def fp8_kv_dtypes() -> tuple:
    """The KV dtype keys ``gluon_fp8`` reads (its table's closed ``kv_dtype`` domain), e.g.
    ``('fp8_e4m3', 'fp8_ds_mla')``."""
    return tuple(gluon_fp8_table().fields["kv_dtype"].domain)


def cta_blocks(ids_per_split: int, topk: int) -> int:
    """The ``blocks`` field of ``tables/gluon_fp8.yaml``: the :data:`BLOCK_IDS`-id blocks of one CTA's id range,
    ``cdiv(min(ids_per_split, topk), 64)`` (an unsplit launch's range is the whole ``topk``)."""
    return -(-max(min(int(ids_per_split), int(topk)), 0) // BLOCK_IDS)


@functools.cache
def fp8_selection(kv_dtype: str, q_dtype: str, num_heads: int, split: bool, blocks: int):
    """The ``tables/gluon_fp8.yaml`` :class:`dispatch.Selection` of one launch configuration (cached; for
    ``mla-sink explain`` and :func:`fp8_arrangement`).

    Args:
        kv_dtype: ``fp8_e4m3`` or ``fp8_ds_mla``. q_dtype: q's dtype key (``bf16``, ``fp16``, ...).
        num_heads: H (``>= 0``). split: ``num_kv_splits > 1``. blocks: 64-id blocks a CTA (:func:`cta_blocks`).

    Raises:
        ValueError: a dtype key outside the table's closed domains.
    """
    return gluon_fp8_table().select(dict(kv_dtype=kv_dtype, q_dtype=q_dtype, num_heads=int(num_heads),
                                         split=bool(split), blocks=int(blocks)))


@functools.cache
def fp8_arrangement(kv_dtype: str, q_dtype: str, num_heads: int, split: bool, blocks: int) -> Fp8Arrangement:
    """The :class:`Fp8Arrangement` of a ``gluon_fp8`` launch: the first row of ``tables/gluon_fp8.yaml`` that
    matches (cached: one lookup per launch configuration).

    Args:
        kv_dtype: ``fp8_e4m3`` (an e4m3fn ``[N, 576]`` cache) or ``fp8_ds_mla`` (656-byte V3.2 rows).
        q_dtype: q's dtype key (:data:`mla_sink.core.dtypes.DTYPE_KEYS`).
        num_heads: H. split: ``num_kv_splits > 1``. blocks: 64-id blocks a CTA (:func:`cta_blocks`).

    Raises:
        ValueError: a dtype key outside the table's domains, or a refusal row matched (the message names the
            row and says why: q of a dtype the cache is not read with; more heads than the largest head block), or
            no row (an edited table with a gap; the message names every field's value).
    """
    sel = fp8_selection(kv_dtype, q_dtype, num_heads, split, blocks)
    if sel.row is None:  # a table the checker proves has no gap never gets here
        raise ValueError(f"no row of tables/gluon_fp8.yaml matches kv_dtype={kv_dtype!r}, q_dtype={q_dtype!r}, "
                         f"num_heads={num_heads}, split={bool(split)}, blocks={blocks}")
    if sel.refused:
        raise ValueError(f"the gluon_fp8 kernel does not serve kv_dtype={kv_dtype!r} with q dtype {q_dtype}, "
                         f"num_heads={num_heads}: {sel.reason} (row {sel.row.id if sel.row else None} of "
                         "tables/gluon_fp8.yaml)")
    p = sel.params
    return Fp8Arrangement(row=sel.row.id, why=sel.row.why, source=sel.row.source,
                          head_block=p["head_block"], consumer_regs=p["consumer_regs"],
                          producer_regs=p["producer_regs"], producer_rows=p["producer_rows"], lines=p["lines"],
                          deferred_row_sum=p["deferred_row_sum"], scores_only=p["scores_only"],
                          early_ids=p["early_ids"], staged_ids=p["staged_ids"], warp_max=p["warp_max"],
                          rope_by_second=p["rope_by_second"], meta_by_second=p["meta_by_second"],
                          l2_prefetch=p["l2_prefetch"], producers=p["producers"],
                          producer_ahead=p["producer_ahead"], pv_overlap=p["pv_overlap"])


@functools.cache
def seesaw_selection(kv_dtype: str):
    """The ``tables/gluon_seesaw.yaml`` :class:`dispatch.Selection` for a KV dtype key (cached; for
    ``mla-sink explain`` and :func:`seesaw_producer_regs`).

    Raises:
        ValueError: ``kv_dtype`` is not one the seesaw reads (the table's closed domain).
    """
    return gluon_seesaw_table().select({"kv_dtype": kv_dtype})


def seesaw_kv_dtypes() -> tuple:
    """The KV dtype keys the seesaw's table declares (its closed ``kv_dtype`` domain)."""
    return tuple(gluon_seesaw_table().fields["kv_dtype"].domain)


@functools.cache
def seesaw_consumer_regs(kv_dtype: str) -> int:
    """The seesaw's second consumer's ``setmaxnreg`` registers for a KV dtype key (``tables/gluon_seesaw.yaml``;
    cached).

    Raises:
        ValueError: ``kv_dtype`` is not one the seesaw reads (the table's closed domain).
    """
    return seesaw_selection(kv_dtype).params["consumer_regs"]


@functools.cache
def seesaw_producer_regs(kv_dtype: str) -> int:
    """The seesaw producer's ``setmaxnreg`` registers for a KV dtype key (``tables/gluon_seesaw.yaml``; cached).

    Raises:
        ValueError: ``kv_dtype`` is not one the seesaw reads (the table's closed domain).
    """
    return seesaw_selection(kv_dtype).params["producer_regs"]
