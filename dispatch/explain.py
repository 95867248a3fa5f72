"""Human and JSON explanations of a ``Selection``, rejections grouped by path."""

from __future__ import annotations

from typing import Sequence

from typing import Any

import attrs

from .conditions import statements
from .schema import format_value
from .table import Selection


def _json(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def default_key(selection: Selection) -> str:
    """Return ``field=value, ...`` over the selection's values.

    Args:
        selection: A ``Selection``.

    Returns:
        The header text used when ``explain`` gets no key.
    """
    return ", ".join(f"{k}={format_value(v)}" for k, v in selection.values.items())


def _is_skip(fails: tuple) -> bool:
    return len(fails) == 1 and fails[0].op == "requested"


def rejection_groups(selection: Selection) -> list[tuple]:
    """Group the rejected rows of a selection, in the order their first row appears.

    Args:
        selection: The result of ``RuleTable.select``.

    Returns:
        A list of tuples, one per group:

        * ``("path", path, row_ids, failures)``: every rejected row naming a
          path whose ``requires`` failed; ``failures`` are those requirements
          (the rows' own conditions are not listed: the path rules them out);
        * ``("skipped", path, row_ids, failure)``: rows of ``path`` skipped
          because it is not a path ``only_paths`` asked for;
        * ``("row", row_id, path_or_None, failures)``: any other rejected row
          (refusal rows included) with its own failures.
    """
    groups: list[tuple] = []
    by_path: dict = {}
    skipped: dict = {}
    for row, fails in selection.rejected:
        if _is_skip(fails) and row.path is not None:
            if row.path not in skipped:
                skipped[row.path] = []
                groups.append(("skipped", row.path, skipped[row.path], fails[0]))
            skipped[row.path].append(row.id)
        elif row.path is not None and row.path in selection.path_failures:
            if row.path not in by_path:
                by_path[row.path] = []
                groups.append(("path", row.path, by_path[row.path], selection.path_failures[row.path]))
            by_path[row.path].append(row.id)
        else:
            groups.append(("row", row.id, row.path, fails))
    return [(kind, a, tuple(b) if isinstance(b, list) else b, c) for kind, a, b, c in groups]


class ReasonsOnce:
    """Drops a ``because`` already given for the same condition, so that each reason is written once.

    Call it on each tuple of ``Failure`` records in the order they are printed; it returns them with
    ``because=None`` where the same condition's reason was returned before.
    """

    def __init__(self) -> None:
        self.seen: set = set()

    def __call__(self, fails: tuple) -> tuple:
        out = []
        for f in fails:
            key = (f.field, f.op, repr(f.expected), f.because)
            if f.because and key in self.seen:
                f = attrs.evolve(f, because=None)
            elif f.because:
                self.seen.add(key)
            out.append(f)
        return tuple(out)


def _rows(ids: tuple) -> str:
    return f"{'row' if len(ids) == 1 else 'rows'} {', '.join(ids)}"


def explain(selection: Selection, *, key: str | None = None, details: Sequence[str] = ()) -> str:
    """Render a selection as text: the winner (or refusal), then the rejections, each mismatch once.

    After the winner, one line per rejection group (see ``rejection_groups``), in
    table order: paths whose ``requires`` fail for the call with the same
    statements share one line naming each path and the rows it covers; every
    other rejected row gets a line with its own failures, one statement per field
    (``conditions.statements``). Every rejection line starts with ``✗``.

    Example::

        bf16-h128-sm90-nosinks-dcp1
          → triton   (row triton_portable)
            why: Our Triton kernels serve every call AITER does not ...
            source: mla_sink/paths/triton/ (kernels: mla_sink/kernels/triton/portable.py, mla_sink/kernels/gluon/)
          ✗ paths aiter_persistent (rows aiter_persistent_bf16, ...), aiter_lse (rows ...):
            arch=sm90, needs one of [gfx942, gfx950] (...); aiter_version=None, needs a value and >= 0.1.19 (...)
          ✗ fp8_needs_sm89: cuda_arch=90, needs < 89 (...); kv_dtype=bf16, needs one of [fp8_e4m3, ...]

    Args:
        selection: The result of ``RuleTable.select``.
        key: Header line, e.g. a call's canonical key; defaults to
            ``field=value, ...``.
        details: Lines the application adds about the chosen result (printed after its why and
            source, before the rejected rows), e.g. how the chosen path will be launched.

    Returns:
        Multi-line text (no trailing newline).
    """
    lines = [key if key is not None else default_key(selection)]
    row = selection.row
    if row is None:
        lines.append("  ✗ no row matched")
    elif selection.refused:
        lines.append(f"  ✗ refused: {selection.reason} (row {row.id})")
    else:
        params = f"  {format_value(dict(selection.params))}" if selection.params else ""
        lines.append(f"  → {selection.path}{params}   (row {row.id})")
    if row is not None:
        lines.append(f"    why: {row.why}")
        lines.append(f"    source: {row.source}")
    lines.extend(details)
    groups = rejection_groups(selection)
    merged: dict = {}  # statements of failed path requirements -> index into out
    out: list = []
    reasons = ReasonsOnce()
    for kind, name, ids, fails in groups:
        if kind == "path":
            said = statements(fails)
            if said in merged:
                out[merged[said]][0].append((name, ids))
                continue
            merged[said] = len(out)
            out.append(([(name, ids)], "; ".join(statements(reasons(fails)))))
        elif kind == "skipped":
            wanted = ", ".join(map(str, fails.expected)) if fails.expected else "?"
            out.append(f"  ✗ path {name} ({_rows(ids)}): not the requested path {wanted}")
        else:
            out.append(f"  ✗ {name}: " + "; ".join(statements(reasons(fails))))
    for item in out:
        if isinstance(item, tuple):
            paths, said = item
            named = ", ".join(f"{p} ({_rows(ids)})" for p, ids in paths)
            item = f"  ✗ {'path' if len(paths) == 1 else 'paths'} {named}: {said}"
        lines.append(item)
    return "\n".join(lines)


def _failure_dict(f: Any) -> dict:
    return {
        "field": f.field,
        "op": f.op,
        "actual": _json(f.actual),
        "expected": _json(f.expected),
        "because": f.because,
        "text": str(f),
    }


def selection_to_dict(selection: Selection) -> dict:
    """Return the selection as plain JSON types, rejections grouped by path.

    Args:
        selection: The result of ``RuleTable.select``.

    Returns:
        ``{"table", "values", "path", "params", "refused", "reason", "row",
        "rejected_paths", "rejected"}``. ``params`` are the merged parameters
        (path defaults overridden by the row's own); ``row`` is ``{"id",
        "path", "refuse", "paths", "params", "why", "source", "line"}`` (``params``: the
        row's own) or ``None``. Each ``rejected_paths`` item is ``{"path",
        "rows", "failures", "text"}``: a path whose ``requires`` failed, the ids
        of the rejected rows naming it, and those failures (stated once in
        ``text``). Each ``rejected`` item is ``{"row", "path", "failures",
        "text"}`` for every other rejected row (its own failures, refusal rows and
        ``only_paths`` skips included). A failure is ``{"field", "op",
        "actual", "expected", "because", "text"}``.
    """
    row = selection.row
    rejected_paths, rejected = [], []
    by_row = {r.id: (r, fails) for r, fails in selection.rejected}
    for kind, name, ids, fails in rejection_groups(selection):
        if kind == "path":
            rejected_paths.append({
                "path": name,
                "rows": list(ids),
                "failures": [_failure_dict(f) for f in fails],
                "text": "; ".join(statements(fails)),
            })
            continue
        for row_id in ids if kind == "skipped" else (name,):
            r, row_fails = by_row[row_id]
            rejected.append({
                "row": r.id,
                "path": r.path,
                "failures": [_failure_dict(f) for f in row_fails],
                "text": "; ".join(statements(row_fails)),
            })
    return {
        "table": selection.table,
        "values": _json(selection.values),
        "path": selection.path,
        "params": _json(selection.params),
        "refused": selection.refused,
        "reason": selection.reason,
        "row": None
        if row is None
        else {
            "id": row.id,
            "path": row.path,
            "refuse": row.refuse,
            "paths": list(row.paths),
            "params": _json(row.params),
            "why": row.why,
            "source": row.source,
            "line": row.line,
        },
        "rejected_paths": rejected_paths,
        "rejected": rejected,
    }
