"""Generic ordered rule-table engine: load, select, explain, check.

A table (YAML) declares typed ``fields`` with domains, named ``paths`` and
ordered ``rows``; the first row whose conditions (and its path's ``requires``) hold chooses a path, with
the path's default ``params`` under the row's own, or refuses. A call may request a path: rows of other
paths are then skipped, and so are refusal rows, except those whose ``paths`` name the requested one (a
refusal about that path's kernels). ``explain`` says
why every earlier row was rejected, grouped by path and each mismatch once;
``check_table`` proves over the product of the domains that every combination is
answered and every row can win. Knows nothing about any particular application.
"""

from .check import Problem, assert_table_ok, check_table
from .conditions import OPERATORS, Condition, Failure, statements
from .errors import TableCheckError, TableError
from .explain import ReasonsOnce, explain, rejection_groups, selection_to_dict
from .loader import load_table
from .schema import Field, FrozenDict, PathSpec, readonly
from .table import Row, RuleTable, Selection

__all__ = [
    "OPERATORS",
    "Condition",
    "Failure",
    "Field",
    "FrozenDict",
    "PathSpec",
    "Problem",
    "ReasonsOnce",
    "Row",
    "RuleTable",
    "Selection",
    "TableCheckError",
    "TableError",
    "assert_table_ok",
    "check_table",
    "explain",
    "load_table",
    "rejection_groups",
    "selection_to_dict",
    "statements",
    "readonly",
]
