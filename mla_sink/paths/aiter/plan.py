"""Pure planner for the AITER paths: ``LaunchPlan`` + token count -> the exact ``mla_decode_fwd`` call as data.

No tensors are created here and AITER is never imported; every field of an :class:`AiterCall` is a
plain value, so a plan can be printed, compared, cached per ``(spec, platform, T)`` and tested on a
laptop. :mod:`.buffers` turns the call into device tensors and :mod:`.launch` runs it. Which calls
reach AITER at all (archs, AITER version, dtypes, ``logit_cap``, head counts, LSE support) is the
rule table's answer (``tables/mla_decode.yaml``); this module re-checks none of it. Head padding,
split counts and ``return_lse`` come from the plan's params (the path's defaults in the table, with
the winning row's own on top).

How our sparse decode maps onto AITER's paged MLA decode (page size 1):

* every query token is its own AITER "batch" of one query row: ``qo_indptr = arange(T + 1)``,
  ``max_seqlen_q = 1`` (:data:`MAX_SEQLEN_Q`), ``kv_last_page_lens = ones(T)``; the KV cache
  ``[N, 576]`` is viewed as ``[N, 1, 1, 576]`` (``view(-1, 1, 1, 576)``: pages of one row, one KV
  head), so ``kv_indices`` hold row ids;
* ``kv_indptr [T + 1]`` is the cumulative count of each token's *valid* ids;
* ``kv_indices [T * topk]`` is fixed-size. The non-persistent kernel reads token t's ids at
  ``kv_indices[kv_indptr[t]:kv_indptr[t+1]]`` (``packed`` layout); the persistent kernel with sparse
  metadata (``topk`` given to ``get_mla_metadata_v1``) reads them at
  ``kv_indices[t * topk : t * topk + count_t]`` (``row_strided`` layout).

Source: ROCm/aiter ``aiter/mla.py`` (``mla_decode_fwd``, ``get_meta_param``);
``aiter/ops/attention.py`` (``get_mla_metadata_info_v1``, ``get_mla_metadata_v1``);
``csrc/kernels/mla/metadata/v1_2_device.cuh`` (sparse work plan: per-token length
``min(kv_indptr[t+1] - kv_indptr[t], topk)``, start ``t * topk``); vllm-project/vllm
``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py`` (``qo_indptr = arange``, ones,
``max_seqlen_qo = 1``, ``kv_indices`` of ``T * topk``) and ``vllm/_aiter_ops.py``
(``kv_buffer.view(-1, 1, 1, 576)``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import attrs

from mla_sink.core.dtypes import DTYPE_KEYS, FP8_KEYS, out_dtype_for
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_QK, D_V

#: The four AITER paths of the rule table.
AITER_PATHS: tuple[str, ...] = ("aiter_persistent", "aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split")
#: The params :func:`plan_aiter` reads on each AITER path (a row's merged with its path's defaults), and their
#: types: ``int`` params are counts >= 1. ``check_mla_params`` refuses any other param name, and a value of another
#: type, when ``tables/mla_decode.yaml`` loads (a misspelt ``min_kv_split`` was silently ignored: a break test).
PATH_PARAMS: dict = {
    "aiter_persistent": {"pad_heads_to": int, "pad_heads_multiple": int, "max_split_per_batch": int,
                         "return_lse": bool, "kv_granularity": int, "fast_mode": bool},
    **{path: {"pad_heads_to": int, "pad_heads_multiple": int, "num_kv_splits": int, "min_kv_splits": int}
       for path in ("aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split")},
}
#: The params of :data:`PATH_PARAMS` that :func:`plan_aiter` requires on each AITER path.
REQUIRED_PARAMS: dict = {"aiter_persistent": ("pad_heads_to", "max_split_per_batch", "return_lse", "kv_granularity",
                                              "fast_mode"),
                         **{path: ("pad_heads_to",) for path in PATH_PARAMS if path != "aiter_persistent"}}
NON_PERSISTENT_PATHS: frozenset[str] = frozenset({"aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split"})

# Values fixed by how our call maps onto AITER's paged decode (see the module docstring), passed to
# AITER as they are; they are not fields of the call records because no call differs in them.
#: ``max_seqlen_q`` of ``mla_decode_fwd`` and ``max_seqlen_qo`` / ``uni_seqlen_qo`` of the metadata:
#: every query token is its own batch of one query row (``qo_indptr = arange(T + 1)``). Source: vLLM
#: ``rocm_aiter_mla_sparse.py`` (``max_seqlen_qo = 1``).
MAX_SEQLEN_Q = 1
#: ``page_size``: one KV row per page, so ``kv_indices`` hold row ids and ``kv_last_page_lens = ones(T)``.
PAGE_SIZE = 1
#: ``nhead_kv`` of ``mla_decode_fwd`` and ``num_heads_k`` of the metadata: MLA has one shared KV head.
NUM_KV_HEADS = 1
#: ``is_sparse`` of the metadata: AITER plans ``min(count_t, topk)`` ids per token from ``t * topk``.
IS_SPARSE = True
#: ``is_causal`` of ``get_mla_metadata_v1`` (AITER's default; a no-op with one query row per batch).
IS_CAUSAL = True
# The metadata's ``fast_mode`` and ``kv_granularity`` are AITER's choices, not our mapping's: the
# ``aiter_persistent`` path's params in tables/mla_decode.yaml (:class:`PersistentMetadata`).

KV_INDICES_LAYOUTS = ("packed", "row_strided")
#: The most id slots (``T * topk``) one AITER call takes: ``kv_indptr`` and the persistent plan's row starts
#: (``t * topk``) are int32 in AITER's API, and so are the offsets :func:`~.buffers.fill_kv_buffers` computes. A
#: call of more runs as consecutive token chunks, each one AITER call (:func:`~.chunks.plan_aiter_launch`). Read
#: when a call is planned (:func:`id_slot_limit`), so a test may lower it (and clear the plan caches).
MAX_ID_SLOTS = 2 ** 31 - 1


def id_slot_limit(max_id_slots: Optional[int] = None) -> int:
    """The most id slots one AITER call takes: ``max_id_slots`` when given (tests pass a small one), else
    :data:`MAX_ID_SLOTS` as the module holds it now.

    Raises:
        ValueError: ``max_id_slots`` given but not an int in ``[1, MAX_ID_SLOTS]`` (no larger count fits AITER's
            int32 offsets).
    """
    if max_id_slots is None:
        return MAX_ID_SLOTS
    if isinstance(max_id_slots, bool) or not isinstance(max_id_slots, int) or not 1 <= max_id_slots <= 2 ** 31 - 1:
        raise ValueError(f"'max_id_slots' must be an int in [1, 2^31 - 1] (AITER's id offsets are int32; got "
                         f"{max_id_slots!r})")
    return max_id_slots


def _pos_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'{attribute.name}' must be an int >= 1 (got {value!r})")


def _opt_pos_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _pos_int(inst, attribute, value)


def _in(allowed: tuple):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"'{attribute.name}' must be in {allowed} (got {value!r})")

    return check


_dtype_key = _in(tuple(DTYPE_KEYS.values()))


@attrs.frozen(kw_only=True)
class PersistentMetadata:
    """Arguments of ``get_mla_metadata_info_v1`` (sizes) and ``get_mla_metadata_v1`` (fill), as data.

    The six buffers (``work_meta_data``, ``work_indptr``, ``work_info_set``, ``reduce_indptr``,
    ``reduce_final_map``, ``reduce_partial_map``) are allocated once per distinct record (the record
    is the cache key: batch shape, heads, dtypes, topk) and refilled in place on every call, because
    the work plan encodes each token's valid-id count (``kv_indptr``), which changes every step. The
    fill is a device kernel reading device ``indptr``s: no host synchronisation. The arguments every
    call shares are module constants: ``max_seqlen_qo = uni_seqlen_qo =`` :data:`MAX_SEQLEN_Q`,
    ``num_heads_k =`` :data:`NUM_KV_HEADS`, ``is_sparse =`` :data:`IS_SPARSE`, ``is_causal =``
    :data:`IS_CAUSAL`, ``page_size =`` :data:`PAGE_SIZE`.

    Attributes:
        batch_size: AITER batches = T query tokens (one query row each).
        num_heads: the *padded* head count; must equal the q/o heads given to ``mla_decode_fwd``.
        q_dtype, kv_dtype: dtype keys.
        topk: ids per token; with ``is_sparse`` AITER plans ``min(count_t, topk)`` ids per token
            starting at ``t * topk`` (row-strided ``kv_indices``).
        max_split_per_batch: split budget (the path's ``max_split_per_batch`` param), also passed to
            ``mla_decode_fwd`` as ``num_kv_splits``.
        kv_granularity: ``kv_granularity`` of ``get_mla_metadata_v1`` (the path's param: 16 for page size 1, as
            vLLM passes ``max(page_size, 16)``).
        fast_mode: ``fast_mode`` of both metadata functions (the path's param).

    Raises:
        ValueError: a count that is not an int >= 1, an unknown dtype key.

    Source: ROCm/aiter ``aiter/ops/attention.py`` (``get_mla_metadata_info_v1(batch_size,
    max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse, fast_mode, num_kv_splits, ...)`` returns
    ``(shape, dtype)`` of work_metadata_ptrs, **work_indptr, work_info_set**, reduce_indptr,
    reduce_final_map, reduce_partial_map; ``get_mla_metadata_v1(qo_indptr, kv_indptr,
    kv_last_page_lens, num_heads_per_head_k, num_heads_k, is_causal, work_metadata_ptrs,
    **work_info_set, work_indptr**, reduce_indptr, reduce_final_map, reduce_partial_map, *,
    page_size, kv_granularity, max_seqlen_qo, uni_seqlen_qo, fast_mode, topk, max_split_per_batch,
    dtype_q, dtype_kv)``: note the swapped order of ``work_indptr`` / ``work_info_set``).
    """

    batch_size: int = attrs.field(validator=_pos_int)
    num_heads: int = attrs.field(validator=_pos_int)
    q_dtype: str = attrs.field(validator=_dtype_key)
    kv_dtype: str = attrs.field(validator=_dtype_key)
    topk: int = attrs.field(validator=_pos_int)
    max_split_per_batch: int = attrs.field(validator=_pos_int)
    kv_granularity: int = attrs.field(validator=_pos_int)
    fast_mode: bool = attrs.field(validator=attrs.validators.instance_of(bool))


@attrs.frozen(kw_only=True)
class AiterCall:
    """One ``aiter.mla.mla_decode_fwd`` call as data (no tensors). Base of the two call kinds.

    Use :class:`AiterDecodeCall` (non-persistent, ``aiter_lse*`` paths) or
    :class:`AiterPersistentCall` (``aiter_persistent``); only the latter has a ``metadata`` field,
    so a non-persistent call *cannot* carry persistent metadata. What comes with the tensors of each
    call is not part of the record: ``N`` (the KV cache is viewed as ``(-1, 1, 1, 576)``) and
    ``sm_scale`` (read from the inputs at launch), so one record serves every call of its
    ``(spec, platform, T)``.

    Attributes:
        path: the rule-table path this call serves.
        row_id: id of the rule-table row that chose the path.
        num_tokens: T query tokens (= AITER batches).
        num_heads: H, the caller's heads (the result is sliced back to H).
        padded_heads: Hp >= H heads given to AITER (q zero-padded to ``[T, Hp, 576]``), from the
            plan's ``pad_heads_to`` / ``pad_heads_multiple`` params.
        topk: ids per token in ``indices [T, topk]``.
        q_dtype, kv_dtype: dtype keys.
        out_dtype: dtype key of ``o`` / ``out`` (q's dtype; bf16 for fp8 q).
        logit_cap: the call's ``logit_cap`` (the table sends only ``<= 0`` here).
        return_lse: whether ``return_lse=True`` is passed (AITER then returns fp32 ``[T, Hp]``,
            natural log, sink excluded).
        pass_q_scale, pass_kv_scale: whether ``q_scale`` / ``kv_scale`` (fp32 ``[1]``) are passed
            (fp8 q / fp8 KV).
        num_kv_splits: explicit split count passed to AITER, or ``None``: AITER's heuristic, or, when
            ``min_kv_splits`` is set, not yet resolved (see :attr:`needs_meta_param`).
        min_kv_splits: the least split count (the ``min_kv_splits`` param), or ``None``: AITER's pick
            ``n`` becomes ``max(n, min_kv_splits)``.
        kv_indices_layout: ``packed`` (non-persistent) or ``row_strided`` (persistent sparse).

    Raises:
        ValueError: a field out of its domain (counts >= 1, known dtype keys, ``padded_heads >=
            num_heads``, ``num_kv_splits >= min_kv_splits``).
    """

    persistent: ClassVar[bool] = False

    path: str = attrs.field(validator=_in(AITER_PATHS))
    row_id: str = "forced"
    num_tokens: int = attrs.field(validator=_pos_int)
    num_heads: int = attrs.field(validator=_pos_int)
    padded_heads: int = attrs.field(validator=_pos_int)
    topk: int = attrs.field(validator=_pos_int)
    q_dtype: str = attrs.field(validator=_dtype_key)
    kv_dtype: str = attrs.field(validator=_dtype_key)
    out_dtype: str = attrs.field(validator=_dtype_key)
    logit_cap: float = attrs.field(default=0.0, converter=float)
    return_lse: bool = False
    pass_q_scale: bool = False
    pass_kv_scale: bool = False
    num_kv_splits: Optional[int] = attrs.field(default=None, validator=_opt_pos_int)
    min_kv_splits: Optional[int] = attrs.field(default=None, validator=_opt_pos_int)
    kv_indices_layout: str = attrs.field(default="packed", validator=_in(KV_INDICES_LAYOUTS))

    def __attrs_post_init__(self) -> None:
        if self.padded_heads < self.num_heads:
            raise ValueError(f"'padded_heads' must be >= num_heads={self.num_heads} (got {self.padded_heads})")
        if None not in (self.num_kv_splits, self.min_kv_splits) and self.num_kv_splits < self.min_kv_splits:
            raise ValueError(f"'num_kv_splits' must be >= min_kv_splits={self.min_kv_splits} "
                             f"(got {self.num_kv_splits})")

    @property
    def needs_meta_param(self) -> bool:
        """Whether the split count still waits for AITER's heuristic (``min_kv_splits`` set, no count).

        Such a call prints and compares like any other, but :func:`~.launch.run_call` refuses it:
        resolve it with :func:`with_meta_param` (what :func:`~.launch.launch_aiter` does).
        """
        return self.min_kv_splits is not None and self.num_kv_splits is None

    @property
    def kv_view_shape(self) -> tuple[int, int, int, int]:
        """``(-1, 1, 1, 576)``: the KV cache ``[N, 576]`` as pages of one row with one KV head."""
        return (-1, PAGE_SIZE, NUM_KV_HEADS, D_QK)

    @property
    def q_shape(self) -> tuple[int, int, int]:
        """``(T, Hp, 576)`` of the (padded) q given to AITER."""
        return (self.num_tokens, self.padded_heads, D_QK)

    @property
    def o_shape(self) -> tuple[int, int, int]:
        """``(T, Hp, 512)`` of the output buffer AITER writes in place."""
        return (self.num_tokens, self.padded_heads, D_V)

    @property
    def kv_indices_size(self) -> int:
        """``T * topk``: fixed size of ``kv_indices`` (tail unused)."""
        return self.num_tokens * self.topk

    def scalar_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``mla_decode_fwd`` that are not tensors and not ``sm_scale`` (which comes
        with the inputs): ``page_size``, ``nhead_kv``, ``logit_cap``, ``num_kv_splits`` when set,
        ``return_lse`` only when True."""
        kw: dict[str, Any] = {"page_size": PAGE_SIZE, "nhead_kv": NUM_KV_HEADS, "logit_cap": self.logit_cap}
        if self.num_kv_splits is not None:
            kw["num_kv_splits"] = self.num_kv_splits
        if self.return_lse:
            kw["return_lse"] = True
        return kw

    def buffer_key(self) -> tuple:
        """Hashable key of the device buffers this call needs (shape, layout, splits, metadata). The heads before
        padding are part of it: whether the buffers hold a padded-q scratch depends on them (a 16-head call's
        buffers, without one, handed q unpadded to a 5-head call padded to 16: a break test, fortieth session)."""
        return (self.num_tokens, self.topk, self.num_heads, self.padded_heads, self.q_dtype, self.kv_dtype,
                self.out_dtype, self.kv_indices_layout, self.num_kv_splits)

    def __str__(self) -> str:
        kind = "persistent" if self.persistent else "non-persistent"
        if self.num_kv_splits is not None:
            splits = str(self.num_kv_splits)
        elif self.min_kv_splits is not None:
            splits = f"max(auto,{self.min_kv_splits})"
        else:
            splits = "auto"
        return (f"{self.path}[{self.row_id}] {kind} T={self.num_tokens} H={self.num_heads}->{self.padded_heads} "
                f"topk={self.topk} q={self.q_dtype} kv={self.kv_dtype} splits={splits} "
                f"lse={self.return_lse} indices={self.kv_indices_layout}")


@attrs.frozen(kw_only=True)
class AiterDecodeCall(AiterCall):
    """A non-persistent call (``aiter_lse``, ``aiter_lse_single_split``, ``aiter_lse_fp8_two_split``).

    Has no metadata field: persistent metadata cannot be attached. ``return_lse`` is always True.
    When ``num_kv_splits`` is set, the launcher also passes ``num_kv_splits_indptr =
    arange(T + 1) * num_kv_splits`` (``arange(T + 1)`` for one split): AITER ignores a given
    ``num_kv_splits`` unless ``num_kv_splits_indptr`` is given too (it re-runs ``get_meta_param``).

    Raises:
        ValueError: a persistent path, ``return_lse`` False, a layout other than ``packed``.

    Source: ROCm/aiter ``aiter/mla.py`` (``if num_kv_splits is None or num_kv_splits_indptr is None:
    num_kv_splits, num_kv_splits_indptr = get_meta_param(...)``; ``get_meta_param`` builds
    ``arange(0, (bs + 1) * n, n)``).
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.path not in NON_PERSISTENT_PATHS:
            raise ValueError(f"'path' of a non-persistent call must be in {sorted(NON_PERSISTENT_PATHS)} "
                             f"(got {self.path!r})")
        if not self.return_lse:
            raise ValueError(f"'return_lse' must be True on {self.path!r} "
                             f"(the aiter_lse* paths exist to return the LSE)")
        if self.kv_indices_layout != "packed":
            raise ValueError(f"'kv_indices_layout' of a non-persistent call must be 'packed' "
                             f"(got {self.kv_indices_layout!r})")


@attrs.frozen(kw_only=True)
class AiterPersistentCall(AiterCall):
    """A persistent call (``aiter_persistent``): work/reduce metadata given to ``mla_decode_fwd``.

    ``num_kv_splits`` is always explicit (``metadata.max_split_per_batch``): AITER silently falls
    back to the non-persistent kernel (which reads ``kv_indices`` packed, not row-strided) for some
    shapes when ``num_kv_splits`` is ``None``, and never does so when it is given. ``kv_indices`` are
    row-strided (sparse metadata).

    Attributes:
        metadata: the :class:`PersistentMetadata` (same padded heads, dtypes and topk as the call).

    Raises:
        ValueError: another path, metadata built for another shape, ``num_kv_splits`` other than
            the metadata's split budget, ``min_kv_splits`` set, a layout other than ``row_strided``.

    Source: ROCm/aiter ``aiter/mla.py`` (``if persistent_mode and num_kv_splits is None:
    persistent_mode = _use_persistent_mla_decode(...)``).
    """

    persistent: ClassVar[bool] = True

    metadata: PersistentMetadata

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.path != "aiter_persistent":
            raise ValueError(f"'path' of a persistent call must be 'aiter_persistent' (got {self.path!r})")
        m = self.metadata
        mine = (self.num_tokens, self.padded_heads, self.q_dtype, self.kv_dtype, self.topk)
        theirs = (m.batch_size, m.num_heads, m.q_dtype, m.kv_dtype, m.topk)
        if mine != theirs:
            raise ValueError(
                f"'metadata' must be built for (T, padded heads, q dtype, kv dtype, topk) = {mine} (got {theirs})"
            )
        if self.num_kv_splits != m.max_split_per_batch:
            raise ValueError(f"'num_kv_splits' must equal metadata.max_split_per_batch={m.max_split_per_batch} "
                             f"(got {self.num_kv_splits!r})")
        if self.min_kv_splits is not None:
            raise ValueError(f"'min_kv_splits' must be None on a persistent call (got {self.min_kv_splits})")
        if self.kv_indices_layout != "row_strided":
            raise ValueError(f"'kv_indices_layout' of a persistent sparse call must be 'row_strided' "
                             f"(got {self.kv_indices_layout!r})")

    def buffer_key(self) -> tuple:
        return super().buffer_key() + (self.metadata,)


def check_mla_params(table: Any) -> None:
    """Every row of the ``mla_decode`` table gives, merged with its path's defaults, only params its path reads
    (:data:`PATH_PARAMS` for the AITER paths; none on ``triton`` and ``reference``), each of its type; the AITER
    paths' required ones (:data:`REQUIRED_PARAMS`) are given. Refusal rows choose no path and are skipped.

    Raises:
        dispatch.TableError: naming the file, line, row, param and what is allowed.
    """
    from mla_sink import dispatch

    from mla_sink.core.records import COUNT_MAX

    where = table.source_file or table.name
    for row in table.rows:
        if row.path is None:
            continue
        allowed = PATH_PARAMS.get(row.path, {})
        params = table.row_params(row)
        for name, value in params.items():
            # a param from the path's defaults is the path's line's fault, not the row's
            at = (f"{where}:{row.line}: row {row.id!r}" if name in row.params else
                  f"{where}:{table.paths[row.path].line}: path {row.path!r} (its default params, for row {row.id!r})")
            kind = allowed.get(name)
            if kind is None:
                raise dispatch.TableError(f"{at}: path {row.path!r} reads no param {name!r} (its params: "
                                          f"{sorted(allowed) or 'none'})")
            ok = (isinstance(value, bool) if kind is bool
                  else not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= COUNT_MAX)
            if not ok:
                raise dispatch.TableError(f"{at}: param {name!r} must be "
                                          f"{'a bool' if kind is bool else f'an int in [1, {COUNT_MAX}]'} "
                                          f"(got {value!r})")
        missing = [n for n in REQUIRED_PARAMS.get(row.path, ()) if n not in params]
        if missing:
            raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: path {row.path!r} needs the params "
                                      f"{missing} (in the row or the path's defaults)")
        _check_padded_heads(table, row, params, where)


def _check_padded_heads(table: Any, row: Any, params: dict, where: str) -> None:
    """The heads a row pads every call to (``pad_heads_to``, rounded up to ``pad_heads_multiple``) meet its path's
    ``requires`` on ``num_heads``: AITER is called with the padded count (a break test, fifty-third session: a
    ``pad_heads_to: 200`` on a path that requires at most 128 heads loaded, and 24 heads were planned as 208)."""
    from mla_sink import dispatch
    from mla_sink.dispatch.schema import format_value

    if "pad_heads_to" not in params:
        return
    padded = padded_heads(1, params["pad_heads_to"], params.get("pad_heads_multiple"))
    for cond in table.paths[row.path].requires:
        if cond.field == "num_heads" and not cond.holds(padded):
            why = f" ({cond.because})" if cond.because else ""
            raise dispatch.TableError(f"{where}:{row.line}: row {row.id!r}: param 'pad_heads_to' pads every call to "
                                      f"{padded} heads, which path {row.path!r} does not take: num_heads {cond.op} "
                                      f"{format_value(cond.arg)}{why}")


def padded_heads(num_heads: int, pad_heads_to: int, pad_heads_multiple: Optional[int]) -> int:
    """The heads AITER is called with: ``max(num_heads, pad_heads_to)``, rounded up to a multiple of
    ``pad_heads_multiple`` when one is given (the params of a row of ``tables/mla_decode.yaml``)."""
    heads = max(num_heads, pad_heads_to)
    if pad_heads_multiple is not None:
        heads = -(-heads // pad_heads_multiple) * pad_heads_multiple
    return heads


def _param(plan: LaunchPlan, name: str, *, required: bool) -> Any:
    if name not in plan.params:
        if required:
            raise ValueError(
                f"plan.params[{name!r}] is required on path {plan.path!r} (row {plan.row_id}); the path declares it "
                f"in tables/mla_decode.yaml (got params {dict(plan.params)})"
            )
        return None
    return plan.params[name]


def _int_param(plan: LaunchPlan, name: str, *, required: bool) -> Optional[int]:
    value = _param(plan, name, required=required)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"plan.params[{name!r}] must be an int >= 1 (got {value!r}) (row {plan.row_id})")
    return value


def _check_meta_param(meta_param: Any, num_tokens: int) -> int:
    if (not isinstance(meta_param, tuple) or len(meta_param) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in meta_param)):
        raise ValueError(f"'meta_param' must be a tuple (num_kv_splits: int, batch_size: int) (got {meta_param!r})")
    splits, batch = meta_param
    if splits < 1:
        raise ValueError(f"'meta_param' num_kv_splits must be >= 1 (got {splits})")
    if batch != num_tokens:
        raise ValueError(
            f"'meta_param' was computed for batch_size={batch} but the call has num_tokens={num_tokens}; "
            "AITER's split heuristic depends on the batch size"
        )
    return splits


def with_meta_param(call: AiterCall, meta_param: tuple[int, int]) -> AiterCall:
    """Resolve the split count of a call that waits for AITER's heuristic: ``max(n, min_kv_splits)``.

    Args:
        call: a call with :attr:`AiterCall.needs_meta_param` (other calls are returned unchanged).
        meta_param: ``(num_kv_splits, batch_size)`` from :func:`~.launch.aiter_meta_param` for this
            call's T, padded heads, topk and q dtype.

    Returns:
        The call with ``num_kv_splits = max(meta_param[0], call.min_kv_splits)`` (AITER's pick of 1
        becomes 2 for ``min_kv_splits = 2``, 3 stays 3).

    Raises:
        ValueError: ``meta_param`` malformed, or computed for another batch size than ``call.num_tokens``.
    """
    if not call.needs_meta_param:
        return call
    picked = _check_meta_param(meta_param, call.num_tokens)
    return attrs.evolve(call, num_kv_splits=max(picked, call.min_kv_splits))


def plan_aiter(plan: LaunchPlan, *, num_tokens: int, meta_param: Optional[tuple[int, int]] = None,
               max_id_slots: Optional[int] = None) -> AiterCall:
    """Plan the exact ``aiter.mla.mla_decode_fwd`` call of an AITER path for T tokens. Pure; no tensors, no AITER.

    One call: ``T * topk`` must fit AITER's int32 id offsets. The library plans every AITER launch through
    :func:`~.chunks.plan_aiter_launch`, which serves a call of more id slots as consecutive token chunks, each
    planned here.

    Everything comes from the plan: the spec (heads, dtypes, topk, ``logit_cap``, need_lse) and the
    params of the winning row on top of its path's defaults (``tables/mla_decode.yaml``):

    * ``pad_heads_to`` (required): ``Hp = max(H, pad_heads_to)``; then, when ``pad_heads_multiple``
      is given, ``Hp`` is rounded up to a multiple of it;
    * ``aiter_persistent``: persistent metadata (:class:`PersistentMetadata`) for ``Hp``, the dtypes
      and ``topk`` with the ``max_split_per_batch`` param (required) as split budget and
      ``num_kv_splits``; ``return_lse`` (required bool); row-strided ``kv_indices``;
    * ``aiter_lse*``: non-persistent, ``return_lse=True``, packed ``kv_indices``; ``num_kv_splits``
      from the param of that name when given (``aiter_lse_single_split``: 1), else AITER's heuristic;
      with a ``min_kv_splits`` param (``aiter_lse_fp8_two_split``), ``num_kv_splits =
      max(meta_param[0], min_kv_splits)``, or ``None`` without ``meta_param`` (the call then waits
      for :func:`with_meta_param`; :func:`~.launch.launch_aiter` resolves it).

    Args:
        plan: the :class:`~mla_sink.core.plan.LaunchPlan` (path, params, spec, platform, row_id).
        num_tokens: T (>= 1).
        meta_param: ``(num_kv_splits, batch_size)``: AITER's split heuristic result,
            ``aiter.mla.get_meta_param(None, T, T * topk, Hp, 1, q.dtype)[0]`` and the T it was
            computed for (:func:`~.launch.aiter_meta_param`). Used only with ``min_kv_splits``.
        max_id_slots: the most id slots one call takes (:func:`id_slot_limit`; default :data:`MAX_ID_SLOTS`).

    Returns:
        :class:`AiterDecodeCall` for the ``aiter_lse*`` paths, :class:`AiterPersistentCall` for
        ``aiter_persistent``.

    Raises:
        ValueError: a non-AITER path; ``num_tokens`` not an int >= 1; ``num_tokens * topk`` beyond
            ``max_id_slots`` (AITER's int32 id offsets: :func:`~.chunks.plan_aiter_launch` chunks such a
            call); ``max_id_slots`` out of its range; a required param missing or a
            param of the wrong type; a persistent call without LSE for a spec that needs one (sinks,
            DCP, return_lse); a malformed ``meta_param`` or one computed for another T.

    Source: ROCm/aiter ``aiter/mla.py`` (``mla_decode_fwd``, ``get_meta_param``, the one-split fp8
    fast path returning ``final_lse`` without a stage-2 write); ``aiter/ops/attention.py``
    (metadata); docs/DESIGN.md ("Facts about AITER").
    """
    if plan.path not in AITER_PATHS:
        raise ValueError(f"'plan.path' must be one of {AITER_PATHS} (got {plan.path!r})")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"'num_tokens' must be an int >= 1 (got {num_tokens!r})")
    spec = plan.spec
    limit = id_slot_limit(max_id_slots)
    if num_tokens * spec.topk > limit:
        # kv_indptr's running count and the row starts t * topk are int32 (AITER's API, and the id buffers' fill):
        # past 2^31 - 1 they wrap negative (forty-first session); plan_aiter_launch chunks such a call
        raise ValueError(
            f"'num_tokens' * topk = {num_tokens} * {spec.topk} = {num_tokens * spec.topk} id slots exceeds "
            f"{limit}, the most one AITER call indexes (kv_indptr and the row starts are int32): one call takes at "
            f"most {limit // spec.topk} tokens; plan_aiter_launch serves more as token chunks (row {plan.row_id})"
        )
    heads = padded_heads(spec.num_heads, _int_param(plan, "pad_heads_to", required=True),
                         _int_param(plan, "pad_heads_multiple", required=False))
    common = dict(
        path=plan.path, row_id=plan.row_id, num_tokens=num_tokens, num_heads=spec.num_heads,
        padded_heads=heads, topk=spec.topk, q_dtype=spec.q_dtype, kv_dtype=spec.kv_dtype,
        out_dtype=DTYPE_KEYS[out_dtype_for(spec.q_dtype)], logit_cap=spec.logit_cap,
        pass_q_scale=spec.q_dtype in FP8_KEYS, pass_kv_scale=spec.kv_dtype in FP8_KEYS,
    )

    if plan.path == "aiter_persistent":
        return_lse = _param(plan, "return_lse", required=True)
        if not isinstance(return_lse, bool):
            raise ValueError(f"plan.params['return_lse'] must be a bool (got {return_lse!r}) (row {plan.row_id})")
        if spec.need_lse and not return_lse:
            raise ValueError(
                f"path 'aiter_persistent' (row {plan.row_id}) returns no LSE, but the call needs one "
                f"(sinks={spec.sinks}, dcp_world_size={spec.dcp_world_size}, need_lse={spec.need_lse})"
            )
        splits = _int_param(plan, "max_split_per_batch", required=True)
        fast_mode = _param(plan, "fast_mode", required=True)
        if not isinstance(fast_mode, bool):
            raise ValueError(f"plan.params['fast_mode'] must be a bool (got {fast_mode!r}) (row {plan.row_id})")
        meta = PersistentMetadata(batch_size=num_tokens, num_heads=heads, q_dtype=spec.q_dtype,
                                  kv_dtype=spec.kv_dtype, topk=spec.topk, max_split_per_batch=splits,
                                  kv_granularity=_int_param(plan, "kv_granularity", required=True),
                                  fast_mode=fast_mode)
        return AiterPersistentCall(**common, return_lse=return_lse, num_kv_splits=splits,
                                   kv_indices_layout="row_strided", metadata=meta)

    call = AiterDecodeCall(**common, return_lse=True, kv_indices_layout="packed",
                           num_kv_splits=_int_param(plan, "num_kv_splits", required=False),
                           min_kv_splits=_int_param(plan, "min_kv_splits", required=False))
    if meta_param is not None:
        call = with_meta_param(call, meta_param)
    return call
