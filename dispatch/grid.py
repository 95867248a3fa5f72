"""The product of the field domains as integer bitsets.

Combination number ``b`` (a bit of a Python ``int``) is the mixed-radix number
whose digits are domain indices, the first field most significant. Each
condition is evaluated once per domain value; a row's set of combinations is an
AND over fields of ORs of per-value bitsets, so a grid of 500k combinations
costs a few hundred big-integer operations.
"""

from __future__ import annotations

from typing import Mapping

from .schema import Field


def _repeat(pattern: int, period: int, times: int) -> int:
    """Concatenate ``times`` copies of a ``period``-bit pattern (by doubling)."""
    result, length, cur, cur_len = 0, 0, pattern, period
    while times:
        if times & 1:
            result |= cur << length
            length += cur_len
        times >>= 1
        if times:
            cur |= cur << cur_len
            cur_len *= 2
    return result


class Grid:
    """Bitset view of the product of the declared domains.

    Args:
        fields: Mapping from field name to ``Field``, in declaration order.
        extra: Values to enumerate beside a field's declared domain (field name -> values; those already in it are
            skipped), e.g. the thresholds of the rows' conditions on an open int field (``boundary_values``).

    Raises:
        ValueError: A field has an empty grid (a non-bool field without domain).
    """

    def __init__(self, fields: Mapping[str, Field], extra: Mapping[str, tuple] | None = None) -> None:
        self.names = list(fields)
        extra = extra or {}
        self.domains = []
        for n in self.names:
            dom = tuple(fields[n].grid())
            self.domains.append(dom + tuple(v for v in extra.get(n, ()) if dom and v not in dom))
        for name, dom in zip(self.names, self.domains):
            if not dom:
                raise ValueError(f"field {name!r} has no domain; the checker cannot enumerate it")
        self.size = 1
        for dom in self.domains:
            self.size *= len(dom)
        self.all = (1 << self.size) - 1
        self.strides = []
        inner = self.size
        self._value_masks: dict[str, list[int]] = {}
        for name, dom in zip(self.names, self.domains):
            inner //= len(dom)
            self.strides.append(inner)
            period = inner * len(dom)
            block = (1 << inner) - 1
            self._value_masks[name] = [
                _repeat(block << (i * inner), period, self.size // period) for i in range(len(dom))
            ]
        self._index = {n: i for i, n in enumerate(self.names)}

    def field_mask(self, name: str, conditions: list) -> int:
        """Return the combinations where every condition on field ``name`` holds.

        Args:
            name: A field name.
            conditions: ``Condition`` records on that field.

        Returns:
            A bitset.
        """
        dom = self.domains[self._index[name]]
        masks = self._value_masks[name]
        allowed = [i for i, v in enumerate(dom) if all(c.holds(v) for c in conditions)]
        if len(allowed) == len(dom):
            return self.all
        out = 0
        for i in allowed:
            out |= masks[i]
        return out

    def by_field(self, conditions: tuple) -> dict:
        """Group conditions by field, in field order.

        Args:
            conditions: ``Condition`` records.

        Returns:
            Mapping from field name to the list of its conditions.
        """
        groups: dict = {}
        for cond in conditions:
            groups.setdefault(cond.field, []).append(cond)
        return groups

    def mask(self, conditions: tuple) -> int:
        """Return the combinations where all ``conditions`` hold.

        Args:
            conditions: ``Condition`` records.

        Returns:
            A bitset (``self.all`` for no conditions).
        """
        out = self.all
        for name, conds in self.by_field(conditions).items():
            out &= self.field_mask(name, conds)
            if not out:
                break
        return out

    def example(self, bits: int) -> dict:
        """Return the first combination in ``bits`` as ``{field: value}``.

        Args:
            bits: A non-empty bitset.

        Returns:
            The field values of the lowest set bit.
        """
        index = (bits & -bits).bit_length() - 1
        return {
            name: dom[(index // stride) % len(dom)]
            for name, dom, stride in zip(self.names, self.domains, self.strides)
        }
