"""Tests of the generic rule-table engine: operators, selection, explain, schema errors."""

from __future__ import annotations

import json
import textwrap

import math
import re

import pytest

from mla_sink.dispatch import TableError, explain, load_table, selection_to_dict

FIELDS = """\
table: demo
description: test table
fields:
  arch: {type: str, domain: [gfx942, gfx950, sm90, cpu]}
  num_heads: {type: int, domain: [1, 16, 32, 64, 128, 256]}
  sinks: {type: bool}
  need_lse: {type: bool}
  aiter_version: {type: version, nullable: true, domain: [null, "0.1.12", "0.1.19"]}
  logit_cap: {type: float, domain: [0.0, 30.0]}
paths:
  fast: {description: fast kernel, requires: {need_lse: {eq: false, because: writes no LSE}}}
  slow: {description: slow kernel}
"""

BASE = dict(arch="gfx942", num_heads=64, sinks=True, need_lse=False, aiter_version="0.1.15", logit_cap=30.0)


def one_row_table(when: str):
    """A table whose first row tests ``when`` (a YAML flow mapping) and whose second catches all."""
    text = FIELDS + textwrap.dedent(
        f"""\
        rows:
          - id: probe
            when: {when}
            path: slow
            why: probe row
            source: test
          - id: fallback
            path: slow
            why: catch all
            source: test
        """
    )
    return load_table(text)


# (when, overrides of BASE, expected failure texts of row 'probe' or [] when it matches)
OPERATOR_CASES = [
    ("{arch: gfx950}", {}, ["arch=gfx942, needs gfx950"]),
    ("{arch: gfx942}", {}, []),
    ("{arch: {eq: gfx950}}", {}, ["arch=gfx942, needs gfx950"]),
    ("{arch: {ne: gfx942}}", {}, ["arch=gfx942, needs not gfx942"]),
    ("{arch: {ne: gfx950}}", {}, []),
    ("{num_heads: [16, 32]}", {}, ["num_heads=64, needs one of [16, 32]"]),
    ("{num_heads: [16, 64]}", {}, []),
    ("{num_heads: {in: [16, 32]}}", {}, ["num_heads=64, needs one of [16, 32]"]),
    ("{num_heads: {not_in: [64, 128]}}", {}, ["num_heads=64, needs none of [64, 128]"]),
    ("{num_heads: {not_in: [16]}}", {}, []),
    ("{num_heads: {lt: 64}}", {}, ["num_heads=64, needs < 64"]),
    ("{num_heads: {lt: 65}}", {}, []),
    ("{num_heads: {le: 32}}", {}, ["num_heads=64, needs <= 32"]),
    ("{num_heads: {le: 128}}", {"num_heads": 256}, ["num_heads=256, needs <= 128"]),
    ("{num_heads: {le: 64}}", {}, []),
    ("{num_heads: {gt: 64}}", {}, ["num_heads=64, needs > 64"]),
    ("{num_heads: {gt: 63}}", {}, []),
    ("{num_heads: {ge: 128}}", {}, ["num_heads=64, needs >= 128"]),
    ("{num_heads: {ge: 64}}", {}, []),
    ("{num_heads: {range: [16, 32]}}", {}, ["num_heads=64, needs between 16 and 32"]),
    ("{num_heads: {range: [16, 64]}}", {}, []),
    ("{num_heads: {multiple_of: 16}}", {}, []),
    ("{num_heads: {multiple_of: 1}}", {"num_heads": 1}, []),
    ("{num_heads: {multiple_of: 16}}", {"num_heads": 1}, ["num_heads=1, needs a multiple of 16"]),
    ("{num_heads: {multiple_of: 128}}", {}, ["num_heads=64, needs a multiple of 128"]),
    ("{num_heads: {multiple_of: 16, le: 32, because: blocks}}", {},
     ["num_heads=64, needs <= 32 (blocks)"]),  # 64 is a multiple of 16: only the bound fails
    ("{logit_cap: {le: 0}}", {}, ["logit_cap=30.0, needs <= 0.0"]),
    ("{logit_cap: {le: 0}}", {"logit_cap": 0.0}, []),
    ("{sinks: false}", {}, ["sinks=true, needs false"]),
    ("{sinks: true}", {}, []),
    ("{need_lse: {ne: false}}", {}, ["need_lse=false, needs not false"]),
    ('{aiter_version: {at_least: "0.1.19"}}', {}, ["aiter_version=0.1.15, needs >= 0.1.19"]),
    ('{aiter_version: {at_least: "0.1.19"}}', {"aiter_version": None}, ["aiter_version=None, needs >= 0.1.19"]),
    ('{aiter_version: {at_least: "0.1.9"}}', {}, []),  # version order, not string order
    ('{aiter_version: {below: "0.1.13"}}', {}, ["aiter_version=0.1.15, needs < 0.1.13"]),
    ('{aiter_version: {below: "0.1.13"}}', {"aiter_version": None}, ["aiter_version=None, needs < 0.1.13"]),
    ('{aiter_version: {below: "0.1.19"}}', {}, []),
    ('{aiter_version: {range: ["0.1.13", "0.1.18"]}}', {"aiter_version": "0.1.19"},
     ["aiter_version=0.1.19, needs between 0.1.13 and 0.1.18"]),
    ('{aiter_version: {gt: "0.1.15"}}', {}, ["aiter_version=0.1.15, needs > 0.1.15"]),
    ('{aiter_version: "0.1.15.0"}', {}, []),  # versions compare as versions
    ("{aiter_version: {present: true}}", {"aiter_version": None}, ["aiter_version=None, needs a value"]),
    ("{aiter_version: {present: true}}", {}, []),
    ("{aiter_version: {present: false}}", {}, ["aiter_version=0.1.15, needs no value"]),
    ("{aiter_version: {present: false}}", {"aiter_version": None}, []),
    ("{aiter_version: null}", {"aiter_version": None}, []),
    ("{aiter_version: null}", {}, ["aiter_version=0.1.15, needs None"]),
    ("{aiter_version: {present: true, because: AITER not importable}}", {"aiter_version": None},
     ["aiter_version=None, needs a value (AITER not importable)"]),
    ('{aiter_version: {present: true, at_least: "0.1.19", because: LSE broken before 0.1.19}}', {},
     ["aiter_version=0.1.15, needs >= 0.1.19 (LSE broken before 0.1.19)"]),
    # several operators in one condition: each failure reported separately
    ("{num_heads: {ge: 128, in: [16, 32], because: bucket}}", {},
     ["num_heads=64, needs >= 128 (bucket)", "num_heads=64, needs one of [16, 32] (bucket)"]),
    # conditions on several fields: all failures listed, not just the first
    ("{arch: gfx950, num_heads: [16, 32], sinks: false}", {},
     ["arch=gfx942, needs gfx950", "num_heads=64, needs one of [16, 32]", "sinks=true, needs false"]),
    ("{}", {}, []),
]


@pytest.mark.parametrize("when,overrides,expected", OPERATOR_CASES, ids=[c[0] + str(c[1]) for c in OPERATOR_CASES])
def test_operator(when, overrides, expected):
    table = one_row_table(when)
    sel = table.select({**BASE, **overrides})
    if not expected:
        assert sel.row.id == "probe" and sel.rejected == ()
        return
    assert sel.row.id == "fallback"
    (row, fails), = sel.rejected
    assert row.id == "probe"
    assert [str(f) for f in fails] == expected


ROWS = FIELDS + """\
rows:
  - id: fast_gfx950
    when:
      arch: gfx950
      num_heads: {in: [16, 32]}
      aiter_version: {present: true, at_least: "0.1.19", because: AITER too old or absent}
    path: fast
    params: {num_kv_splits: 1, BLOCK_H: 64}
    why: the gfx950 kernel is fastest
    source: "ROCm/aiter aiter/mla.py"
  - id: fast_any
    when: {num_heads: 64}
    path: fast
    why: any arch with 64 heads
    source: test
  - id: no_cpu
    when: {arch: cpu}
    refuse: cpu is not supported
    why: no kernel runs there
    source: test
  - id: slow_small
    when: {num_heads: {le: 32}}
    path: slow
    why: small head counts
    source: test
"""


@pytest.fixture()
def table():
    return load_table(ROWS)


def test_first_match_wins_and_earlier_rows_listed(table):
    sel = table.select({**BASE, "arch": "gfx950", "num_heads": 64, "aiter_version": "0.1.19"})
    assert (sel.path, sel.row.id, sel.refused, sel.reason) == ("fast", "fast_any", False, "")
    assert [r.id for r, _ in sel.rejected] == ["fast_gfx950"]
    assert [str(f) for f in sel.rejected[0][1]] == ["num_heads=64, needs one of [16, 32]"]


def test_params_of_winner(table):
    sel = table.select({**BASE, "arch": "gfx950", "num_heads": 32, "aiter_version": "0.1.19"})
    assert sel.row.id == "fast_gfx950"
    assert dict(sel.params) == {"num_kv_splits": 1, "BLOCK_H": 64}
    with pytest.raises(TypeError, match="read-only"):
        sel.params["num_kv_splits"] = 2


def test_all_failures_of_every_earlier_row(table):
    sel = table.select({**BASE, "arch": "sm90", "num_heads": 16, "aiter_version": None})
    assert sel.row.id == "slow_small"
    got = {r.id: [str(f) for f in fails] for r, fails in sel.rejected}
    assert got == {
        "fast_gfx950": [
            "arch=sm90, needs gfx950",
            "aiter_version=None, needs a value (AITER too old or absent)",
            "aiter_version=None, needs >= 0.1.19 (AITER too old or absent)",
        ],
        "fast_any": ["num_heads=16, needs 64"],
        "no_cpu": ["arch=sm90, needs cpu"],
    }


def test_path_requires_rejects_matching_row(table):
    sel = table.select({**BASE, "need_lse": True})  # gfx942, 64 heads: fast_any's when holds
    assert sel.refused and sel.reason == "no row matched" and sel.row is None and sel.path is None
    got = {r.id: [str(f) for f in fails] for r, fails in sel.rejected}
    assert got["fast_any"] == ["need_lse=true, needs false (writes no LSE)"]
    assert [r.id for r, _ in sel.rejected] == ["fast_gfx950", "fast_any", "no_cpu", "slow_small"]


def test_refusal_row(table):
    sel = table.select({**BASE, "arch": "cpu", "num_heads": 16})
    assert sel.refused and sel.path is None and sel.row.id == "no_cpu"
    assert sel.reason == "cpu is not supported"
    assert dict(sel.params) == {}


def test_only_paths_skips_other_paths_and_refusals(table):
    sel = table.select({**BASE, "arch": "cpu", "num_heads": 16}, only_paths=["slow"])
    assert sel.row.id == "slow_small" and sel.path == "slow"
    got = {r.id: [str(f) for f in fails] for r, fails in sel.rejected}
    assert got == {
        "fast_gfx950": ["its path fast is not the requested path slow"],
        "fast_any": ["its path fast is not the requested path slow"],
        "no_cpu": ["a refusal row is not the requested path slow"],
    }


def test_a_refusal_row_binding_a_path_refuses_calls_requesting_it():
    """A refusal row with ``paths`` (the kernels it is about) still refuses a call that requests one of them,
    and is skipped for a call requesting another path (found by a break test: forcing path="triton" on sm80
    skipped the fp8-needs-sm89 refusal)."""
    table = load_table(ROWS.replace("    refuse: cpu is not supported\n",
                                    "    refuse: cpu is not supported\n    paths: [slow]\n"))
    values = {**BASE, "arch": "cpu", "num_heads": 16}
    sel = table.select(values, only_paths=["slow"])
    assert sel.refused and sel.row.id == "no_cpu" and sel.row.paths == ("slow",)
    assert sel.reason == "cpu is not supported"
    sel = table.select(values, only_paths=["fast"])  # no fast row matches on cpu with 16 heads
    assert sel.row is None and sel.reason == "no row matched"
    assert [str(f) for f in dict(sel.rejected)[table.rows[2]]] == ["a refusal row is not the requested path fast"]
    assert table.select(values).row.id == "no_cpu"  # no path requested: as before


def test_missing_field_is_value_error(table):
    values = dict(BASE)
    del values["sinks"]
    with pytest.raises(ValueError, match="missing value for field 'sinks'"):
        table.select(values)


def test_extra_keys_ignored_and_wrong_type_rejected(table):
    assert table.select({**BASE, "unrelated": 1}).row.id == "fast_any"
    with pytest.raises(ValueError, match=r"sinks=yes: expected a bool"):
        table.select({**BASE, "sinks": "yes"})
    with pytest.raises(ValueError, match="not nullable"):
        table.select({**BASE, "arch": None})


def test_explain_winner(table):
    sel = table.select({**BASE, "arch": "gfx950", "num_heads": 32, "need_lse": False, "aiter_version": "0.1.19"})
    assert explain(sel, key="bf16-h32-gfx950") == (
        "bf16-h32-gfx950\n"
        "  → fast  {num_kv_splits: 1, BLOCK_H: 64}   (row fast_gfx950)\n"
        "    why: the gfx950 kernel is fastest\n"
        "    source: ROCm/aiter aiter/mla.py"
    )


def test_explain_rejections_and_refusal(table):
    sel = table.select({**BASE, "arch": "cpu", "need_lse": True})
    text = explain(sel)
    assert text.splitlines()[0].startswith("arch=cpu, num_heads=64, sinks=true")
    assert "  ✗ refused: cpu is not supported (row no_cpu)" in text
    # path fast's requirement fails: one line for both of its rows, their own conditions not repeated
    assert "  ✗ path fast (rows fast_gfx950, fast_any): need_lse=true, needs false (writes no LSE)" in text
    assert "✗ fast_gfx950" not in text and "✗ fast_any" not in text and "arch=cpu, needs gfx950" not in text


def test_explain_no_row_matched(table):
    sel = table.select({**BASE, "arch": "sm90", "num_heads": 128})
    assert "  ✗ no row matched" in explain(sel)
    assert "  ✗ slow_small: num_heads=128, needs <= 32" in explain(sel)


def test_selection_to_dict_is_json(table):
    sel = table.select({**BASE, "need_lse": True, "aiter_version": None})
    data = json.loads(json.dumps(selection_to_dict(sel)))
    assert data["refused"] is True and data["reason"] == "no row matched" and data["row"] is None
    assert data["values"]["aiter_version"] is None and data["values"]["need_lse"] is True
    (group,) = data["rejected_paths"]
    assert group["path"] == "fast" and group["rows"] == ["fast_gfx950", "fast_any"]
    (lse,) = group["failures"]
    assert (lse["field"], lse["op"], lse["actual"], lse["expected"], lse["because"]) == (
        "need_lse", "eq", True, False, "writes no LSE"
    )
    assert lse["text"] == group["text"] == "need_lse=true, needs false (writes no LSE)"
    fails = {r["row"]: r["failures"] for r in data["rejected"]}
    assert list(fails) == ["no_cpu", "slow_small"]
    heads = fails["slow_small"][0]
    assert (heads["actual"], heads["expected"], heads["op"]) == (64, 32, "le")

    win = selection_to_dict(table.select({**BASE, "arch": "gfx950", "num_heads": 16, "aiter_version": "0.1.19"}))
    assert win["path"] == "fast" and win["params"] == {"num_kv_splits": 1, "BLOCK_H": 64}
    assert win["row"]["id"] == "fast_gfx950" and win["row"]["line"] > 0 and win["row"]["params"] == win["params"]
    assert win["rejected_paths"] == [] and win["rejected"] == []


def test_records_keep_lines_and_metadata(table):
    assert table.name == "demo" and table.source_file == "<string>"
    assert list(table.fields) == ["arch", "num_heads", "sinks", "need_lse", "aiter_version", "logit_cap"]
    assert table.fields["aiter_version"].domain == (None, "0.1.12", "0.1.19")
    assert table.fields["sinks"].grid() == (False, True)
    assert table.row("fast_gfx950").line == ROWS.splitlines().index("  - id: fast_gfx950") + 1
    assert table.paths["fast"].requires[0].because == "writes no LSE"


def test_load_from_file(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(ROWS)
    table = load_table(path)
    assert table.source_file == str(path)
    assert load_table(str(path)).rows == table.rows


def _row_table(row_yaml: str) -> str:
    return FIELDS + "rows:\n" + textwrap.indent(textwrap.dedent(row_yaml), "  ")


FIELDS_NO_ROWS = FIELDS + "rows: []\n"

GOOD_ROW = """\
- id: good
  path: slow
  why: fine
  source: test
"""

# (yaml text, expected substrings (row id, message), line number of the error)
SCHEMA_ERRORS = [
    (FIELDS + "rowz: []\nrows: []\n", ["unknown top-level key 'rowz'"], 13),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: int, domain: [1], color: red}"),
     ["field 'extra'", "unknown field key 'color'"], 4),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: integer, domain: [1]}"), ["type 'integer'"], 4),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: int}"), ["field type int needs a declared domain"], 4),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: int, domain: [1, two]}"),
     ["domain value two", "expected an int"], 4),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: version, domain: [0.5]}"),
     ["expected a version written as a quoted string"], 4),
    (FIELDS_NO_ROWS.replace("fields:", "fields:\n  extra: {type: str, domain: [a, null]}"), ["not nullable"], 4),
    (FIELDS + "rows: []\n" + "table: again\n", ["duplicate key 'table'"], 14),
    (FIELDS.replace("slow: {description: slow kernel}", "slow: {description: s, requires: {arch: {gte: x}}}")
     + "rows: []\n", ["path 'slow'", "unknown operator 'gte'"], 12),
    (_row_table(GOOD_ROW + "- id: bad\n  colour: red\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "unknown row key 'colour'"], 19),
    (_row_table("- id: bad\n  when: {heads: 1}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "unknown field 'heads' in when"], 15),
    (_row_table("- id: aiter_lse\n  when:\n    num_heads: {gte: 16}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'aiter_lse'", "unknown operator 'gte' (allowed: eq, ne, in,"], 16),
    (_row_table("- id: bad\n  when: {sinks: 'yes'}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "sinks: eq yes", "expected a bool"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {in: [16, '32']}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "expected an int"], 15),
    (_row_table("- id: bad\n  when: {num_heads: sixteen}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "expected an int, got str 'sixteen'"], 15),
    (_row_table("- id: bad\n  when: {arch: {lt: gfx950}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "lt needs an int, float or version field"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {at_least: '1'}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "at_least needs a version field"], 15),
    (_row_table("- id: bad\n  when: {aiter_version: {at_least: 'latest'}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "expected a PEP 440 version"], 15),
    (_row_table("- id: bad\n  when: {arch: {present: true}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "present needs a nullable field"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {range: [64, 16]}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "range [64, 16] is empty"], 15),
    (_row_table("- id: bad\n  when: {logit_cap: {multiple_of: 2}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "multiple_of needs an int field, logit_cap is float"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {multiple_of: 0}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "multiple_of needs a positive int, got 0"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {multiple_of: '16'}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "multiple_of needs a positive int, got '16'"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {multiple_of: true}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "multiple_of needs a positive int, got true"], 15),
    (_row_table("- id: bad\n  when: {num_heads: {because: x}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "needs at least one operator"], 15),
    (_row_table(GOOD_ROW + "- id: bad\n  path: quick\n  why: w\n  source: s\n"),
     ["row 'bad'", "undeclared path 'quick'"], 19),
    (_row_table("- id: bad\n  path: slow\n  refuse: no\n  why: w\n  source: s\n"),
     ["row 'bad'", "exactly one of 'path' or 'refuse'"], 14),
    (_row_table("- id: bad\n  why: w\n  source: s\n"), ["row 'bad'", "exactly one of 'path' or 'refuse'"], 14),
    (_row_table("- id: bad\n  refuse: nope\n  params: {a: 1}\n  why: w\n  source: s\n"),
     ["row 'bad'", "params are not allowed on a refusal row"], 16),
    (_row_table("- id: bad\n  refuse: nope\n  paths: [quick]\n  why: w\n  source: s\n"),
     ["row 'bad'", "'paths' names undeclared path 'quick'"], 16),
    (_row_table("- id: bad\n  refuse: nope\n  paths: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "'paths' must be a non-empty list of path names, got 'slow'"], 16),
    (_row_table("- id: bad\n  refuse: nope\n  paths: []\n  why: w\n  source: s\n"),
     ["row 'bad'", "'paths' must be a non-empty list"], 16),
    (_row_table("- id: bad\n  refuse: nope\n  paths: [slow, slow]\n  why: w\n  source: s\n"),
     ["row 'bad'", "'paths' repeats a path"], 16),
    (_row_table("- id: bad\n  path: slow\n  paths: [slow]\n  why: w\n  source: s\n"),
     ["row 'bad'", "a path row has none"], 16),
    (_row_table("- id: bad\n  path: slow\n  source: s\n"), ["row 'bad'", "missing 'why'"], 14),
    (_row_table("- id: bad\n  path: slow\n  why: w\n  source: ''\n"), ["row 'bad'", "'source' must be a non-empty"], 17),
    (_row_table("- id: Bad-Row\n  path: slow\n  why: w\n  source: s\n"), ["must be a string matching [a-z0-9_]+"], 14),
    (_row_table(GOOD_ROW + GOOD_ROW), ["row 'good'", "duplicate row id (first at line 14)"], 18),
    (_row_table("- id: bad\n  path: slow\n  why: w\n  why: again\n  source: s\n"), ["row 'bad'", "duplicate key 'why' (first at line 16)"], 17),
]


@pytest.mark.parametrize("text,expected,line", SCHEMA_ERRORS, ids=[e[1][-1] for e in SCHEMA_ERRORS])
def test_schema_error_names_file_row_and_line(tmp_path, text, expected, line):
    path = tmp_path / "mla_decode.yaml"
    path.write_text(text)
    with pytest.raises(TableError) as info:
        load_table(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    for part in expected:
        assert part in message, message
    # the same text loaded from a string names the given label
    with pytest.raises(TableError, match=rf"^demo\.yaml:{line}: "):
        load_table(text, name="demo.yaml")


CLOSED_TABLE = """
table: closed
fields:
  dtype: {type: str, closed: true, domain: [bf16, fp16]}
  arch: {type: str, domain: [a, b]}
paths:
  p: {description: x}
rows:
  - id: r1
    when: {dtype: %s, arch: zz}
    path: p
    why: w
    source: s
  - id: r2
    path: p
    why: w
    source: s
"""


def test_closed_field_rejects_unknown_value_at_load(tmp_path):
    f = tmp_path / "closed.yaml"
    f.write_text(CLOSED_TABLE % "fp61")
    with pytest.raises(TableError, match=r"closed.yaml:10: row 'r1'.*fp61.*not in the closed domain \[bf16, fp16\]"):
        load_table(f)
    f.write_text(CLOSED_TABLE % "fp16")  # open fields still accept values outside the grid ('zz')
    table = load_table(f)
    with pytest.raises(ValueError, match="dtype"):
        table.select({"dtype": "fp8", "arch": "a"})


YAML11_TABLE = """
table: yaml11
fields:
  sinks: {type: bool}
  cap: {type: float, nullable: true, domain: [null, 30.0]}
  dtype: {type: str, domain: [bf16]}
paths:
  p: {description: x}
rows:
  - id: r1
    when: %s
    path: p
    why: w
    source: s
"""


@pytest.mark.parametrize("when,text", [
    ("{sinks: yes}", "expected a bool (true/false), got str 'yes'"),
    ("{sinks: off}", "expected a bool (true/false), got str 'off'"),
    ("{cap: .nan}", "expected a number other than NaN"),
    ("{cap: [30.0, .NaN]}", "expected a number other than NaN"),
], ids=["yes", "off", "nan", "nan_in_list"])
def test_yaml11_booleans_and_nan_are_refused_at_load(tmp_path, when, text):
    """YAML 1.1's yes/no/on/off are strings here (YAML 1.2), so a bool field written that way is a type error, not
    true; a NaN could never match, so a float field refuses it."""
    f = tmp_path / "yaml11.yaml"
    f.write_text(YAML11_TABLE % when)
    with pytest.raises(TableError, match=r"yaml11.yaml:11: row 'r1': .*" + re.escape(text)):
        load_table(f)


def test_yaml12_booleans_and_strings_named_like_yaml11_booleans_load(tmp_path):
    f = tmp_path / "yaml11.yaml"
    f.write_text((YAML11_TABLE % "{sinks: True, dtype: on}").replace("domain: [bf16]", "domain: [bf16, on, 'no']"))
    table = load_table(f)
    assert table.select({"sinks": True, "dtype": "on", "cap": None}).row.id == "r1"
    assert table.select({"sinks": False, "dtype": "on", "cap": None}).row is None


def test_closed_only_on_str_and_int(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CLOSED_TABLE.replace("arch: {type: str,", "arch: {type: float, closed: true,") % "fp16")
    with pytest.raises(TableError, match="closed applies to str and int"):
        load_table(f)


PER_OP_BECAUSE = """
table: per_op
fields:
  v: {type: version, nullable: true, domain: [null, "0.1", "0.3"]}
paths:
  p: {description: x}
rows:
  - id: r1
    when:
      v: {present: true, at_least: "0.2", because: {present: "lib not importable", at_least: "broken before 0.2"}}
    path: p
    why: w
    source: s
  - id: r2
    path: p
    why: w
    source: s
"""


def test_because_per_operator():
    table = load_table(PER_OP_BECAUSE)
    none = [str(f) for f in table.select({"v": None}).rejected[0][1]]
    assert none[0] == "v=None, needs a value (lib not importable)"
    old = [str(f) for f in table.select({"v": "0.1"}).rejected[0][1]]
    assert old == ["v=0.1, needs >= 0.2 (broken before 0.2)"]
    with pytest.raises(TableError, match="because names operator 'below'"):
        load_table(PER_OP_BECAUSE.replace('at_least: "broken', 'below: "broken'))


# ---- path default params ---------------------------------------------------------------------------

PATH_PARAMS = """
table: path_params
fields:
  heads: {type: int, domain: [8, 16, 64]}
  lse: {type: bool}
paths:
  fast:
    description: x
    params: {pad_to: 16, splits: 32, layout: [a, b]}
    source: where the defaults come from
  slow: {description: y}
rows:
  - id: fast_override
    when: {heads: 64}
    path: fast
    params: {splits: 4, extra: true}
    why: w
    source: s
  - id: fast_plain
    when: {lse: false}
    path: fast
    why: w
    source: s
  - id: refuse_small
    when: {heads: 8}
    refuse: too few heads
    why: w
    source: s
  - id: slow_rest
    path: slow
    params: {tile: 2}
    why: w
    source: s
"""


def test_path_params_are_defaults_under_the_row_params():
    table = load_table(PATH_PARAMS)
    assert dict(table.paths["fast"].params) == {"pad_to": 16, "splits": 32, "layout": ["a", "b"]}
    assert table.paths["fast"].source == "where the defaults come from"
    with pytest.raises(TypeError, match="read-only"):
        table.paths["fast"].params["splits"] = 1
    over = table.select({"heads": 64, "lse": True})
    assert over.row.id == "fast_override"
    assert dict(over.params) == {"pad_to": 16, "splits": 4, "layout": ["a", "b"], "extra": True}
    assert dict(over.row.params) == {"splits": 4, "extra": True}  # the row keeps only its own
    plain = table.select({"heads": 16, "lse": False})
    assert plain.row.id == "fast_plain" and dict(plain.params) == {"pad_to": 16, "splits": 32, "layout": ["a", "b"]}
    refused = table.select({"heads": 8, "lse": True})
    assert refused.refused and dict(refused.params) == {}
    assert dict(table.select({"heads": 16, "lse": True}).params) == {"tile": 2}  # a path without defaults
    assert table.row_params(table.row("fast_override")) == dict(over.params)
    assert "  → fast  {pad_to: 16, splits: 4, layout: [a, b], extra: true}   (row fast_override)" in explain(over)


@pytest.mark.parametrize("bad,message", [
    ("params: [1, 2]", "params must be a mapping"),
    ("params: 3", "params must be a mapping"),
    ("params:", "params must be a mapping, got null"),  # the YAML's spelling (a break test, forty-second session)
    ("params: {1: x}", "params key 1 must be a string"),
    ("colour: red", "unknown path key 'colour' (allowed: description, requires, params, source)"),
])
def test_path_params_are_validated(tmp_path, bad, message):
    text = PATH_PARAMS.replace("    params: {pad_to: 16, splits: 32, layout: [a, b]}", "    " + bad)
    f = tmp_path / "pp.yaml"
    f.write_text(text)
    with pytest.raises(TableError) as info:
        load_table(f)
    assert str(info.value).startswith(f"{f}:9: path 'fast': "), str(info.value)
    assert message in str(info.value)


def test_path_source_must_be_text(tmp_path):
    f = tmp_path / "pp.yaml"
    f.write_text(PATH_PARAMS.replace("    source: where the defaults come from", "    source: ''"))
    with pytest.raises(TableError, match=r":10: path 'fast': 'source' must be a non-empty string"):
        load_table(f)


# ---- explanations: grouped by path, each mismatch once ------------------------------------------------

GROUPED = """
table: grouped
fields:
  arch: {type: str, domain: [gfx942, sm90]}
  lib: {type: version, nullable: true, domain: [null, "0.1", "0.3"]}
  heads: {type: int, domain: [16, 64, 128]}
paths:
  a: {requires: &lib {arch: {eq: gfx942, because: kernels exist there only}, lib: {present: true, at_least: "0.2", because: {present: lib absent, at_least: broken before 0.2}}}}
  b: {requires: *lib}
  c: {requires: {heads: {le: 64, because: at most 64 heads}}}
  d: {}
rows:
  - {id: a1, when: {heads: 16}, path: a, why: w, source: s}
  - {id: b1, when: {heads: 64}, path: b, why: w, source: s}
  - {id: a2, when: {heads: 128}, path: a, why: w, source: s}
  - {id: c1, when: {heads: 16}, path: c, why: w, source: s}
  - {id: c2, path: c, why: w, source: s}
  - {id: d1, when: {heads: 16, lib: {present: true, at_least: "0.2", because: needs the lib}}, path: d, why: w, source: s}
  - {id: d2, when: {heads: 64, arch: gfx942}, refuse: not this one, why: w, source: s}
  - {id: d3, path: d, why: w, source: s}
"""


def test_path_failures_are_computed_once_per_path():
    sel = load_table(GROUPED).select({"arch": "sm90", "lib": None, "heads": 128})
    assert sel.row.id == "d3"
    assert set(sel.path_failures) == {"a", "b", "c"}
    assert [str(f) for f in sel.path_failures["c"]] == ["heads=128, needs <= 64 (at most 64 heads)"]
    # rejected keeps every failure of every row (its own conditions, then its path's)
    got = {r.id: [str(f) for f in fails] for r, fails in sel.rejected}
    assert got["a1"][0] == "heads=128, needs 16" and "arch=sm90, needs gfx942 (kernels exist there only)" in got["a1"]


def test_explain_groups_paths_and_states_each_mismatch_once():
    sel = load_table(GROUPED).select({"arch": "sm90", "lib": None, "heads": 128})
    lines = explain(sel, key="k").splitlines()
    assert lines[:4] == ["k", "  → d   (row d3)", "    why: w", "    source: s"]
    assert lines[4:] == [
        # paths a and b fail the same requirements: one line naming both, with their rows
        "  ✗ paths a (rows a1, a2), b (row b1): arch=sm90, needs gfx942 (kernels exist there only); "
        "lib=None, needs a value (lib absent) and >= 0.2 (broken before 0.2)",
        "  ✗ path c (rows c1, c2): heads=128, needs <= 64 (at most 64 heads)",
        # a row's own conditions: several failures of one field are one statement, one shared reason
        "  ✗ d1: heads=128, needs 16; lib=None, needs a value and >= 0.2 (needs the lib)",
        "  ✗ d2: heads=128, needs 64; arch=sm90, needs gfx942",
    ]


def test_explain_gives_each_reason_once():
    table = load_table(GROUPED.replace("  - {id: c2, path: c, why: w, source: s}\n", "")
                       .replace("c: {requires: {heads: {le: 64, because: at most 64 heads}}}",
                                "c: {requires: {heads: {le: 64, because: at most 64 heads}, arch: {eq: gfx942, because: kernels exist there only}}}"))
    text = explain(table.select({"arch": "sm90", "lib": "0.3", "heads": 128}))
    assert text.count("(kernels exist there only)") == 1
    assert "  ✗ path c (row c1): heads=128, needs <= 64 (at most 64 heads); arch=sm90, needs gfx942" in text


def test_explain_only_paths_groups_skipped_rows_by_path():
    table = load_table(GROUPED)
    sel = table.select({"arch": "gfx942", "lib": "0.3", "heads": 64}, only_paths=["d"])
    assert sel.row.id == "d3"
    text = explain(sel)
    assert "  ✗ path a (rows a1, a2): not the requested path d" in text
    assert "  ✗ path b (row b1): not the requested path d" in text
    assert "  ✗ path c (rows c1, c2): not the requested path d" in text
    assert "  ✗ d1: heads=64, needs 16" in text
    assert "  ✗ d2: a refusal row is not the requested path d" in text
    doc = selection_to_dict(sel)
    assert doc["rejected_paths"] == []
    assert [r["row"] for r in doc["rejected"]] == ["a1", "a2", "b1", "c1", "c2", "d1", "d2"]
    assert doc["rejected"][0]["text"] == "its path a is not the requested path d"


def test_statements_merge_one_field_and_drop_duplicates():
    from mla_sink.dispatch import Failure, statements

    f1 = Failure("v", "present", None, True, "absent")
    f2 = Failure("v", "at_least", None, "0.2", "too old")
    f3 = Failure("h", "le", 128, 64, None)
    assert statements((f1, f2, f3, f1)) == ("v=None, needs a value (absent) and >= 0.2 (too old)", "h=128, needs <= 64")
    same = Failure("v", "at_least", None, "0.2", "absent")
    assert statements((f1, same)) == ("v=None, needs a value and >= 0.2 (absent)",)
    assert statements((f3,)) == (str(f3),)


def test_a_colon_in_a_plain_string_names_the_fix(tmp_path):
    """A ``why`` holding ``': '`` in plain YAML broke a shipped table for two commits (thirty-first session); the
    loader's error now says what to do about it, with the file and line."""
    from mla_sink.core.tables import table_path

    source = open(table_path("mla_decode")).read()
    row = "    why: Triton cannot run the kernel here (it is"
    assert source.count(row) == 1
    path = tmp_path / "mla_decode.yaml"
    path.write_text(source.replace(row, "    why: Triton cannot run the kernel here: it is"))
    with pytest.raises(TableError, match=r"mla_decode.yaml:\d+: invalid YAML: mapping values are not allowed here "
                                         r"\(a plain, unquoted string may not contain ': '"):
        load_table(str(path))


def test_yaml12_numbers():
    """Plain scalars are YAML 1.2 core-schema numbers (a fourth break test, thirty-third session): ``016`` was read
    as octal 14, ``2:08`` as 128 (base 60) and ``1_000`` as 1000, while ``1e3`` stayed a string."""
    from mla_sink.dispatch.yaml_lines import load_yaml

    got = load_yaml("a: [016, 2:08, 1_000, 0o17, 0x1f, 1e3, -2, .5, 1., .inf, -.inf, 3.0e-2, '016', 0.1.19]", "x")["a"]
    assert got[:6] == [16, "2:08", "1_000", 15, 31, 1000.0] and type(got[5]) is float
    assert got[6:12] == [-2, 0.5, 1.0, float("inf"), float("-inf"), 0.03] and got[12:] == ["016", "0.1.19"]
    assert math.isnan(load_yaml("a: .nan", "x")["a"])


def test_an_alias_bomb_is_refused_at_once():
    """Nested aliases (``&a [*b x 10]`` seven levels: 10^7 nodes) were walked node by node for about 8.5 s before the
    row checks refused them (break test, forty-third session); the loader now stops at ``MAX_NODES``, and a table
    that uses an alias below the cap loads with the alias expanded."""
    from mla_sink.dispatch.yaml_lines import MAX_NODES, load_yaml

    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 8)]
    with pytest.raises(TableError, match=rf"^bomb:\d+: the document expands to more than {MAX_NODES} nodes"):
        load_yaml("\n".join(lines), "bomb")
    small = load_yaml("\n".join(lines[:3]), "small")
    assert small["l2"][9][9] == ["x"] * 10 and len(small["l2"]) == 10


@pytest.mark.parametrize("levels", [33, 400, 3000])
@pytest.mark.parametrize("open_,close", [("[", "]"), ("{b: ", "}")])
def test_deep_nesting_is_a_table_error(levels, open_, close):
    """400 nested lists raised a ``RecursionError`` out of the loader's conversion, and about 1000 out of PyYAML's
    composer, instead of a ``TableError`` (break test, sixtieth session); past ``MAX_DEPTH`` levels the loader
    refuses them, and a document at the cap still loads."""
    from mla_sink.dispatch import load_table
    from mla_sink.dispatch.yaml_lines import MAX_DEPTH, load_yaml

    text = "a: " + open_ * levels + "1" * (open_ != "[") + close * levels
    with pytest.raises(TableError, match=rf"^deep:1: mappings and lists nest .*more than {MAX_DEPTH} levels"):
        load_yaml(text, "deep")
    with pytest.raises(TableError, match=r"^<string>:1: mappings and lists nest"):
        load_table(text)
    ok = load_yaml("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH, "ok")["a"]
    for _ in range(MAX_DEPTH - 1):
        ok = ok[0]
    assert ok == []


@pytest.mark.parametrize("value,text", [
    ("[slow]", "'path' must be the name of a declared path (paths: fast, slow), got [slow]"),
    ("{slow: 1}", "'path' must be the name of a declared path (paths: fast, slow), got {slow: 1}"),
    ("5", "undeclared path 5 (paths: fast, slow)"),
])
def test_a_path_that_is_not_a_name_is_a_table_error(value, text):
    """``path: [slow]`` raised ``TypeError: unhashable type`` out of the loader (and out of ``mla-sink tables``)
    instead of a ``TableError`` naming the file, line and row (break test, tables session)."""
    with pytest.raises(TableError, match=r"^demo\.yaml:15: row 'bad': " + re.escape(text)):
        load_table(_row_table(f"- id: bad\n  path: {value}\n  why: w\n  source: s\n"), name="demo.yaml")


@pytest.mark.parametrize("text", ["source: 2026-12-01", "source: 2026-12-01 10:00:00", "why: =",
                                  "why: <<"])
def test_dates_and_yaml11_tags_are_plain_strings(text):
    """YAML 1.2's core schema has no timestamps, ``=`` or merge keys: ``source: 2026-12-01`` (a date, as the tables'
    sources write them) was refused as "'source' must be a non-empty string, got 2026-12-01", and ``why: =`` as
    "could not determine a constructor" (break test, tables session)."""
    row = "- id: r\n  path: slow\n  why: w\n  source: s\n".replace(text.split(":")[0] + ": " + (
        "s" if text.startswith("source") else "w"), text)
    table = load_table(_row_table(row))
    key, value = text.split(": ", 1)
    assert getattr(table.row("r"), key) == value


def test_a_merge_key_is_an_unknown_row_key():
    text = _row_table("- &r {id: r, path: slow, why: w, source: s}\n- <<: *r\n  id: r2\n")
    with pytest.raises(TableError, match=r"^demo\.yaml:15: row 'r2': unknown row key '<<' \(allowed: id,"):
        load_table(text, name="demo.yaml")


@pytest.mark.parametrize("text,expected", [
    (FIELDS_NO_ROWS.replace("sinks: {type: bool}", "sinks: {type: bool, nullable: 'true'}"),
     "nullable must be true or false, got 'true'"),
    (FIELDS_NO_ROWS.replace("sinks: {type: bool}", "sinks: {type: str, domain: [a], closed: 'false'}"),
     "closed must be true or false, got 'false'"),
    (_row_table("- id: r\n  when: {aiter_version: {present: 'true'}}\n  path: slow\n  why: w\n  source: s\n"),
     "present needs true or false, got 'true'"),
    (FIELDS_NO_ROWS.replace("description: test table", "description: ''"), "'description' must be a non-empty "
                                                                              "string, got ''"),
    (_row_table("- id: r\n  when: {num_heads: {in: '16'}}\n  path: slow\n  why: w\n  source: s\n"),
     "in needs a non-empty list, got '16'"),
], ids=["nullable", "closed", "present", "description", "in"])
def test_a_string_that_looks_like_the_allowed_value_is_quoted(text, expected):
    """"nullable must be true or false, got true" (a quoted 'true') named the allowed value as the wrong one: a
    string is now shown quoted (break test, tables session)."""
    with pytest.raises(TableError, match=re.escape(expected)):
        load_table(text)


def test_a_colon_in_a_flow_mapping_names_the_fix():
    text = _row_table("- id: r\n  when: {num_heads: {ge: 16, because: a: b}}\n  path: slow\n  why: w\n  source: s\n")
    with pytest.raises(TableError, match=r"^<string>:15: invalid YAML: expected ',' or '}', but got ':' \(a plain, "
                                         r"unquoted string may not contain ': '"):
        load_table(text)
