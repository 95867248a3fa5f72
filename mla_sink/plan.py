"""Selection + spec -> :class:`LaunchPlan`: what ``launch`` will run. Pure; testable without a GPU."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

import attrs

from .records import CallSpec, Platform


def _freeze(params: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(params))


@attrs.frozen
class LaunchPlan:
    """The chosen path of one call and its kernel parameters.

    Attributes:
        path: a path name of the rule table (``triton``, ``reference``, ``aiter_lse``, ...).
        params: read-only kernel parameters from the winning row (e.g. ``{'num_kv_splits': 1}``).
        spec: the call description.
        platform: where it runs.
        row_id: id of the rule-table row that chose the path (or ``'forced'``).
    """

    path: str
    params: Mapping[str, Any] = attrs.field(converter=_freeze, eq=False, hash=False)
    spec: CallSpec
    platform: Platform
    row_id: str = "forced"
