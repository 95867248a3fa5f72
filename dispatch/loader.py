"""Strict loading of a YAML rule table into a ``RuleTable``.

Every error raises ``TableError`` with ``<file>:<line>:`` and, inside a row,
``row '<id>':``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from packaging.version import Version

from .conditions import OPERATORS, ORDER_OPS, VERSION_OPS, Condition
from .errors import TableError
from .schema import FIELD_TYPES, NUMERIC_TYPES, Field, PathSpec, format_value, normalize
from .table import Row, RuleTable
from .yaml_lines import LineDict, LineList, load_yaml

TOP_KEYS = ("table", "description", "fields", "paths", "rows")
FIELD_KEYS = ("type", "domain", "nullable", "description", "closed")
PATH_KEYS = ("description", "requires", "params", "source")
ROW_KEYS = ("id", "when", "path", "refuse", "paths", "params", "why", "source")
NAME_RE = re.compile(r"[a-z_][a-z0-9_]*\Z")
ID_RE = re.compile(r"[a-z0-9_]+\Z")


class _Ctx:
    """Where we are: file label and current row id, to prefix messages."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.where = ""

    def error(self, line: int, message: str) -> TableError:
        prefix = f"{self.label}:{line}: "
        return TableError(prefix + (f"{self.where}: " if self.where else "") + message)


def _shown(value: Any) -> str:
    """A value as an error message shows it, in the YAML's spelling: a string quoted (``'true'`` is not the bool
    true the message asks for), an empty or ``null`` value as ``null`` (as ``true`` / ``false`` are the YAML's),
    anything else as explanations print it."""
    value = _plain(value)
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else format_value(value)


def _allowed(keys: tuple) -> str:
    return ", ".join(keys)


def _require_map(ctx: _Ctx, value: Any, line: int, what: str) -> LineDict:
    if not isinstance(value, LineDict):
        raise ctx.error(getattr(value, "line", line), f"{what} must be a mapping, got {_shown(value)}")
    return value


def _check_keys(ctx: _Ctx, mapping: LineDict, allowed: tuple, what: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ctx.error(mapping.line_of(key), f"unknown {what} {key!r} (allowed: {_allowed(allowed)})")


def _text(ctx: _Ctx, mapping: LineDict, key: str, *, required: bool) -> str:
    value = mapping.get(key)
    if value is None:
        if required:
            raise ctx.error(mapping.line, f"missing {key!r} (a non-empty string)")
        return ""
    if not isinstance(value, str) or not value.strip():
        raise ctx.error(mapping.line_of(key), f"{key!r} must be a non-empty string, got {_shown(value)}")
    return value


def _parse_field(ctx: _Ctx, name: Any, spec: Any, line: int) -> Field:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ctx.error(line, f"field name {name!r} must match [a-z_][a-z0-9_]*")
    ctx.where = f"field {name!r}"
    spec = _require_map(ctx, spec, line, "a field declaration")
    _check_keys(ctx, spec, FIELD_KEYS, "field key")
    ftype = spec.get("type")
    if ftype not in FIELD_TYPES:
        raise ctx.error(spec.line_of("type"), f"type {ftype!r} is not one of {_allowed(FIELD_TYPES)}")
    nullable = spec.get("nullable", False)
    if not isinstance(nullable, bool):
        raise ctx.error(spec.line_of("nullable"), f"nullable must be true or false, got {_shown(nullable)}")
    closed = spec.get("closed", False)
    if not isinstance(closed, bool):
        raise ctx.error(spec.line_of("closed"), f"closed must be true or false, got {_shown(closed)}")
    if closed and ftype not in ("str", "int"):
        raise ctx.error(spec.line_of("closed"), f"closed applies to str and int fields only (field type {ftype})")
    field = Field(name, ftype, (), nullable, _text(ctx, spec, "description", required=False))
    raw = spec.get("domain")
    if raw is None:
        if ftype != "bool":
            raise ctx.error(spec.line, f"field type {ftype} needs a declared domain (the checker's grid)")
        ctx.where = ""
        return field
    if not isinstance(raw, LineList) or not raw:
        raise ctx.error(spec.line_of("domain"), "domain must be a non-empty list")
    domain = []
    for value, vline in zip(raw, raw.item_lines):
        problem = field.check_value(value)
        if problem:
            raise ctx.error(vline, f"domain value {format_value(value)}: {problem}")
        value = normalize(ftype, value)
        if value in domain:
            raise ctx.error(vline, f"duplicate domain value {format_value(value)}")
        domain.append(value)
    if nullable and None not in domain:
        domain.append(None)
    ctx.where = ""
    return Field(name, ftype, tuple(domain), nullable, field.description, closed)


def _value(ctx: _Ctx, field: Field, op: str, value: Any, line: int) -> Any:
    problem = field.check_value(value)
    if problem:
        raise ctx.error(line, f"{field.name}: {op} {format_value(value)}: {problem}")
    return normalize(field.type, value)


def _parse_op(ctx: _Ctx, field: Field, op: str, arg: Any, line: int, because: str | None) -> Condition:
    name = field.name
    if op not in OPERATORS:
        raise ctx.error(line, f"{name}: unknown operator {op!r} (allowed: {_allowed(OPERATORS)}, because)")
    if op in ("eq", "ne"):
        norm = _value(ctx, field, op, arg, line)
    elif op in ("in", "not_in"):
        if not isinstance(arg, list) or not arg:
            raise ctx.error(line, f"{name}: {op} needs a non-empty list, got {_shown(arg)}")
        norm = tuple(_value(ctx, field, op, a, line) for a in arg)
    elif op == "multiple_of":
        if field.type != "int":
            raise ctx.error(line, f"{name}: multiple_of needs an int field, {name} is {field.type}")
        if isinstance(arg, bool) or not isinstance(arg, int) or arg < 1:
            raise ctx.error(line, f"{name}: multiple_of needs a positive int, got {_shown(arg)}")
        norm = arg
    elif op == "present":
        if not isinstance(arg, bool):
            raise ctx.error(line, f"{name}: present needs true or false, got {_shown(arg)}")
        if not field.nullable:
            raise ctx.error(line, f"{name}: present needs a nullable field")
        norm = arg
    else:
        if op in VERSION_OPS and field.type != "version":
            raise ctx.error(line, f"{name}: {op} needs a version field, {name} is {field.type}")
        if op in ORDER_OPS and field.type not in NUMERIC_TYPES:
            raise ctx.error(line, f"{name}: {op} needs an int, float or version field, {name} is {field.type}")
        if op == "range":
            if not isinstance(arg, list) or len(arg) != 2 or None in arg:
                raise ctx.error(line, f"{name}: range needs [lo, hi], got {_shown(arg)}")
            norm = tuple(_value(ctx, field, op, a, line) for a in arg)
            lo, hi = (Version(v) for v in norm) if field.type == "version" else norm
            if lo > hi:
                raise ctx.error(line, f"{name}: range [{format_value(norm[0])}, {format_value(norm[1])}] is empty")
        else:
            if arg is None:
                raise ctx.error(line, f"{name}: {op} needs a value, got null")
            norm = _value(ctx, field, op, arg, line)
    return Condition(name, op, norm, field.type, because)


def _parse_conditions(ctx: _Ctx, when: Any, fields: dict, line: int, what: str) -> tuple:
    if when is None:
        return ()
    when = _require_map(ctx, when, line, what)
    conditions = []
    for name, spec in when.items():
        kline = when.line_of(name)
        if name not in fields:
            raise ctx.error(kline, f"unknown field {name!r} in {what} (fields: {_allowed(tuple(fields))})")
        field = fields[name]
        if isinstance(spec, LineDict):
            because = spec.get("because")
            ops = [k for k in spec if k != "because"]
            if not ops:
                raise ctx.error(kline, f"{name}: a condition mapping needs at least one operator")
            if isinstance(because, LineDict):  # one reason per operator: {present: "...", at_least: "..."}
                for op, text in because.items():
                    if op not in ops:
                        raise ctx.error(because.line_of(op), f"{name}: because names operator {op!r}, which the "
                                                              f"condition does not use ({_allowed(tuple(ops))})")
                    if not isinstance(text, str) or not text.strip():
                        raise ctx.error(because.line_of(op), f"{name}: because.{op} must be a non-empty string")
                reasons = {op: because.get(op) for op in ops}
            elif "because" in spec and (not isinstance(because, str) or not because.strip()):
                raise ctx.error(spec.line_of("because"), f"{name}: because must be a non-empty string "
                                                          "or a mapping operator -> string")
            else:
                reasons = {op: because for op in ops}
            for op in ops:
                conditions.append(_parse_op(ctx, field, op, spec[op], spec.line_of(op), reasons[op]))
        elif isinstance(spec, LineList):
            conditions.append(_parse_op(ctx, field, "in", spec, kline, None))
        else:
            conditions.append(_parse_op(ctx, field, "eq", spec, kline, None))
    return tuple(conditions)


def _parse_params(ctx: _Ctx, mapping: LineDict, owner_line: int) -> dict:
    """The ``params`` of a row or path: a mapping with string keys (``{}`` when absent)."""
    params = mapping.get("params")
    if params is None:
        if "params" in mapping:
            raise ctx.error(mapping.line_of("params"), "params must be a mapping, got null (omit the key for none)")
        return {}
    params = _require_map(ctx, params, mapping.line_of("params") or owner_line, "params")
    for key in params:
        if not isinstance(key, str):
            raise ctx.error(params.line_of(key), f"params key {key!r} must be a string")
    return _plain(params)


def _parse_path(ctx: _Ctx, name: Any, spec: Any, line: int, fields: dict) -> PathSpec:
    if not isinstance(name, str) or not ID_RE.match(name):
        raise ctx.error(line, f"path name {name!r} must match [a-z0-9_]+")
    ctx.where = f"path {name!r}"
    spec = LineDict() if spec is None else _require_map(ctx, spec, line, "a path declaration")
    _check_keys(ctx, spec, PATH_KEYS, "path key")
    requires = _parse_conditions(ctx, spec.get("requires"), fields, spec.line_of("requires") or line, "requires")
    out = PathSpec(
        name,
        _text(ctx, spec, "description", required=False),
        requires,
        line,
        params=_parse_params(ctx, spec, line),
        source=_text(ctx, spec, "source", required=False),
    )
    ctx.where = ""
    return out


def _parse_row(ctx: _Ctx, raw: Any, line: int, fields: dict, paths: dict, seen: dict) -> Row:
    ctx.where = ""
    raw = _require_map(ctx, raw, line, "a row")
    row_id = raw.get("id")
    if not isinstance(row_id, str) or not ID_RE.match(row_id):
        raise ctx.error(raw.line_of("id"), f"row id {row_id!r} must be a string matching [a-z0-9_]+")
    ctx.where = f"row {row_id!r}"
    if row_id in seen:
        raise ctx.error(raw.line_of("id"), f"duplicate row id (first at line {seen[row_id]})")
    seen[row_id] = raw.line
    _check_keys(ctx, raw, ROW_KEYS, "row key")
    has_path, has_refuse = "path" in raw, "refuse" in raw
    if has_path == has_refuse:
        raise ctx.error(raw.line, "a row needs exactly one of 'path' or 'refuse'")
    path = refuse = None
    bound: tuple = ()
    if has_path:
        path = raw["path"]
        if not isinstance(path, (str, int, float, bool, type(None))):  # a list or mapping: not a name (unhashable)
            raise ctx.error(raw.line_of("path"), f"'path' must be the name of a declared path "
                                                 f"(paths: {_allowed(tuple(paths))}), got {_shown(path)}")
        if path not in paths:
            raise ctx.error(raw.line_of("path"), f"undeclared path {path!r} (paths: {_allowed(tuple(paths))})")
        if "paths" in raw:
            raise ctx.error(raw.line_of("paths"), "'paths' names the paths a refusal row binds; a path row has none")
    else:
        refuse = _text(ctx, raw, "refuse", required=True)
        if "params" in raw:
            raise ctx.error(raw.line_of("params"), "params are not allowed on a refusal row")
        bound = _refused_paths(ctx, raw, paths)
    params = _parse_params(ctx, raw, raw.line)
    when = _parse_conditions(ctx, raw.get("when"), fields, raw.line_of("when"), "when")
    row = Row(
        id=row_id,
        when=when,
        path=path,
        refuse=refuse,
        paths=bound,
        params=params,
        why=_text(ctx, raw, "why", required=True),
        source=_text(ctx, raw, "source", required=True),
        line=raw.line,
    )
    ctx.where = ""
    return row


def _refused_paths(ctx: _Ctx, raw: LineDict, paths: dict) -> tuple:
    """A refusal row's ``paths``: the declared paths whose kernels it refuses, so that a call requesting one of
    them is refused too (an empty tuple when absent: such a row refuses only calls that request no path)."""
    if "paths" not in raw:
        return ()
    bound = raw["paths"]
    line = raw.line_of("paths")
    if not isinstance(bound, list) or not bound or not all(isinstance(p, str) for p in bound):
        raise ctx.error(line, f"'paths' must be a non-empty list of path names, got {_plain(bound)!r}")
    for p in bound:
        if p not in paths:
            raise ctx.error(line, f"'paths' names undeclared path {p!r} (paths: {_allowed(tuple(paths))})")
    if len(set(bound)) != len(bound):
        raise ctx.error(line, f"'paths' repeats a path: {_plain(bound)!r}")
    return tuple(bound)


def _plain(value: Any) -> Any:
    """Strip line bookkeeping: ``LineDict``/``LineList`` become dict/list."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read_source(source: str | os.PathLike, name: str | None) -> tuple[str, str]:
    is_file = isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))
    )
    if is_file:
        label = name or str(source)
        data = Path(source).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:  # named by file and line, as every table error is (a break test)
            line = data[:e.start].count(b"\n") + 1
            raise TableError(f"{label}:{line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}): "
                             "a table is UTF-8") from None
        return text, label
    if not isinstance(source, str):
        raise TypeError(f"load_table needs a path or YAML text, got {type(source).__name__}")
    return source, name or "<string>"


def load_table(source: str | os.PathLike, *, name: str | None = None) -> RuleTable:
    """Load and strictly validate a rule table.

    Args:
        source: A path (``os.PathLike``, or a one-line string ending in
            ``.yaml``/``.yml``) or the YAML text itself.
        name: Label used for the file in error messages and as
            ``RuleTable.source_file``; defaults to the path, or ``<string>``.

    Returns:
        The ``RuleTable``.

    Raises:
        TableError: The table is malformed (or a file is not UTF-8 text); the
            message names the file, the line and (inside a row) the row id.
        OSError: The file cannot be read.
    """
    text, label = _read_source(source, name)
    ctx = _Ctx(label)
    doc = load_yaml(text, label)
    doc = _require_map(ctx, doc, 1, "a rule table")
    _check_keys(ctx, doc, TOP_KEYS, "top-level key")
    for key in ("table", "fields", "paths", "rows"):
        if key not in doc:
            raise ctx.error(doc.line, f"missing top-level key {key!r}")
    table_name = _text(ctx, doc, "table", required=True)
    raw_fields = _require_map(ctx, doc["fields"], doc.line_of("fields"), "fields")
    fields = {k: _parse_field(ctx, k, v, raw_fields.line_of(k)) for k, v in raw_fields.items()}
    raw_paths = _require_map(ctx, doc["paths"], doc.line_of("paths"), "paths")
    paths = {k: _parse_path(ctx, k, v, raw_paths.line_of(k), fields) for k, v in raw_paths.items()}
    raw_rows = doc["rows"]
    if not isinstance(raw_rows, LineList):
        raise ctx.error(doc.line_of("rows"), "rows must be a list")
    seen: dict = {}
    rows = tuple(
        _parse_row(ctx, raw, line, fields, paths, seen) for raw, line in zip(raw_rows, raw_rows.item_lines)
    )
    return RuleTable(
        name=table_name,
        fields=fields,
        paths=paths,
        rows=rows,
        source_file=label,
        description=_text(ctx, doc, "description", required=False),
    )
