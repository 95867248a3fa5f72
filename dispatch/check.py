"""The table checker: proves coverage, reachability and path requirements.

Over the product of the declared domains it reports: combinations no row
answers (``gap``); rows that never win (``shadowed`` by named earlier rows, or
``unsatisfiable``, their own conditions or their path's ``requires`` included);
rows naming undeclared paths (``undeclared_path``); a ``str`` value a row or a path
requirement compares with (``eq``, ``ne``, ``in``, ``not_in``) that is not in the field's
declared domain (``unknown_value``: a misspelt ``gfx95O`` in an ``in`` list of an open field
made its row silently miss that target); and, as warnings, declared
paths no row names (``unused_path``), row conditions their path's ``requires``
already imply (``redundant_condition``) and row params equal to their path's
default (``redundant_param``). A row matches where its ``when`` and its path's
``requires`` both hold: the requirements are declared once on the path, not
repeated in rows.
"""

from __future__ import annotations

import math

import attrs

from .errors import TableCheckError
from .grid import Grid
from .schema import format_value
from .table import Row, RuleTable

WARNING_KINDS = frozenset({"unused_path", "redundant_condition", "redundant_param"})


@attrs.frozen
class Problem:
    """One finding of ``check_table``.

    Attributes:
        kind: ``gap``, ``shadowed``, ``unsatisfiable``, ``undeclared_path``,
            ``unknown_value``, or one of the warnings ``unused_path``, ``redundant_condition``,
            ``redundant_param``.
        row_id: The row concerned, or ``None`` (gaps, unused paths).
        message: Human text, with an example combination where one exists.
    """

    kind: str
    row_id: str | None
    message: str

    @property
    def level(self) -> str:
        """``"warning"`` for the kinds in ``WARNING_KINDS``, else ``"error"``."""
        return "warning" if self.kind in WARNING_KINDS else "error"

    def __str__(self) -> str:
        return f"[{self.level}: {self.kind}] {self.message}"


def _combo(values: dict) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items())


def _where(table: RuleTable, row: Row) -> str:
    return f"{table.source_file or table.name}:{row.line}: row {row.id!r}"


#: The operators whose arguments are values of the field (compared for equality).
_VALUE_OPS = ("eq", "ne", "in", "not_in")


def _unknown_values(table: RuleTable) -> list[Problem]:
    """Values of ``str`` fields that conditions compare with but the field's domain does not declare: the domain
    is the table's vocabulary of that field, so such a value is a misspelling (an open field's runtime values may
    lie outside it; the table's own may not)."""
    problems = []
    owners = [(row, f"{_where(table, row)}", row.when) for row in table.rows]
    owners += [(None, f"{table.source_file or table.name}:{spec.line}: path {name!r}", spec.requires)
               for name, spec in table.paths.items()]
    for row, where, conditions in owners:
        for cond in conditions:
            field = table.fields.get(cond.field)
            if field is None or field.type != "str" or not field.domain or cond.op not in _VALUE_OPS:
                continue
            values = cond.arg if cond.op in ("in", "not_in") else (cond.arg,)
            unknown = [v for v in values if v not in field.domain]
            if unknown:
                allowed = ", ".join(format_value(v) for v in field.domain)
                problems.append(Problem(
                    "unknown_value", row.id if row is not None else None,
                    f"{where}: {cond.field} {cond.op} names {', '.join(format_value(v) for v in unknown)}, not in "
                    f"the field's declared domain [{allowed}] (a misspelling? declare it in the domain if it is "
                    f"a real value)"))
    return problems


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


def _redundancies(table: RuleTable, grid: Grid, row: Row, spec) -> list[Problem]:
    """Warnings for a row that repeats what its path already declares."""
    out = []
    required = grid.by_field(spec.requires)
    for name, conds in grid.by_field(row.when).items():
        if name in required:
            needed = grid.field_mask(name, required[name])
            if needed and needed & grid.field_mask(name, conds) == needed:
                out.append(Problem(
                    "redundant_condition", row.id,
                    f"{_where(table, row)}: its condition on {name} adds nothing: path {row.path!r} "
                    f"already requires it ({'; '.join(f'{c.op} {format_value(c.arg)}' for c in required[name])})",
                ))
    for key, value in row.params.items():
        if key in spec.params and spec.params[key] == value:
            out.append(Problem(
                "redundant_param", row.id,
                f"{_where(table, row)}: params {key}: {format_value(value)} repeats the default of path {row.path!r}",
            ))
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def boundary_values(table: RuleTable) -> dict:
    """The values an open int field takes on either side of every threshold its conditions name (rows' ``when``
    and paths' ``requires``; a float field's too, with the floats next to ``b`` in place of ``b -/+ 1``):
    ``b - 1``, ``b`` and ``b + 1`` for each bound ``b`` (each end of a ``range``, each
    member of ``in`` / ``not_in``, the argument of ``multiple_of``: a multiple and the values beside it) and, for a
    field with ``multiple_of`` conditions, every residue modulo their least common multiple ``L`` after each of
    those values and each declared one (``t .. t + L - 1``), none below the smallest declared value (a domain
    starts at its field's least legal value, e.g. 0 for a count); and an undeclared value of each open ``str`` field
    and the versions at and beside each version a condition names (:func:`_unlisted_values`). Enumerated
    beside the declared domain, they make the checker see a gap or a shadow that falls between the domain's values
    (e.g. ``ne: 16`` with 16 not declared).

    Args:
        table: The table.

    Returns:
        ``{field name: sorted values}`` for the open int, float and str fields and the version fields with
        conditions.
    """
    ints = {name for name, f in table.fields.items() if f.type == "int" and not f.closed}
    floats = {name for name, f in table.fields.items() if f.type == "float"}
    conds = [c for row in table.rows for c in row.when]
    conds += [c for spec in table.paths.values() for c in spec.requires]
    out: dict = _unlisted_values(table, conds)
    floor = {name: min((v for v in table.fields[name].domain if _number(v)), default=None) for name in ints | floats}
    moduli: dict = {}
    for c in conds:
        if c.field not in floor or c.op == "present":
            continue
        if c.op == "multiple_of":
            moduli.setdefault(c.field, set()).add(c.arg)
        for b in c.arg if isinstance(c.arg, (tuple, list)) else (c.arg,):
            if c.field in ints and isinstance(b, int) and not isinstance(b, bool):
                near = (b - 1, b, b + 1)
            elif c.field in floats and _number(b) and math.isfinite(b):  # (``ne: 5.0`` left 5.0 unanswered)
                near = (math.nextafter(b, -math.inf), float(b), math.nextafter(b, math.inf))
            else:
                continue
            low = floor[c.field]
            out.setdefault(c.field, set()).update(v for v in near if low is None or v >= low)
    for name, ms in moduli.items():  # every residue after every threshold: a gap or a match of one residue class
        # between two thresholds (odd values between le 21 and ge 25 beside multiple_of 2) is then seen
        period, low = math.lcm(*ms), floor[name]
        starts = out[name] | {v for v in table.fields[name].domain if isinstance(v, int) and not isinstance(v, bool)}
        out[name].update(v for t in starts for v in range(t, t + period) if low is None or v >= low)
    return {name: tuple(sorted(vals, key=_sort_key(table.fields[name].type))) for name, vals in out.items()}


def _sort_key(ftype: str):
    """How :func:`boundary_values` orders a field's values: versions by PEP 440, others as they compare."""
    if ftype == "version":
        from packaging.version import Version

        return Version
    return None


#: A value of an open ``str`` field that no table declares: :func:`boundary_values` enumerates it beside the declared
#: ones, as a call may bring a value the table does not list (an arch the rows never name).
UNLISTED = "<unlisted>"


def _unlisted_values(table: RuleTable, conds: list) -> dict:
    """Beside the declared domains, for :func:`boundary_values`: :data:`UNLISTED` for each open ``str`` field that a
    condition names, and for each ``version`` field each version a condition names with the versions just below and
    just above it (``v.dev0`` and ``v.post1`` in PEP 440's order: before ``v`` and after it, before any later
    release: :func:`_versions_beside`), so that a gap at an undeclared arch or between two releases is found (a
    break test, fifty-third session: rows limited to the declared archs, or split at ``below: 0.1.16`` /
    ``at_least: 0.1.17``, passed ``mla-sink tables`` and then failed the lookup of ``--arch sm86`` or of AITER
    0.1.16)."""
    out: dict = {}
    for c in conds:
        f = table.fields.get(c.field)
        if f is None or c.op == "present":
            continue
        if f.type == "str" and not f.closed:
            out.setdefault(c.field, set()).add(UNLISTED)
        elif f.type == "version":
            for b in c.arg if isinstance(c.arg, (tuple, list)) else (c.arg,):
                if isinstance(b, str):
                    out.setdefault(c.field, set()).update((b, *_versions_beside(b)))
    return out


def _versions_beside(version: str) -> tuple:
    """A version just below ``version`` and one just above it in PEP 440's order (``v.dev0`` and ``v.post1`` where
    those parse and order so; else the base release's ``.dev0`` and the next post-release)."""
    from packaging.version import InvalidVersion, Version

    v = Version(version)
    below = (f"{version}.dev0", f"{v.base_version}.dev0")
    above = (f"{version}.post1", f"{v.base_version}.post{(v.post or 0) + 1}")

    def first(candidates, ok):
        for text in candidates:
            try:
                if ok(Version(text)):
                    return (text,)
            except InvalidVersion:
                continue
        return ()

    return first(below, lambda w: w < v) + first(above, lambda w: w > v)


def check_table(table: RuleTable, *, thresholds: bool = False) -> list[Problem]:
    """Check a table over the full product of its declared field domains.

    Args:
        table: The table (loaded or built in code).
        thresholds: Also enumerate each open int field's values on either side of its conditions' thresholds, an
            undeclared value of each open str field and the versions beside each version threshold
            (:func:`boundary_values`), for a table whose rows must answer every value of such a field, not only
            the declared ones (a gap at a value the domain skips is then found).

    Returns:
        Every problem found, errors and warnings, in row order; empty when clean.

    Raises:
        ValueError: A field has no domain to enumerate.
    """
    grid = Grid(table.fields, boundary_values(table) if thresholds else None)
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
                problems.extend(_redundancies(table, grid, row, spec))
        when = grid.mask(row.when)
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
    problems.extend(_unknown_values(table))
    named = {row.path for row in table.rows}
    for name in table.paths:
        if name not in named:
            problems.append(Problem("unused_path", None, f"path {name!r} is declared but no row names it"))
    return problems


def assert_table_ok(table: RuleTable, *, strict: bool = False, thresholds: bool = False) -> None:
    """Raise if ``check_table`` finds an error (or, when ``strict``, any problem).

    Args:
        table: The table to check.
        strict: Also fail on warnings (``unused_path``).
        thresholds: Also check the values beside each threshold, an undeclared value of each open str field and
            the versions beside each version threshold (``check_table(thresholds=True)``), not only the declared
            values; the message says so.

    Raises:
        TableCheckError: Listing every problem found (warnings included).
    """
    problems = check_table(table, thresholds=thresholds)
    failing = [p for p in problems if strict or p.level == "error"]
    if failing:
        lines = "\n".join(f"  {p}" for p in problems)
        others = len(problems) - len(failing)  # the warnings listed beside the errors, counted apart (a break test)
        also = f" (and {others} warning(s), listed too)" if others else ""
        where = " at values beside its thresholds" if thresholds else ""
        raise TableCheckError(f"table {table.name!r}: {len(failing)} problem(s){where}{also}:\n{lines}",
                              tuple(problems))
