"""Tests of the generic rule-table engine: operators, selection, explain, schema errors."""

from __future__ import annotations

import json
import textwrap

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
    with pytest.raises(TypeError):
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
    assert "  ✗ fast_gfx950: arch=cpu, needs gfx950; num_heads=64, needs one of [16, 32]; " in text
    assert "  ✗ fast_any: need_lse=true, needs false (writes no LSE)" in text


def test_explain_no_row_matched(table):
    sel = table.select({**BASE, "arch": "sm90", "num_heads": 128})
    assert "  ✗ no row matched" in explain(sel)
    assert "  ✗ slow_small: num_heads=128, needs <= 32" in explain(sel)


def test_selection_to_dict_is_json(table):
    sel = table.select({**BASE, "need_lse": True, "aiter_version": None})
    data = json.loads(json.dumps(selection_to_dict(sel)))
    assert data["refused"] is True and data["reason"] == "no row matched" and data["row"] is None
    assert data["values"]["aiter_version"] is None and data["values"]["need_lse"] is True
    fails = {r["row"]: r["failures"] for r in data["rejected"]}
    lse = fails["fast_any"][0]
    assert (lse["field"], lse["op"], lse["actual"], lse["expected"], lse["because"]) == (
        "need_lse", "eq", True, False, "writes no LSE"
    )
    assert lse["text"] == "need_lse=true, needs false (writes no LSE)"
    heads = fails["fast_gfx950"][1]
    assert (heads["actual"], heads["expected"]) == (64, [16, 32])

    win = selection_to_dict(table.select({**BASE, "arch": "gfx950", "num_heads": 16, "aiter_version": "0.1.19"}))
    assert win["path"] == "fast" and win["params"] == {"num_kv_splits": 1, "BLOCK_H": 64}
    assert win["row"]["id"] == "fast_gfx950" and win["row"]["line"] > 0


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
    (_row_table("- id: bad\n  when: {num_heads: {because: x}}\n  path: slow\n  why: w\n  source: s\n"),
     ["row 'bad'", "needs at least one operator"], 15),
    (_row_table(GOOD_ROW + "- id: bad\n  path: quick\n  why: w\n  source: s\n"),
     ["row 'bad'", "undeclared path 'quick'"], 19),
    (_row_table("- id: bad\n  path: slow\n  refuse: no\n  why: w\n  source: s\n"),
     ["row 'bad'", "exactly one of 'path' or 'refuse'"], 14),
    (_row_table("- id: bad\n  why: w\n  source: s\n"), ["row 'bad'", "exactly one of 'path' or 'refuse'"], 14),
    (_row_table("- id: bad\n  refuse: nope\n  params: {a: 1}\n  why: w\n  source: s\n"),
     ["row 'bad'", "params are not allowed on a refusal row"], 16),
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
