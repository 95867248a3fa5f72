"""Conditions on one field, their evaluation and their failure records.

Operators: ``eq``, ``ne``, ``in``, ``not_in``, ``lt``, ``le``, ``gt``, ``ge``,
``range`` (``[lo, hi]``, inclusive), ``at_least`` / ``below`` (versions, compared
with ``packaging.version``; ``None`` fails), ``multiple_of`` (int fields: the value
is an integer multiple of the argument, a positive int; ``None`` fails) and ``present``
(``true``: the value is not ``None``; ``false``: it is ``None``). Ordering operators fail on ``None``.
"""

from __future__ import annotations

from typing import Any

import attrs
from packaging.version import Version

from .schema import format_value

OPERATORS = ("eq", "ne", "in", "not_in", "lt", "le", "gt", "ge", "range", "at_least", "below", "multiple_of",
             "present")
ORDER_OPS = ("lt", "le", "gt", "ge", "range")
VERSION_OPS = ("at_least", "below")


def _key(ftype: str, value: Any) -> Any:
    """Comparable form of a non-null value: ``Version`` for version fields."""
    if ftype == "version" and not isinstance(value, Version):
        return Version(value)
    return value


@attrs.frozen
class Failure:
    """One failed condition, with the actual and the needed value.

    Attributes:
        field: The field name (``"path"`` for a row skipped by ``only_paths``).
        op: The operator (``"requested"`` for a row skipped by ``only_paths``).
        actual: The value the call had.
        expected: The operator's argument.
        because: Optional explanation written in the table.
    """

    field: str
    op: str
    actual: Any
    expected: Any
    because: str | None = None

    def needs(self) -> str:
        """Return what the condition needs, e.g. ``one of [16, 32]`` or ``>= 0.1.19``.

        Returns:
            The text after ``needs``.
        """
        e = self.expected
        if self.op == "eq":
            return format_value(e)
        if self.op == "ne":
            return f"not {format_value(e)}"
        if self.op == "in":
            return f"one of {format_value(e)}"
        if self.op == "not_in":
            return f"none of {format_value(e)}"
        if self.op == "range":
            return f"between {format_value(e[0])} and {format_value(e[1])}"
        if self.op == "present":
            return "a value" if e else "no value"
        if self.op == "multiple_of":
            return f"a multiple of {format_value(e)}"
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "at_least": ">=", "below": "<"}
        return f"{symbol.get(self.op, self.op)} {format_value(e)}"

    def __str__(self) -> str:
        if self.op == "requested":
            what = "a refusal row" if self.actual is None else f"its path {self.actual}"
            wanted = ", ".join(map(str, self.expected)) if self.expected else "?"
            return f"{what} is not the requested path {wanted}"
        text = f"{self.field}={format_value(self.actual)}, needs {self.needs()}"
        return f"{text} ({self.because})" if self.because else text


@attrs.frozen
class Condition:
    """One operator applied to one field.

    Attributes:
        field: The field name.
        op: One of ``OPERATORS``.
        arg: The normalized argument (a tuple for ``in``/``not_in``/``range``).
        type: The field type, which decides how values compare.
        because: Optional explanation appended to failures.
    """

    field: str
    op: str
    arg: Any
    type: str
    because: str | None = None

    def holds(self, value: Any) -> bool:
        """Evaluate the condition.

        Args:
            value: The field's value (``None`` allowed).

        Returns:
            Whether the condition holds.
        """
        op, arg = self.op, self.arg
        if op == "present":
            return (value is not None) == bool(arg)
        if op in ("eq", "ne", "in", "not_in"):
            k = None if value is None else _key(self.type, value)
            if op in ("eq", "ne"):
                same = k == (None if arg is None else _key(self.type, arg))
                return same if op == "eq" else not same
            member = any(k == (None if a is None else _key(self.type, a)) for a in arg)
            return member if op == "in" else not member
        if value is None:
            return False
        if op == "multiple_of":
            return value % arg == 0
        k = _key(self.type, value)
        if op == "range":
            return _key(self.type, arg[0]) <= k <= _key(self.type, arg[1])
        a = _key(self.type, arg)
        if op in ("lt", "below"):
            return k < a
        if op == "le":
            return k <= a
        if op == "gt":
            return k > a
        return k >= a  # ge, at_least

    def failure(self, value: Any) -> Failure | None:
        """Evaluate the condition and describe a failure.

        Args:
            value: The field's value.

        Returns:
            ``None`` when the condition holds, else a ``Failure``.
        """
        if self.holds(value):
            return None
        actual = str(value) if self.type == "version" and value is not None else value
        return Failure(self.field, self.op, actual, self.arg, self.because)


def statements(fails: tuple) -> tuple:
    """State a list of failures once per field: one text per field, in first-seen order.

    Identical failures are stated once; several failures of one field become one
    statement, e.g. ``aiter_version=None, needs a value and >= 0.1.19 (AITER absent
    or too old)`` (a shared ``because`` is written once, different ones after each
    need). Failures of a row skipped by ``only_paths`` keep their own text.

    Args:
        fails: ``Failure`` records.

    Returns:
        A tuple of strings.
    """
    groups: dict = {}
    for fail in fails:
        key = ("requested", id(fail)) if fail.op == "requested" else fail.field
        group = groups.setdefault(key, [])
        if fail not in group:
            group.append(fail)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(str(group[0]))
            continue
        head = f"{group[0].field}={format_value(group[0].actual)}, needs "
        reasons = {f.because for f in group}
        if len(reasons) == 1:
            (because,) = reasons
            text = head + " and ".join(f.needs() for f in group)
            out.append(f"{text} ({because})" if because else text)
        else:
            out.append(head + " and ".join(f"{f.needs()} ({f.because})" if f.because else f.needs() for f in group))
    return tuple(out)


def failures(conditions: tuple, values: Any) -> tuple:
    """Evaluate every condition and collect all failures.

    Args:
        conditions: ``Condition`` records.
        values: Mapping from field name to value; must hold every tested field.

    Returns:
        A tuple of ``Failure``, in condition order (empty when all hold).
    """
    out = []
    for cond in conditions:
        fail = cond.failure(values[cond.field])
        if fail is not None:
            out.append(fail)
    return tuple(out)
