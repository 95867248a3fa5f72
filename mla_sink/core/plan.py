"""Selection + spec -> :class:`LaunchPlan`: what ``launch`` will run. Pure; testable without a GPU."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

import attrs

from mla_sink.core.records import CallSpec, Platform


def _freeze(params: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"'params' must be a mapping of kernel parameters (got {params!r})")
    return MappingProxyType(dict(params))


def _known_path(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    from mla_sink.core.select import KNOWN_PATHS  # select builds plans: imported here to avoid a cycle

    if value not in KNOWN_PATHS:
        raise ValueError(f"'path' must be one of {KNOWN_PATHS} (got {value!r})")


def _record(kind: type):
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, kind):
            what = "a str" if kind is str else f"a mla_sink.{kind.__name__}"
            raise ValueError(f"'{attribute.name}' must be {what} (got {value!r})")

    return check


@attrs.frozen
class LaunchPlan:
    """The chosen path of one call and its kernel parameters.

    Attributes:
        path: a path name of the rule table (``triton``, ``reference``, ``aiter_lse``, ...).
        params: read-only kernel parameters from the winning row (e.g. ``{'num_kv_splits': 1}``); part
            of equality, not of the hash (a mapping is not hashable).
        spec: the call description.
        platform: where it runs.
        row_id: id of the rule-table row that chose the path (or ``'forced'``).

    Raises:
        ValueError: an unknown path, params that are not a mapping, spec/platform not the records.
    """

    path: str = attrs.field(validator=_known_path)
    params: Mapping[str, Any] = attrs.field(converter=_freeze, hash=False)
    spec: CallSpec = attrs.field(validator=_record(CallSpec))
    platform: Platform = attrs.field(validator=_record(Platform))
    row_id: str = attrs.field(default="forced", validator=_record(str))
