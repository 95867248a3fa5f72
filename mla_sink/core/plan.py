"""plan: (CallSpec, Platform, token count) -> :class:`LaunchPlan`, the whole plan of a call as one record.

One function, :func:`build_plan`, builds it: the rule table's path and row (:mod:`mla_sink.core.select`),
then that path's launch: for ``triton`` the tuning table's kernel, tile sizes and split count
(:func:`mla_sink.paths.triton.plan.plan_triton_launch`), for the ``aiter_*`` paths the exact
``mla_decode_fwd`` call (:func:`mla_sink.paths.aiter.plan.plan_aiter`). The record is pure data, cached
per ``(spec, platform, num_tokens, path)``; launchers only execute it, and ``mla-sink explain`` and
``mla-sink info`` print it.
"""

from __future__ import annotations

import functools
import numbers
import threading
from typing import Any, Mapping, Optional

import attrs

from mla_sink.dispatch import readonly
from mla_sink.core.records import COUNT_MAX, CallSpec, Platform


def _freeze(params: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"'params' must be a mapping of kernel parameters (got {params!r})")
    return readonly(params)


def _known_path(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    from mla_sink.core.select import KNOWN_PATHS  # select builds plans: imported here to avoid a cycle

    if value not in KNOWN_PATHS:
        raise ValueError(f"'path' must be one of {KNOWN_PATHS}, or None to let the table choose (got {value!r})")


def _record(kind: type):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, kind):
            what = "a str" if kind is str else f"a mla_sink.{kind.__name__}"
            raise ValueError(f"'{attribute.name}' must be {what} (got {value!r})")

    return check


def _tokens(inst: Any, attribute: Any, value: Any) -> None:
    """:attr:`LaunchPlan.num_tokens`: ``None`` or an int in ``[0, 2^31 - 1]`` (the CLI's ``--tokens`` bound too)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= COUNT_MAX):
        raise ValueError(f"'num_tokens' must be None or an int in [0, {COUNT_MAX}] (got {value!r})")


@attrs.frozen
class LaunchPlan:
    """The whole plan of one call: the path, the rule-table row that chose it, and that path's launch.

    Attributes:
        path: a path name of the rule table (``triton``, ``reference``, ``aiter_lse``, ...).
        params: read-only parameters of the winning row (path defaults merged); part of equality,
            not of the hash (a mapping is not hashable).
        spec: the call description.
        platform: where it runs.
        row_id: id of the rule-table row that chose the path (or ``'forced'``).
        num_tokens: T, the query tokens the launch is planned for; ``None`` for the token-free plan
            that :func:`mla_sink.api.prepare` returns (path and row only).
        launch: what the path's launcher executes for ``num_tokens`` tokens: a
            :class:`mla_sink.paths.triton.plan.TritonLaunch` (kernel, tiles, splits, fallback reason),
            an :class:`mla_sink.paths.aiter.plan.AiterCall` (or, for more id slots than one AITER call indexes,
            an :class:`mla_sink.paths.aiter.chunks.AiterChunkedCall`), or ``None`` (the reference, or a
            token-free plan).

    Raises:
        ValueError: an unknown path, params that are not a mapping, spec/platform not the records,
            a negative token count.
    """

    path: str = attrs.field(validator=_known_path)
    params: Mapping[str, Any] = attrs.field(converter=_freeze, hash=False)
    spec: CallSpec = attrs.field(validator=_record(CallSpec))
    platform: Platform = attrs.field(validator=_record(Platform))
    row_id: str = attrs.field(default="forced", validator=_record(str))
    num_tokens: Optional[int] = attrs.field(default=None, validator=_tokens)
    launch: Any = attrs.field(default=None, eq=False, hash=False)


# Kernels that failed to compile on this machine (kernel name -> error text). Filled by the Triton
# launcher, read while planning, so a plan says which kernel really runs and why.
_FAILED_KERNELS: dict[str, str] = {}
_LOCK = threading.Lock()
#: Bumped by :func:`mark_kernel_failed` and part of the plan cache's key: a plan being built while a kernel is
#: marked failed is stored under the old generation, which no later call asks for (clearing the cache alone left
#: such a plan in it, naming the failed kernel for the rest of the process: a break test, forty-third session).
_GENERATION = [0]


def failed_kernels() -> Mapping[str, str]:
    """Kernels that failed to compile here this process (name -> error text), as the planner sees them."""
    return readonly(_FAILED_KERNELS)


def mark_kernel_failed(kernel: str, reason: str) -> None:
    """Record that ``kernel`` failed to compile here (``reason``: the compiler's error) and drop every
    cached plan, so later plans name the kernel that really runs and carry the reason."""
    with _LOCK:
        _FAILED_KERNELS[kernel] = reason
        _GENERATION[0] += 1
        _build_plan_cached.cache_clear()
    from mla_sink import api

    api.forget_prepared_calls()


def build_plan(spec: CallSpec, platform: Platform, *, num_tokens: Optional[int] = None,
               path: Optional[str] = None, aiter_impl: Any = None) -> LaunchPlan:
    """The whole plan of a call with ``num_tokens`` query tokens (cached; pure apart from the cache).

    Args:
        spec: the call description. platform: where it runs (``num_sms`` decides the Triton split count).
        num_tokens: T; ``None`` plans the path only (``launch`` stays ``None``).
        path: force a path (``reference`` is always honoured; another must be named by a row that
            accepts the call).
        aiter_impl: AITER's entry points for the one planning input AITER computes itself (its split
            heuristic, needed by ``aiter_lse_fp8_two_split``); default: the real AITER when importable.

    Returns:
        The :class:`LaunchPlan`.

    Raises:
        ValueError: ``path`` is not a path name, or ``num_tokens`` not an int in ``[0, 2^31 - 1]``.
        NoKernelError: the rule table refuses the call or no row accepts it.
    """
    if path is not None and not isinstance(path, str):
        raise ValueError(f"'path' must be a path name (str) or None (got {path!r})")
    if isinstance(num_tokens, numbers.Integral) and not isinstance(num_tokens, bool):
        num_tokens = int(num_tokens)  # a numpy int, as the records take them
    _tokens(None, None, num_tokens)  # LaunchPlan's own check, before anything is planned or cached
    if aiter_impl is not None:
        return _build_plan(spec, platform, num_tokens, path, aiter_impl)
    return _build_plan_cached(spec, platform, num_tokens, path, _GENERATION[0])


@functools.lru_cache(maxsize=4096)
def _build_plan_cached(spec: CallSpec, platform: Platform, num_tokens: Optional[int],
                       path: Optional[str], generation: int) -> LaunchPlan:
    """:func:`_build_plan`, cached per call and :data:`_GENERATION` (the failed kernels it saw)."""
    return _build_plan(spec, platform, num_tokens, path, None)


def _build_plan(spec, platform, num_tokens, path, aiter_impl) -> LaunchPlan:
    from mla_sink.core.select import plan_call

    base = plan_call(spec, platform, path=path)
    if num_tokens is None or base.path == "reference":
        return attrs.evolve(base, num_tokens=num_tokens)
    if base.path == "triton":
        from mla_sink.paths.triton.plan import plan_triton_launch

        launch = plan_triton_launch(
            arch=platform.arch, q_dtype=spec.q_dtype, kv_dtype=spec.kv_dtype, num_heads=spec.num_heads,
            num_tokens=num_tokens, topk=spec.topk, logit_cap=spec.logit_cap, gluon=platform.gluon,
            num_sms=platform.num_sms, failed=failed_kernels(), gather_aligned=spec.gather_aligned,
            unit_rows=spec.unit_rows,
        )
    else:
        launch = _plan_aiter_call(base, num_tokens, aiter_impl) if num_tokens > 0 else None
    return attrs.evolve(base, num_tokens=num_tokens, launch=launch)


def _plan_aiter_call(base: LaunchPlan, num_tokens: int, aiter_impl: Any):
    """The AITER call (or, beyond AITER's int32 id offsets, the call in token chunks:
    :func:`mla_sink.paths.aiter.chunks.plan_aiter_launch`); where the path needs AITER's own split heuristic, it is
    asked, for each call's token count, when AITER is here (elsewhere the call stays unresolved: explain prints
    it, and the launcher resolves or refuses it)."""
    from mla_sink.core.dtypes import TORCH_DTYPES
    from mla_sink.paths.aiter.chunks import plan_aiter_launch, resolve_calls
    from mla_sink.paths.aiter.launch import aiter_meta_param, load_aiter_impl
    from mla_sink.paths.aiter.plan import with_meta_param

    launch = plan_aiter_launch(base, num_tokens=num_tokens)
    if not launch.needs_meta_param:
        return launch
    impl = aiter_impl
    if impl is None:
        try:
            impl = load_aiter_impl()
        except RuntimeError:  # not on a ROCm machine
            return launch

    def resolved(call):
        meta_param = aiter_meta_param(impl, num_tokens=call.num_tokens, topk=call.topk,
                                      padded_heads=call.padded_heads, q_dtype=TORCH_DTYPES[call.q_dtype])
        return with_meta_param(call, meta_param)

    return resolve_calls(launch, resolved)
