"""YAML loading that keeps line numbers and rejects duplicate keys.

Mappings load as ``LineDict`` and sequences as ``LineList``; both remember the
line where they start and the line of each key or item (1-based). Plain scalars
resolve as YAML 1.2's core schema, not PyYAML's YAML 1.1: booleans are only
``true`` / ``false`` (``yes``, ``no``, ``on``, ``off``, ``y`` and ``n`` load as
the strings they are, so a bool field written ``yes`` is refused by its type
check instead of read as true); ints are decimal (``016`` is 16, not octal 14),
``0o17`` or ``0x1f`` (``2:08`` and ``1_000`` are strings, not 128 and 1000);
floats take an exponent without a dot (``1e3`` is 1000.0); dates (``2026-12-01``),
``=`` and ``<<`` are strings (no timestamps, value or merge keys).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import TableError

#: YAML 1.2 core-schema scalars (YAML 1.2.2, section 10.3.2), which replace PyYAML's YAML 1.1 resolvers.
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_CORE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float")}
#: YAML 1.1 types that YAML 1.2's core schema does not have: a plain ``2026-12-01`` (a date, as the tables' sources
#: write them), ``=`` and ``<<`` are strings (``<<`` is thus an unknown key, not a merge the loader would drop).
_YAML11_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("timestamp", "value", "merge")}


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2's core-schema booleans, ints and floats (see the module docstring)."""

    def construct_yaml_int(self, node: yaml.Node) -> int:
        """A YAML 1.2 int: decimal (leading zeros allowed), ``0o`` octal or ``0x`` hex."""
        value = self.construct_scalar(node)
        return int(value, 0) if value[:2] in ("0o", "0x") else int(value, 10)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _CORE_TAGS | _YAML11_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# ints before floats: a plain "16" matches both patterns, and the first resolver added for a character wins
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_12, list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class LineDict(dict):
    """A dict with ``line`` (its first line) and ``key_lines`` (line of each key)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line = 0
        self.key_lines: dict = {}

    def line_of(self, key: str) -> int:
        """Return the line of ``key``, or of the mapping when absent.

        Args:
            key: A key of the mapping.

        Returns:
            A 1-based line number.
        """
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A list with ``line`` (its first line) and ``item_lines`` (line of each item)."""

    line: int = 0
    item_lines: list


def _row_id(node: yaml.MappingNode) -> str | None:
    """The scalar ``id`` of a mapping node (a row), to name it in errors."""
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "id":
            if isinstance(value_node, yaml.ScalarNode):
                return value_node.value
    return None


#: The most nodes one table may expand to, aliases counted at every use. The shipped tables have at most about 1,300;
#: the cap refuses an alias bomb (``&a [*b, *b, ...]`` nested) at once instead of walking its 10^7 nodes for seconds.
MAX_NODES = 100_000

#: The deepest nesting of mappings and lists one table may have. The shipped tables nest at most 6 deep; the cap
#: refuses a hostile ``[[[[...]]]]`` with the line where it passes the cap, before Python's recursion limit would
#: (a break test, sixtieth session: 400 levels raised a RecursionError from the conversion below).
MAX_DEPTH = 20


def _convert(node: yaml.Node, loader: _Loader, label: str, where: str = "", count: list | None = None,
             depth: int = 0) -> Any:
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_NODES:
        raise TableError(f"{label}:{node.start_mark.line + 1}: {where}the document expands to more than {MAX_NODES} "
                         f"nodes (aliases counted at each use); a rule table is far smaller")
    if depth > MAX_DEPTH:
        raise TableError(f"{label}:{node.start_mark.line + 1}: {where}mappings and lists nest more than {MAX_DEPTH} "
                         f"levels deep; a rule table nests a few")
    if isinstance(node, yaml.MappingNode):
        row_id = _row_id(node)
        if row_id is not None:
            where = f"row {row_id!r}: "
        out = LineDict()
        out.line = node.start_mark.line + 1
        for key_node, value_node in node.value:
            key = _convert(key_node, loader, label, where, count, depth + 1)
            line = key_node.start_mark.line + 1
            if isinstance(key, (dict, list)):
                raise TableError(f"{label}:{line}: {where}a mapping key must be a scalar")
            if key in out:
                raise TableError(
                    f"{label}:{line}: {where}duplicate key {key!r} (first at line {out.key_lines[key]})"
                )
            out[key] = _convert(value_node, loader, label, where, count, depth + 1)
            out.key_lines[key] = line
        return out
    if isinstance(node, yaml.SequenceNode):
        out_list = LineList(_convert(item, loader, label, where, count, depth + 1) for item in node.value)
        out_list.line = node.start_mark.line + 1
        out_list.item_lines = [item.start_mark.line + 1 for item in node.value]
        return out_list
    return loader.construct_object(node, deep=True)


def load_yaml(text: str, label: str) -> Any:
    """Parse one YAML document, keeping line numbers.

    Args:
        text: The YAML text.
        label: File name used in error messages.

    Returns:
        ``LineDict`` / ``LineList`` / scalars; ``None`` for an empty document.

    Raises:
        TableError: On a YAML syntax error, a character YAML does not take, a duplicate key, a document that
            expands to more than :data:`MAX_NODES` nodes (an alias bomb) or nests more than :data:`MAX_DEPTH` levels.
    """
    try:
        loader = _Loader(text)  # its reader checks every character of a str here, and only here
    except yaml.reader.ReaderError as exc:  # a character YAML does not take (NUL, U+0080, U+FFFE, ...): PyYAML's
        # error has no line mark, so the line is counted from its offset (it was a traceback: a break test)
        line = text[:exc.position].count("\n") + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise TableError(f"{label}:{line}: invalid YAML: unacceptable character U+{char:04X} (YAML takes printable "
                         f"characters, tabs and line breaks only)") from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        return _convert(node, loader, label)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = str(exc.problem or exc)
        hint = ""
        if "mapping values are not allowed" in problem or problem == "expected ',' or '}', but got ':'":
            # the usual cause in a table: ': ' inside a plain string (in a flow mapping {...}, the second message)
            hint = (" (a plain, unquoted string may not contain ': ' - quote the why / because text, or write"
                    " ' - ' instead)")
        raise TableError(f"{label}:{line}: invalid YAML: {problem}{hint}") from exc
    except RecursionError as exc:  # PyYAML's composer recurses once a level: about 1000 levels pass Python's limit
        # before _convert's MAX_DEPTH can see them
        line = loader.get_mark().line + 1
        raise TableError(f"{label}:{line}: mappings and lists nest too deep for the YAML reader (more than "
                         f"{MAX_DEPTH} levels are refused); a rule table nests a few") from exc
    finally:
        loader.dispose()
