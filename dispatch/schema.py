"""Field and path declarations of a rule table, and typed values.

A field has a type (``str``, ``int``, ``float``, ``bool`` or ``version``), may be
nullable, and declares the domain the checker enumerates. A path names a result a
row may choose; it may carry ``requires`` (conditions every row naming it must also
meet, declared once instead of in each row) and default ``params`` (which a row's
own ``params`` override).
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
from packaging.version import InvalidVersion, Version

FIELD_TYPES = ("str", "int", "float", "bool", "version")
NUMERIC_TYPES = ("int", "float", "version")


def type_error(ftype: str, value: Any) -> str | None:
    """Say why ``value`` is not a (non-null) value of field type ``ftype``.

    Args:
        ftype: One of ``FIELD_TYPES``.
        value: A candidate value (``None`` is handled by the caller).

    Returns:
        ``None`` when the value fits, else a short reason such as
        ``"expected a bool (true/false), got str 'yes'"``.
    """
    shown = repr(value) if isinstance(value, str) else format_value(value)
    got = f"got {type(value).__name__} {shown}"
    if ftype == "str":
        return None if isinstance(value, str) else f"expected a string, {got}"
    if ftype == "bool":
        return None if isinstance(value, bool) else f"expected a bool (true/false), {got}"
    if ftype == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"expected an int, {got}"
    if ftype == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and value != value:  # NaN equals nothing: a row or domain holding it could never match
            return f"expected a number other than NaN, {got}"
        return None if ok else f"expected a number, {got}"
    if ftype == "version":
        if isinstance(value, Version):
            return None
        if not isinstance(value, str):
            return f"expected a version written as a quoted string such as \"0.1.19\", {got}"
        try:
            Version(value)
        except InvalidVersion:
            return f"expected a PEP 440 version, {got}"
        return None
    return f"unknown field type {ftype!r}"


def normalize(ftype: str, value: Any) -> Any:
    """Return the canonical stored form of a value already accepted by ``type_error``.

    Args:
        ftype: The field type.
        value: The value, or ``None``.

    Returns:
        ``float(value)`` for float fields, ``str(value)`` for versions, else ``value``.
    """
    if value is None:
        return None
    if ftype == "float":
        return float(value)
    if ftype == "version":
        return str(value)
    return value


def format_value(value: Any) -> str:
    """Format a value the way explanations print it.

    Booleans print as ``true``/``false``, ``None`` as ``None``, strings bare,
    sequences as ``[a, b]`` and mappings as ``{k: v}``.

    Args:
        value: Any plain value.

    Returns:
        The text.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict) or hasattr(value, "items"):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


@attrs.frozen
class Field:
    """One input field that rows may test.

    Attributes:
        name: The field name (``[a-z_][a-z0-9_]*``).
        type: One of ``str``, ``int``, ``float``, ``bool``, ``version``.
        domain: The values the checker enumerates (normalized; ``None`` included
            when the field is nullable). For ``bool`` it defaults to ``(False, True)``.
        nullable: Whether ``None`` (YAML ``null``) is a legal value.
        description: Free text.
        closed: The domain is the complete set of legal values (``str`` and ``int`` fields only):
            a row condition or a selected value outside it is an error, not a row that never matches.
    """

    name: str
    type: str
    domain: tuple = ()
    nullable: bool = False
    description: str = ""
    closed: bool = False

    def check_value(self, value: Any) -> str | None:
        """Say why ``value`` is not a legal value of this field.

        Args:
            value: A candidate value.

        Returns:
            ``None`` when legal, else the reason.
        """
        if value is None:
            return None if self.nullable else "null given but the field is not nullable"
        problem = type_error(self.type, value)
        if problem is None and self.closed and self.domain and value not in self.domain:
            allowed = ", ".join(str(v) for v in self.domain if v is not None)
            return f"not in the closed domain [{allowed}]"
        return problem

    def grid(self) -> tuple:
        """Return the values the checker enumerates for this field.

        Returns:
            The declared domain; for a bool field without one, ``(False, True)``
            (plus ``None`` when nullable).
        """
        if self.domain:
            return self.domain
        if self.type == "bool":
            return (False, True, None) if self.nullable else (False, True)
        return ()


class FrozenDict(dict):
    """A read-only ``dict``: the params and fields of rows, selections and plans. Unlike ``types.MappingProxyType``
    (used until the thirty-second session) it pickles and deep-copies, so the records that hold it (a
    ``LaunchPlan``, a ``NoKernelError``'s selection, a layer) cross process boundaries and ``copy.deepcopy``. Lookups
    are ``dict``'s own; every mutating method raises ``TypeError`` (``dict``'s own methods called on it directly, as
    ``dict.__setitem__(d, k, v)``, are not stopped: it guards against mistakes, not against intent)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{type(self).__name__} is read-only")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __reduce_ex__(self, protocol: Any) -> tuple:  # rebuilt from a plain dict: no item assignment
        return type(self), (dict(self),)

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: dict) -> "FrozenDict":
        import copy

        return type(self)(copy.deepcopy(dict(self), memo))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


def readonly(mapping: Mapping | None) -> Mapping:
    """Return a read-only copy of ``mapping`` (``{}`` for ``None``): a :class:`FrozenDict`."""
    return FrozenDict(mapping or {})


@attrs.frozen
class PathSpec:
    """A result a row may choose.

    Attributes:
        name: The path name (``[a-z0-9_]+``).
        description: Free text.
        requires: Conditions (``Condition`` records) that every row naming this
            path must also meet: ``select`` evaluates them together with the
            row's own ``when`` (a row whose path requirements fail is rejected
            with those failures), and the checker treats them as part of each
            such row. Declared once here, they need not be repeated in rows.
        params: Read-only default parameters of every row naming this path; a
            row's own ``params`` override them key by key
            (``Selection.params`` is the merged mapping).
        source: Where the requirements and defaults come from (free text).
        line: Line of the declaration in the YAML file, or 0.
    """

    name: str
    description: str = ""
    requires: tuple = ()
    line: int = 0
    params: Mapping = attrs.field(factory=dict, converter=readonly, hash=False)
    source: str = ""
