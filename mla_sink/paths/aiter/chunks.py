"""AITER launches of more id slots than one call indexes: the call served as consecutive token chunks. Pure.

One ``mla_decode_fwd`` call indexes at most :data:`~.plan.MAX_ID_SLOTS` = 2^31 - 1 id slots (``T * topk``):
``kv_indptr``, the persistent plan's row starts ``t * topk`` and the offsets of the id buffers' fill are int32. A
call of more tokens runs as consecutive chunks of ``c = max_id_slots // topk`` tokens (the last one shorter). Each
chunk is a complete AITER call of its own, planned by :func:`~.plan.plan_aiter` for its token count:

* its own ``qo_indptr = arange(c + 1)``, ``kv_last_page_lens``, ``kv_indptr`` (from 0) and ``kv_indices [c *
  topk]`` built from the chunk's rows of ``indices`` (and ``topk_length``);
* its own ``num_kv_splits_indptr``, persistent metadata (batch size ``c``) and AITER's split heuristic (asked for
  ``c`` tokens: the pick depends on the batch size);
* the chunk's rows of ``q`` in, its rows of ``out`` and ``lse`` written, finalised (empty rows, sinks) as any call.

Every token's result depends on that token's row alone, so the chunks' results are the whole call's. The record
is decided once per ``(spec, platform, T)`` with the rest of the plan; a call that fits one AITER call is planned
as that one :class:`~.plan.AiterCall`, so its launches run as before.

Source: ROCm/aiter ``aiter/ops/attention.py`` and ``csrc/kernels/mla/metadata/v1_2_device.cuh`` (int32 indptrs and
row starts); :mod:`mla_sink.paths.aiter.plan`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import attrs

from mla_sink.core.plan import LaunchPlan
from mla_sink.paths.aiter.plan import AiterCall, id_slot_limit, plan_aiter


def _calls(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (isinstance(value, tuple) and 1 <= len(value) <= 2 and all(isinstance(c, AiterCall) for c in value)):
        raise ValueError(f"'calls' must be a tuple of one or two AiterCall: a full chunk's, then a shorter last "
                         f"chunk's (got {value!r})")


@attrs.frozen(kw_only=True)
class AiterChunkedCall:
    """A call of more id slots than one AITER call indexes, served as consecutive token chunks (see the module).

    Attributes:
        num_tokens: T, the call's query tokens.
        max_id_slots: the most id slots (``tokens * topk``) one AITER call takes (:data:`~.plan.MAX_ID_SLOTS`).
        calls: the :class:`~.plan.AiterCall` of a full chunk (``max_id_slots // topk`` tokens), then, when the last
            chunk is shorter, the last chunk's; the same path, row, heads, dtypes and topk.

    Raises:
        ValueError: ``calls`` not one or two :class:`~.plan.AiterCall` of one path, row, heads, dtypes and topk;
            a full chunk of other than ``max_id_slots // topk`` tokens; a last chunk that is not the rest of T;
            a T that one call serves.
    """

    num_tokens: int
    max_id_slots: int
    calls: tuple = attrs.field(validator=_calls)

    def __attrs_post_init__(self) -> None:
        full = self.calls[0]
        same = ("path", "row_id", "num_heads", "padded_heads", "topk", "q_dtype", "kv_dtype", "out_dtype",
                "return_lse", "kv_indices_layout")
        for call in self.calls[1:]:
            if any(getattr(call, f) != getattr(full, f) for f in same):
                raise ValueError(f"'calls' must share {same} (got {self.calls!r})")
        if full.num_tokens != self.max_id_slots // full.topk:
            raise ValueError(f"'calls'[0] must be a full chunk of max_id_slots // topk = "
                             f"{self.max_id_slots // full.topk} tokens (got {full.num_tokens})")
        if self.num_tokens <= full.num_tokens:
            raise ValueError(f"'num_tokens' must exceed a chunk's {full.num_tokens} tokens: a call of "
                             f"{self.num_tokens} is one AITER call")
        rest = self.num_tokens % full.num_tokens
        got = self.calls[1].num_tokens if len(self.calls) == 2 else 0
        if got != rest:
            raise ValueError(f"'calls' must end with the last chunk's {rest} tokens when T={self.num_tokens} is not "
                             f"a multiple of {full.num_tokens} (got {got or 'none'})")

    # what the launcher and explain read, the chunks' common values
    path = property(lambda self: self.calls[0].path, doc="The rule-table path every chunk's call serves.")
    row_id = property(lambda self: self.calls[0].row_id, doc="The rule-table row that chose the path.")
    topk = property(lambda self: self.calls[0].topk, doc="Ids per token.")
    num_heads = property(lambda self: self.calls[0].num_heads, doc="H, the caller's heads.")
    out_dtype = property(lambda self: self.calls[0].out_dtype, doc="Dtype key of ``out``.")
    return_lse = property(lambda self: self.calls[0].return_lse, doc="Whether the chunks return an LSE.")

    @property
    def chunk_tokens(self) -> int:
        """Tokens of every chunk but a shorter last one: ``max_id_slots // topk``."""
        return self.calls[0].num_tokens

    @property
    def num_chunks(self) -> int:
        """How many chunks: ``ceil(T / chunk_tokens)`` (computed, not counted: explain plans calls of any T without
        tensors, and a list of a chunk per token at ``topk = 2^30`` and ``T = 2^31 - 1`` took gigabytes: a break
        test, forty-third session)."""
        return -(-self.num_tokens // self.chunk_tokens)

    @property
    def chunks(self) -> list:
        """The chunks' token ranges ``[(a, b), ...]``, consecutive, covering ``[0, T)`` (the runner's: a call's ids
        hold ``max_id_slots`` or more slots a chunk, so the list is small beside them)."""
        c = self.chunk_tokens
        return [(a, min(a + c, self.num_tokens)) for a in range(0, self.num_tokens, c)]

    @property
    def needs_meta_param(self) -> bool:
        """Whether a chunk's split count still waits for AITER's heuristic
        (:attr:`~.plan.AiterCall.needs_meta_param`)."""
        return any(c.needs_meta_param for c in self.calls)

    @property
    def why(self) -> str:
        """Why the call runs in chunks, with the numbers."""
        slots = self.num_tokens * self.topk
        return (f"T * topk = {self.num_tokens} * {self.topk} = {slots} id slots exceed {self.max_id_slots}, the most "
                "one AITER call indexes (kv_indptr and the persistent row starts are int32)")

    def call_of(self, num_tokens: int) -> AiterCall:
        """The call of a chunk of ``num_tokens`` tokens.

        Raises:
            ValueError: no chunk has that many tokens.
        """
        for call in self.calls:
            if call.num_tokens == num_tokens:
                return call
        raise ValueError(f"'num_tokens' must be a chunk's token count {[c.num_tokens for c in self.calls]} "
                         f"(got {num_tokens})")

    def __str__(self) -> str:
        n, c = self.num_chunks, self.chunk_tokens
        last = self.num_tokens - (n - 1) * c
        tail = f", the last of {last} token{'s' if last != 1 else ''}" if last != c else ""
        return (f"{self.path}[{self.row_id}] served in {n} calls over token chunks of {c} token{'s' if c != 1 else ''}"
                f"{tail}: {self.why}")


#: What an AITER path launches for T tokens: one call, or the call in token chunks.
AiterLaunch = Union[AiterCall, AiterChunkedCall]


def plan_aiter_launch(plan: LaunchPlan, *, num_tokens: int, max_id_slots: Optional[int] = None) -> AiterLaunch:
    """What an AITER path launches for T tokens: one :class:`~.plan.AiterCall` (:func:`~.plan.plan_aiter`) when
    ``T * topk`` fits one call, else an :class:`AiterChunkedCall` of chunks of ``max_id_slots // topk`` tokens.
    Pure; no tensors, no AITER. Split counts left to AITER's heuristic stay unresolved
    (:func:`resolve_calls`).

    Args:
        plan: the :class:`~mla_sink.core.plan.LaunchPlan` of an AITER path.
        num_tokens: T (>= 1).
        max_id_slots: the most id slots one call takes (default :data:`~.plan.MAX_ID_SLOTS`; tests lower it).

    Returns:
        The :class:`~.plan.AiterCall`, or the :class:`AiterChunkedCall`.

    Raises:
        ValueError: what :func:`~.plan.plan_aiter` raises; a ``topk`` alone beyond ``max_id_slots`` (no chunk
            of one token fits: never at the default, as ``topk <= 2^30``).
    """
    limit = id_slot_limit(max_id_slots)
    topk = plan.spec.topk
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens * topk <= limit:
        return plan_aiter(plan, num_tokens=num_tokens, max_id_slots=limit)  # refuses a bad num_tokens
    chunk = limit // topk
    if chunk < 1:
        raise ValueError(f"'topk' = {topk} ids of one token exceed {limit}, the most id slots one AITER call "
                         f"indexes: no chunk of tokens fits (row {plan.row_id})")
    calls = [plan_aiter(plan, num_tokens=chunk, max_id_slots=limit)]
    if num_tokens % chunk:
        calls.append(plan_aiter(plan, num_tokens=num_tokens % chunk, max_id_slots=limit))
    return AiterChunkedCall(num_tokens=num_tokens, max_id_slots=limit, calls=tuple(calls))


def resolve_calls(launch: AiterLaunch, resolve: Callable[[AiterCall], AiterCall]) -> AiterLaunch:
    """``launch`` with ``resolve`` applied to its call, or to each chunk's (e.g. AITER's split heuristic for that
    chunk's token count: :func:`~.plan.with_meta_param`)."""
    if isinstance(launch, AiterChunkedCall):
        return attrs.evolve(launch, calls=tuple(resolve(c) for c in launch.calls))
    return resolve(launch)
