"""Rule tables, rows, and first-match selection."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import attrs

from .conditions import Failure, failures
from .schema import format_value, readonly as _readonly


@attrs.frozen
class Row:
    """One ordered rule: if every condition holds, choose ``path`` or refuse.

    Attributes:
        id: Unique id (``[a-z0-9_]+``).
        when: ``Condition`` records, all of which must hold (empty = always).
        path: The chosen path, or ``None`` for a refusal row.
        refuse: The refusal text, or ``None`` for a path row.
        paths: For a refusal row, the paths whose kernels it refuses: a call that requests one of them
            (``RuleTable.select``'s ``only_paths``) meets the row too. Empty for a path row, and for a
            refusal row that binds only calls requesting no path.
        params: Read-only mapping of the row's own parameters; they override
            the defaults of its path (``PathSpec.params``).
        why: Why the rule exists.
        source: Where the fact comes from.
        line: Line of the row in the YAML file, or 0.
    """

    id: str
    when: tuple = ()
    path: str | None = None
    refuse: str | None = None
    paths: tuple = ()
    params: Mapping = attrs.field(factory=dict, converter=_readonly, hash=False)
    why: str = ""
    source: str = ""
    line: int = 0

    @property
    def is_refusal(self) -> bool:
        """Whether this row refuses instead of naming a path."""
        return self.refuse is not None


@attrs.frozen
class Selection:
    """The result of ``RuleTable.select``.

    Attributes:
        table: The table name.
        values: The declared fields' values used for the decision.
        row: The winning ``Row``, or ``None`` when no row matched.
        path: The chosen path, or ``None`` when refused.
        params: Read-only parameters of the winner: its path's default
            ``params`` overridden by the row's own (empty for a refusal).
        refused: True when the winner is a refusal row or no row matched.
        reason: The refusal text, ``"no row matched"``, or ``""``.
        rejected: ``(Row, tuple[Failure, ...])`` for every row before the winner
            (every row when none matched), each with all of its failures: the
            row's own ``when`` first, then its path's ``requires``.
        path_failures: Read-only mapping from the name of every path whose
            ``requires`` failed for these values (among the rejected rows' paths)
            to those failures; ``explain`` states them once per path instead of
            once per row.
    """

    table: str
    values: Mapping = attrs.field(converter=_readonly, hash=False)
    row: Row | None
    path: str | None
    params: Mapping = attrs.field(converter=_readonly, hash=False)
    refused: bool
    reason: str
    rejected: tuple = ()
    path_failures: Mapping = attrs.field(factory=dict, converter=_readonly, hash=False)


@attrs.frozen
class RuleTable:
    """An ordered rule table; build it with ``load_table``.

    Attributes:
        name: The table name.
        fields: Mapping from field name to ``Field``, in declaration order.
        paths: Mapping from path name to ``PathSpec``.
        rows: The ``Row`` records in priority order.
        source_file: The file it was loaded from (or a label such as ``<string>``).
        description: Free text.
    """

    name: str
    fields: Mapping = attrs.field(converter=_readonly, hash=False)
    paths: Mapping = attrs.field(converter=_readonly, hash=False)
    rows: tuple = ()
    source_file: str | None = None
    description: str = ""

    def row(self, row_id: str) -> Row:
        """Return the row with id ``row_id``.

        Args:
            row_id: A row id.

        Returns:
            The row.

        Raises:
            KeyError: No such row.
        """
        for row in self.rows:
            if row.id == row_id:
                return row
        raise KeyError(row_id)

    def check_values(self, values: Mapping[str, Any]) -> dict:
        """Validate call values against the declared fields.

        Args:
            values: Mapping from field name to value; extra keys are ignored.

        Returns:
            A dict with exactly the declared fields.

        Raises:
            ValueError: A declared field is missing, or a value has the wrong type.
        """
        out = {}
        for name, field in self.fields.items():
            if name not in values:
                raise ValueError(
                    f"table {self.name!r}: missing value for field {name!r} "
                    f"(fields: {', '.join(self.fields)})"
                )
            value = values[name]
            problem = field.check_value(value)
            if problem:
                raise ValueError(f"table {self.name!r}: field {name}={format_value(value)}: {problem}")
            out[name] = value
        return out

    def row_params(self, row: Row) -> dict:
        """Return the parameters a winning ``row`` passes on: its path's defaults, then its own.

        Args:
            row: A row of this table.

        Returns:
            A new dict (empty for a refusal row).
        """
        spec = self.paths.get(row.path) if row.path is not None else None
        return {**(spec.params if spec is not None else {}), **row.params}

    def select(
        self, values: Mapping[str, Any], *, only_paths: Collection[str] | None = None
    ) -> Selection:
        """Choose the first row whose conditions (and path requirements) all hold.

        Args:
            values: A value for every declared field; extra keys are ignored.
            only_paths: When given, rows naming other paths, and refusal rows that bind none of
                them (``Row.paths``), are skipped (reported as rejected with "its path X is not
                the requested path Y").

        Returns:
            A ``Selection``; ``refused`` is true for a refusal row or when no
            row matched, ``params`` merges the path's defaults with the row's own,
            ``rejected`` lists every earlier row with all its failures and
            ``path_failures`` the failed requirements of each path.

        Raises:
            ValueError: A declared field is missing or has a wrong-typed value.
        """
        vals = self.check_values(values)
        wanted = None if only_paths is None else frozenset(only_paths)
        rejected = []
        required: dict = {}  # path -> failures of its requires (each path evaluated once)
        for row in self.rows:
            if wanted is not None and (wanted.isdisjoint(row.paths) if row.is_refusal else row.path not in wanted):
                skip = Failure("path", "requested", row.path, tuple(sorted(wanted)), None)
                rejected.append((row, (skip,)))
                continue
            fails = failures(row.when, vals)
            if row.path is not None and row.path in self.paths:
                if row.path not in required:
                    required[row.path] = failures(self.paths[row.path].requires, vals)
                fails += required[row.path]
            if fails:
                rejected.append((row, fails))
                continue
            return Selection(
                table=self.name,
                values=vals,
                row=row,
                path=row.path,
                params=self.row_params(row),
                refused=row.is_refusal,
                reason=row.refuse or "",
                rejected=tuple(rejected),
                path_failures={p: f for p, f in required.items() if f},
            )
        return Selection(
            table=self.name,
            values=vals,
            row=None,
            path=None,
            params={},
            refused=True,
            reason="no row matched",
            rejected=tuple(rejected),
            path_failures={p: f for p, f in required.items() if f},
        )
