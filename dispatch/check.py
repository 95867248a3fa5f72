"""The table checker: proves coverage, reachability and path requirements.

Over the product of the declared domains it reports: combinations no row
answers (``gap``); rows that never win (``shadowed`` by named earlier rows, or
``unsatisfiable``); rows that match combinations their path's ``requires``
forbid (``requires``); rows naming undeclared paths (``undeclared_path``); and,
as a warning, declared paths no row names (``unused_path``).
"""

from __future__ import annotations

import attrs

from .conditions import failures
from .errors import TableCheckError
from .grid import Grid
from .schema import format_value
from .table import Row, RuleTable

WARNING_KINDS = frozenset({"unused_path"})


@attrs.frozen
class Problem:
    """One finding of ``check_table``.

    Attributes:
        kind: ``gap``, ``shadowed``, ``unsatisfiable``, ``requires``,
            ``undeclared_path`` or ``unused_path`` (a warning).
        row_id: The row concerned, or ``None`` (gaps, unused paths).
        message: Human text, with an example combination where one exists.
    """

    kind: str
    row_id: str | None
    message: str

    @property
    def level(self) -> str:
        """``"warning"`` for ``unused_path``, else ``"error"``."""
        return "warning" if self.kind in WARNING_KINDS else "error"

    def __str__(self) -> str:
        return f"[{self.level}: {self.kind}] {self.message}"


def _combo(values: dict) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items())


def _where(table: RuleTable, row: Row) -> str:
    return f"{table.source_file or table.name}:{row.line}: row {row.id!r}"


def _unsatisfiable(table: RuleTable, grid: Grid, row: Row, when: int) -> Problem:
    if not when:
        empty = [
            name for name, conds in grid.by_field(row.when).items() if not grid.field_mask(name, conds)
        ]
        detail = (
            f"no declared value of {', '.join(empty)} satisfies its conditions"
            if empty
            else "its conditions never hold together"
        )
    else:
        detail = f"path {row.path!r} requires conditions that never hold together with the row's"
    return Problem("unsatisfiable", row.id, f"{_where(table, row)}: can never match: {detail}")


def check_table(table: RuleTable) -> list[Problem]:
    """Check a table over the full product of its declared field domains.

    Args:
        table: The table (loaded or built in code).

    Returns:
        Every problem found, errors and warnings, in row order; empty when clean.

    Raises:
        ValueError: A field has no domain to enumerate.
    """
    grid = Grid(table.fields)
    problems: list[Problem] = []
    remaining = grid.all
    taken: list[tuple[str, int]] = []
    for row in table.rows:
        req = grid.all
        if row.path is not None:
            spec = table.paths.get(row.path)
            if spec is None:
                problems.append(
                    Problem("undeclared_path", row.id, f"{_where(table, row)}: names undeclared path {row.path!r}")
                )
            else:
                req = grid.mask(spec.requires)
        when = grid.mask(row.when)
        bad = when & remaining & ~req
        if bad:
            example = grid.example(bad)
            why = "; ".join(str(f) for f in failures(table.paths[row.path].requires, example))
            problems.append(
                Problem(
                    "requires",
                    row.id,
                    f"{_where(table, row)}: matches {bad.bit_count()} combination(s) that path "
                    f"{row.path!r} does not allow, e.g. {_combo(example)} ({why}); "
                    "add the requirement to the row's when",
                )
            )
        match = when & req
        if not match & remaining:
            if not match:
                problems.append(_unsatisfiable(table, grid, row, when))
            else:
                covering = [rid for rid, m in taken if m & match]
                problems.append(
                    Problem(
                        "shadowed",
                        row.id,
                        f"{_where(table, row)}: is shadowed: every combination it matches is taken "
                        f"by earlier row(s) {', '.join(covering)}",
                    )
                )
        taken.append((row.id, match & remaining))
        remaining &= ~match
    if remaining:
        problems.append(
            Problem(
                "gap",
                None,
                f"{table.source_file or table.name}: {remaining.bit_count()} of {grid.size} "
                f"combination(s) match no row, e.g. {_combo(grid.example(remaining))}",
            )
        )
    named = {row.path for row in table.rows}
    for name in table.paths:
        if name not in named:
            problems.append(Problem("unused_path", None, f"path {name!r} is declared but no row names it"))
    return problems


def assert_table_ok(table: RuleTable, *, strict: bool = False) -> None:
    """Raise if ``check_table`` finds an error (or, when ``strict``, any problem).

    Args:
        table: The table to check.
        strict: Also fail on warnings (``unused_path``).

    Raises:
        TableCheckError: Listing every problem found (warnings included).
    """
    problems = check_table(table)
    failing = [p for p in problems if strict or p.level == "error"]
    if failing:
        lines = "\n".join(f"  {p}" for p in problems)
        raise TableCheckError(f"table {table.name!r}: {len(failing)} problem(s):\n{lines}", tuple(problems))
