"""Pure planners for the AITER paths: ``LaunchPlan`` + shapes -> the exact ``mla_decode_fwd`` call as data.

No tensors are created here and AITER is never imported; every field of an :class:`AiterCall` is a
plain value, so a plan can be printed, compared and tested on a laptop. :mod:`.buffers` turns the
call into device tensors and :mod:`.launch` runs it.

How our sparse decode maps onto AITER's paged MLA decode (page size 1):

* every query token is its own AITER "batch" of one query row: ``qo_indptr = arange(T + 1)``,
  ``max_seqlen_q = 1``, ``kv_last_page_lens = ones(T)``; the KV cache ``[N, 576]`` is viewed as
  ``[N, 1, 1, 576]`` (pages of one row, one KV head), so ``kv_indices`` hold row ids;
* ``kv_indptr [T + 1]`` is the cumulative count of each token's *valid* ids (``ragged_valid``);
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
from packaging.version import Version

from mla_sink.core.dtypes import FP8_KEYS, out_dtype_for, DTYPE_KEYS
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import D_QK, D_V
from mla_sink.core.validate import check_sm_scale

#: The four AITER paths of the rule table.
AITER_PATHS: tuple[str, ...] = ("aiter_persistent", "aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split")
NON_PERSISTENT_PATHS: frozenset[str] = frozenset({"aiter_lse", "aiter_lse_single_split", "aiter_lse_fp8_two_split"})

#: AITER never pads query heads itself; head counts below this are padded by us and sliced back.
AITER_MIN_HEADS = 16
#: First AITER release whose non-persistent ``return_lse`` is usable (garbage < 0.1.13, abort 0.1.13-0.1.18).
AITER_LSE_MIN_VERSION = Version("0.1.19")
#: Split budget given to persistent calls (AITER's own ``get_mla_metadata_info_v1`` default ``num_kv_splits``).
DEFAULT_MAX_SPLIT_PER_BATCH = 32
#: ``kv_granularity`` of the metadata for page size 1 (vLLM passes ``max(page_size, 16)``).
KV_GRANULARITY = 16

KV_INDPTR_MODES = ("ragged_valid",)
KV_INDICES_LAYOUTS = ("packed", "row_strided")


def padded_head_count(num_heads: int, pad_to: int = AITER_MIN_HEADS) -> int:
    """Head count sent to AITER: ``max(num_heads, pad_to)``.

    Args:
        num_heads: H, the caller's query heads (>= 1).
        pad_to: the smallest head count AITER is given (16).

    Returns:
        The padded head count ``Hp``; q is zero-padded to ``[T, Hp, 576]`` and the result sliced back.

    Raises:
        ValueError: ``num_heads`` or ``pad_to`` is not a positive int.

    Source: docs/DESIGN.md ("AITER never pads heads below 16"); vllm-project/vllm ``vllm/_aiter_ops.py``.
    """
    for name, v in (("num_heads", num_heads), ("pad_to", pad_to)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"'{name}' must be an int >= 1 (got {v!r})")
    return max(num_heads, pad_to)


def _pos_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'{attribute.name}' must be an int >= 1 (got {value!r})")


def _nonneg_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"'{attribute.name}' must be an int >= 0 (got {value!r})")


def _in(allowed: tuple):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"'{attribute.name}' must be in {allowed} (got {value!r})")

    return check


def _aiter_dtype(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    allowed = ("bf16", "fp8_e4m3", "fp8_e4m3fnuz")
    if value not in allowed:
        raise ValueError(
            f"'{attribute.name}' must be in {allowed} (got {value!r}); fp16 is never sent to AITER "
            "(fp16 q aborts inside the asm wrapper)"
        )


def _non_positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, float) or value > 0:
        raise ValueError(f"'{attribute.name}' must be a float <= 0 for AITER, which asserts logit_cap <= 0 (got {value!r})")


@attrs.frozen(kw_only=True)
class PersistentMetadata:
    """Arguments of ``get_mla_metadata_info_v1`` (sizes) and ``get_mla_metadata_v1`` (fill), as data.

    The six buffers (``work_meta_data``, ``work_indptr``, ``work_info_set``, ``reduce_indptr``,
    ``reduce_final_map``, ``reduce_partial_map``) are allocated once per distinct record (the record
    is the cache key: batch shape, heads, dtypes, topk) and refilled in place on every call, because
    the work plan encodes each token's valid-id count (``kv_indptr``), which changes every step. The
    fill is a device kernel reading device ``indptr``s: no host synchronisation.

    Attributes:
        batch_size: AITER batches = T query tokens (one query row each).
        max_seqlen_qo: 1 (``uni_seqlen_qo`` too): one query row per batch.
        num_heads: the *padded* head count; must equal the q/o heads given to ``mla_decode_fwd``.
        num_heads_k: 1 (one shared KV head).
        q_dtype, kv_dtype: dtype keys (``bf16``, ``fp8_e4m3``, ``fp8_e4m3fnuz``).
        topk: ids per token; ``is_sparse=True`` makes AITER plan ``min(count_t, topk)`` ids per token
            starting at ``t * topk`` (row-strided ``kv_indices``).
        is_sparse: True.
        is_causal: True (AITER's default; a no-op with one query row per batch).
        fast_mode: True (metadata sizes of ``fast_mode``).
        page_size: 1.
        kv_granularity: 16.
        max_split_per_batch: split budget, also passed to ``mla_decode_fwd`` as ``num_kv_splits``.

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
    q_dtype: str = attrs.field(validator=_aiter_dtype)
    kv_dtype: str = attrs.field(validator=_aiter_dtype)
    topk: int = attrs.field(validator=_pos_int)
    max_split_per_batch: int = attrs.field(default=DEFAULT_MAX_SPLIT_PER_BATCH, validator=_pos_int)
    max_seqlen_qo: int = attrs.field(default=1, validator=_in((1,)))
    num_heads_k: int = attrs.field(default=1, validator=_in((1,)))
    is_sparse: bool = attrs.field(default=True, validator=_in((True,)))
    is_causal: bool = True
    fast_mode: bool = True
    page_size: int = attrs.field(default=1, validator=_in((1,)))
    kv_granularity: int = attrs.field(default=KV_GRANULARITY, validator=_pos_int)

    def __attrs_post_init__(self) -> None:
        if self.num_heads % 8:
            raise ValueError(
                f"'num_heads' of persistent metadata must be a multiple of 8 (got {self.num_heads}); "
                "get_mla_metadata_info_v1 asserts num_head_qo % 8 == 0"
            )


@attrs.frozen(kw_only=True)
class AiterCall:
    """One ``aiter.mla.mla_decode_fwd`` call as data (no tensors). Base of the two call kinds.

    Use :class:`AiterDecodeCall` (non-persistent, ``aiter_lse*`` paths) or
    :class:`AiterPersistentCall` (``aiter_persistent``); only the latter has a ``metadata`` field,
    so a non-persistent call *cannot* carry persistent metadata.

    Attributes:
        path: the rule-table path this call serves.
        row_id: id of the rule-table row that chose the path.
        num_tokens: T query tokens (= AITER batches).
        num_heads: H, the caller's heads (the result is sliced back to H).
        padded_heads: Hp >= 16 heads given to AITER (q zero-padded to ``[T, Hp, 576]``).
        topk: ids per token in ``indices [T, topk]``.
        num_kv_rows: N rows of ``kv_cache``; viewed as ``[N, 1, 1, 576]``.
        q_dtype, kv_dtype: dtype keys (never fp16).
        out_dtype: dtype key of ``o`` / ``out`` (q's dtype; bf16 for fp8 q).
        sm_scale: multiplies ``q.k``; natural-exp softmax.
        logit_cap: <= 0 (AITER asserts it).
        max_seqlen_q: 1 (every token is its own batch; ``qo_indptr = arange(T + 1)``).
        return_lse: whether ``return_lse=True`` is passed (AITER then returns fp32 ``[T, Hp]``,
            natural log, sink excluded).
        pass_q_scale, pass_kv_scale: whether ``q_scale`` / ``kv_scale`` (fp32 ``[1]``) are passed
            (fp8 q needs both).
        num_kv_splits: explicit split count passed to AITER, or ``None`` (AITER's heuristic).
        kv_indptr_mode: ``ragged_valid``: ``kv_indptr[t+1] - kv_indptr[t]`` = valid ids of token t.
        kv_indices_layout: ``packed`` (non-persistent) or ``row_strided`` (persistent sparse).
        qo_indptr: ``arange`` (``arange(T + 1)``); kv_last_page_lens: ``ones`` (``ones(T)``).
        page_size, nhead_kv: 1 and 1.
    """

    persistent: ClassVar[bool] = False

    path: str = attrs.field(validator=_in(AITER_PATHS))
    row_id: str = "forced"
    num_tokens: int = attrs.field(validator=_pos_int)
    num_heads: int = attrs.field(validator=_pos_int)
    padded_heads: int = attrs.field(validator=_pos_int)
    topk: int = attrs.field(validator=_pos_int)
    num_kv_rows: int = attrs.field(validator=_pos_int)
    q_dtype: str = attrs.field(validator=_aiter_dtype)
    kv_dtype: str = attrs.field(validator=_aiter_dtype)
    out_dtype: str = attrs.field(validator=_in(("bf16",)))
    sm_scale: float = attrs.field(converter=float)
    logit_cap: float = attrs.field(default=0.0, converter=float, validator=_non_positive)
    max_seqlen_q: int = attrs.field(default=1, validator=_in((1,)))
    return_lse: bool = False
    pass_q_scale: bool = False
    pass_kv_scale: bool = False
    num_kv_splits: Optional[int] = None
    kv_indptr_mode: str = attrs.field(default="ragged_valid", validator=_in(KV_INDPTR_MODES))
    kv_indices_layout: str = attrs.field(default="packed", validator=_in(KV_INDICES_LAYOUTS))
    qo_indptr: str = attrs.field(default="arange", validator=_in(("arange",)))
    kv_last_page_lens: str = attrs.field(default="ones", validator=_in(("ones",)))
    page_size: int = attrs.field(default=1, validator=_in((1,)))
    nhead_kv: int = attrs.field(default=1, validator=_in((1,)))

    def __attrs_post_init__(self) -> None:
        if self.padded_heads < max(self.num_heads, AITER_MIN_HEADS):
            raise ValueError(
                f"'padded_heads' must be >= max(num_heads, {AITER_MIN_HEADS}) = "
                f"{max(self.num_heads, AITER_MIN_HEADS)} (got {self.padded_heads}); AITER never pads heads below 16"
            )
        if self.q_dtype in FP8_KEYS and not (self.pass_q_scale and self.pass_kv_scale):
            raise ValueError("fp8 q needs both 'q_scale' and 'kv_scale' passed to AITER (pass_q_scale/pass_kv_scale)")
        if self.num_kv_splits is not None:
            _pos_int(self, attrs.fields(type(self)).num_kv_splits, self.num_kv_splits)

    @property
    def kv_view_shape(self) -> tuple[int, int, int, int]:
        """``(N, 1, 1, 576)``: the KV cache as pages of one row with one KV head."""
        return (self.num_kv_rows, 1, 1, D_QK)

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
        """Keyword arguments of ``mla_decode_fwd`` that are not tensors (``return_lse`` only when True)."""
        kw: dict[str, Any] = {"page_size": self.page_size, "nhead_kv": self.nhead_kv,
                              "sm_scale": self.sm_scale, "logit_cap": self.logit_cap}
        if self.num_kv_splits is not None:
            kw["num_kv_splits"] = self.num_kv_splits
        if self.return_lse:
            kw["return_lse"] = True
        return kw

    def buffer_key(self) -> tuple:
        """Hashable key of the device buffers this call needs (shape, layout, splits, metadata)."""
        return (self.num_tokens, self.topk, self.padded_heads, self.q_dtype, self.kv_dtype,
                self.out_dtype, self.kv_indices_layout, self.num_kv_splits)

    def __str__(self) -> str:
        kind = "persistent" if self.persistent else "non-persistent"
        splits = "auto" if self.num_kv_splits is None else str(self.num_kv_splits)
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

    Source: ROCm/aiter ``aiter/mla.py`` (``if num_kv_splits is None or num_kv_splits_indptr is None:
    num_kv_splits, num_kv_splits_indptr = get_meta_param(...)``; ``get_meta_param`` builds
    ``arange(0, (bs + 1) * n, n)``).
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.path not in NON_PERSISTENT_PATHS:
            raise ValueError(f"'path' of a non-persistent call must be in {sorted(NON_PERSISTENT_PATHS)} (got {self.path!r})")
        if not self.return_lse:
            raise ValueError(f"'return_lse' must be True on {self.path!r} (the aiter_lse* paths exist to return the LSE)")
        if self.kv_indices_layout != "packed":
            raise ValueError(f"'kv_indices_layout' of a non-persistent call must be 'packed' (got {self.kv_indices_layout!r})")


@attrs.frozen(kw_only=True)
class AiterPersistentCall(AiterCall):
    """A persistent call (``aiter_persistent``): work/reduce metadata given to ``mla_decode_fwd``.

    ``num_kv_splits`` is always explicit (``metadata.max_split_per_batch``): AITER silently falls
    back to the non-persistent kernel (which reads ``kv_indices`` packed, not row-strided) for some
    shapes when ``num_kv_splits`` is ``None`` (gfx950 bf16 16 heads, batch >= 32), and never does so
    when it is given. ``kv_indices`` are row-strided (sparse metadata).

    Attributes:
        metadata: the :class:`PersistentMetadata` (same padded heads, dtypes and topk as the call).

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
            raise ValueError(f"'num_kv_splits' must equal metadata.max_split_per_batch={m.max_split_per_batch} (got {self.num_kv_splits!r})")
        if self.kv_indices_layout != "row_strided":
            raise ValueError(f"'kv_indices_layout' of a persistent sparse call must be 'row_strided' (got {self.kv_indices_layout!r})")

    def buffer_key(self) -> tuple:
        return super().buffer_key() + (self.metadata,)


def _int_param(plan: LaunchPlan, name: str, default: Optional[int]) -> Optional[int]:
    value = plan.params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"plan.params[{name!r}] must be an int >= 1 (got {value!r}) (row {plan.row_id})")
    return value


def _check_meta_param(meta_param: Any, num_tokens: int) -> int:
    if meta_param is None:
        raise ValueError(
            "'meta_param' is required for path 'aiter_lse_fp8_two_split': (num_kv_splits, batch_size) from "
            "aiter.mla.get_meta_param(None, T, T * topk, padded_heads, 1, q.dtype)"
        )
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


def plan_aiter(
    plan: LaunchPlan,
    *,
    num_tokens: int,
    num_kv_rows: int,
    topk: int,
    meta_param: Optional[tuple[int, int]] = None,
    sm_scale: Optional[float] = None,
) -> AiterCall:
    """Plan the exact ``aiter.mla.mla_decode_fwd`` call of an AITER path. Pure; no tensors, no AITER.

    Per path (params come from the winning rule row, ``plan.params``):

    * ``aiter_lse``: non-persistent, ``return_lse=True``, ``num_kv_splits = params.get('num_kv_splits')``
      (``None`` = AITER's heuristic).
    * ``aiter_lse_single_split``: as ``aiter_lse`` with ``num_kv_splits = 1`` (and
      ``num_kv_splits_indptr = arange(T + 1)`` at launch).
    * ``aiter_lse_fp8_two_split``: fp8 q; ``num_kv_splits = max(meta_param[0], params['min_kv_splits'])``
      (default 2): AITER's pick of 1 becomes 2, 3 stays 3; ``num_kv_splits_indptr = arange(T + 1) * n``.
    * ``aiter_persistent``: persistent metadata (:class:`PersistentMetadata`) for the padded heads,
      dtypes and ``topk``; ``return_lse = params.get('return_lse', False)``; row-strided ``kv_indices``.

    Args:
        plan: the :class:`~mla_sink.core.plan.LaunchPlan` (path, params, spec, platform, row_id).
        num_tokens: T (>= 1).
        num_kv_rows: N rows of ``kv_cache`` (>= 1).
        topk: ids per token (>= 1).
        meta_param: ``(num_kv_splits, batch_size)``: AITER's split heuristic result,
            ``aiter.mla.get_meta_param(None, T, T * topk, Hp, 1, q.dtype)[0]`` and the T it was
            computed for. Required for ``aiter_lse_fp8_two_split``, ignored otherwise.
        sm_scale: the call's ``sm_scale`` (finite, > 0); default ``576 ** -0.5``.

    Returns:
        :class:`AiterDecodeCall` for the ``aiter_lse*`` paths, :class:`AiterPersistentCall` for
        ``aiter_persistent``.

    Raises:
        ValueError: a non-AITER path; a bad shape; fp16 q; ``logit_cap > 0``; fp8 two-split for a
            non-fp8 q or without ``meta_param``; a single split other than 1; AITER absent or older
            than 0.1.19 for a non-persistent LSE; a persistent call without LSE for a spec that needs
            one (sinks, DCP, return_lse).

    Source: ROCm/aiter ``aiter/mla.py`` (``mla_decode_fwd``, ``get_meta_param``, the one-split fp8
    fast path returning ``final_lse`` without a stage-2 write); ``aiter/ops/attention.py``
    (metadata); docs/DESIGN.md ("Facts about AITER").
    """
    if plan.path not in AITER_PATHS:
        raise ValueError(f"'plan.path' must be one of {AITER_PATHS} (got {plan.path!r})")
    for name, v in (("num_tokens", num_tokens), ("num_kv_rows", num_kv_rows), ("topk", topk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"'{name}' must be an int >= 1 (got {v!r})")
    spec, platform = plan.spec, plan.platform
    if sm_scale is None:
        sm_scale = D_QK ** -0.5
    check_sm_scale(sm_scale)
    if spec.topk != topk:
        raise ValueError(f"'topk' must equal plan.spec.topk={spec.topk} (got {topk})")
    if spec.q_dtype == "fp16" or spec.kv_dtype == "fp16":
        raise ValueError(f"'q_dtype' fp16 is never sent to AITER (fp16 q aborts inside the asm wrapper) (got {spec.q_dtype}/{spec.kv_dtype})")
    if spec.logit_cap > 0:
        raise ValueError(f"'logit_cap' must be <= 0 for AITER, which asserts logit_cap <= 0 (got {spec.logit_cap})")
    if platform.aiter_version is None:
        raise ValueError(f"path {plan.path!r} needs AITER, but platform {platform} has none (AITER not importable)")

    heads = padded_head_count(spec.num_heads, _int_param(plan, "pad_heads_to", AITER_MIN_HEADS))
    if plan.path == "aiter_persistent":
        # Persistent kernels run 16 heads natively and regroup 32..128 in steps of 16: pad up to a
        # multiple of 16 (24 -> 32, 40 -> 48), as vLLM's AITER MLA backend does.
        heads = -(-heads // AITER_MIN_HEADS) * AITER_MIN_HEADS
    fp8_q = spec.q_dtype in FP8_KEYS
    common = dict(
        path=plan.path, row_id=plan.row_id, num_tokens=num_tokens, num_heads=spec.num_heads,
        padded_heads=heads, topk=topk, num_kv_rows=num_kv_rows, q_dtype=spec.q_dtype,
        kv_dtype=spec.kv_dtype, out_dtype=DTYPE_KEYS[out_dtype_for(spec.q_dtype)],
        sm_scale=sm_scale, logit_cap=spec.logit_cap,
        pass_q_scale=fp8_q, pass_kv_scale=spec.kv_dtype in FP8_KEYS,
    )

    if plan.path == "aiter_persistent":
        return_lse = plan.params.get("return_lse", False)
        if not isinstance(return_lse, bool):
            raise ValueError(f"plan.params['return_lse'] must be a bool (got {return_lse!r}) (row {plan.row_id})")
        if spec.need_lse and not return_lse:
            raise ValueError(
                f"path 'aiter_persistent' (row {plan.row_id}) returns no LSE, but the call needs one "
                f"(sinks={spec.sinks}, dcp_world_size={spec.dcp_world_size}, need_lse={spec.need_lse})"
            )
        if return_lse and Version(platform.aiter_version) < AITER_LSE_MIN_VERSION:
            raise ValueError(f"'aiter_version' must be >= {AITER_LSE_MIN_VERSION} for an AITER LSE (got {platform.aiter_version})")
        if return_lse and not persistent_lse_supported(platform.arch, spec.q_dtype, heads):
            raise ValueError(
                f"path 'aiter_persistent' with return_lse=True has no kernel for arch={platform.arch!r} "
                f"q_dtype={spec.q_dtype!r} heads={heads} (persistent+LSE runs on gfx950 bf16/fp8 and gfx942 fp8 "
                "64 heads only; other gfx942 persistent+LSE calls abort)"
            )
        splits = _int_param(plan, "max_split_per_batch", DEFAULT_MAX_SPLIT_PER_BATCH)
        meta = PersistentMetadata(batch_size=num_tokens, num_heads=heads, q_dtype=spec.q_dtype,
                                  kv_dtype=spec.kv_dtype, topk=topk, max_split_per_batch=splits)
        return AiterPersistentCall(**common, return_lse=return_lse, num_kv_splits=splits,
                                   kv_indices_layout="row_strided", metadata=meta)

    if Version(platform.aiter_version) < AITER_LSE_MIN_VERSION:
        raise ValueError(
            f"'aiter_version' must be >= {AITER_LSE_MIN_VERSION} for path {plan.path!r} (got {platform.aiter_version}): "
            "non-persistent return_lse is garbage before 0.1.13 and aborts in 0.1.13-0.1.18"
        )
    if plan.path == "aiter_lse":
        splits = _int_param(plan, "num_kv_splits", None)
    elif plan.path == "aiter_lse_single_split":
        splits = _int_param(plan, "num_kv_splits", 1)
        if splits != 1:
            raise ValueError(f"plan.params['num_kv_splits'] must be 1 on 'aiter_lse_single_split' (got {splits})")
    else:  # aiter_lse_fp8_two_split
        if not fp8_q:
            raise ValueError(f"path 'aiter_lse_fp8_two_split' needs fp8 q (got q_dtype={spec.q_dtype!r})")
        picked = _check_meta_param(meta_param, num_tokens)
        splits = max(picked, _int_param(plan, "min_kv_splits", 2))
    return AiterDecodeCall(**common, return_lse=True, num_kv_splits=splits, kv_indices_layout="packed")



def persistent_lse_supported(arch: str, q_dtype: str, padded_heads: int, max_seqlen_q: int = 1) -> bool:
    """Whether a persistent AITER kernel writes an LSE for this shape (our calls use ``max_seqlen_q = 1``).

    True for gfx950 bf16 (any heads), gfx950 fp8 (except 16 heads at ``max_seqlen_q`` 2) and gfx942
    fp8 with 64 heads at ``max_seqlen_q`` 1; any other persistent+LSE call aborts.

    Source: docs/DESIGN.md ("Facts about AITER": persistent mode with LSE).
    """
    if arch == "gfx950":
        return q_dtype == "bf16" or (q_dtype in FP8_KEYS and not (padded_heads == 16 and max_seqlen_q == 2))
    if arch == "gfx942":
        return q_dtype in FP8_KEYS and padded_heads == 64 and max_seqlen_q == 1
    return False
