"""Errors raised by the rule-table engine."""

from __future__ import annotations


class TableError(ValueError):
    """A rule table is malformed.

    The message starts with ``<file>:<line>:`` and names the row id when the
    error is inside a row, e.g.
    ``mla_decode.yaml:42: row 'aiter_lse': unknown operator 'gte' (allowed: eq, ...)``.
    """


class TableCheckError(AssertionError):
    """The table checker found problems; the message lists every one of them.

    Attributes:
        problems: The ``Problem`` records found by ``check_table``.
    """

    def __init__(self, message: str, problems: tuple = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)
