"""Generic ordered rule-table engine: load, select, explain, check.

A table (YAML) declares typed ``fields`` with domains, named ``paths`` and
ordered ``rows``; the first row whose conditions hold chooses a path or
refuses. ``explain`` says why every earlier row was rejected; ``check_table``
proves over the product of the domains that every combination is answered and
every row can win. Knows nothing about any particular application.
"""

from .check import Problem, assert_table_ok, check_table
from .conditions import OPERATORS, Condition, Failure
from .errors import TableCheckError, TableError
from .explain import explain, selection_to_dict
from .loader import load_table
from .schema import Field, PathSpec
from .table import Row, RuleTable, Selection

__all__ = [
    "OPERATORS",
    "Condition",
    "Failure",
    "Field",
    "PathSpec",
    "Problem",
    "Row",
    "RuleTable",
    "Selection",
    "TableCheckError",
    "TableError",
    "assert_table_ok",
    "check_table",
    "explain",
    "load_table",
    "selection_to_dict",
]
