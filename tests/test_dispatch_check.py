"""Tests of the table checker: coverage, reachability, path requirements, scale."""

from __future__ import annotations

import textwrap

import pytest

from mla_sink.dispatch import TableCheckError, assert_table_ok, check_table, load_table

HEAD = """\
table: check_demo
fields:
  arch: {type: str, domain: [gfx942, gfx950, cpu]}
  num_heads: {type: int, domain: [16, 32, 64]}
  need_lse: {type: bool}
  version: {type: version, nullable: true, domain: ["0.1.12", "0.1.19"]}
paths:
  fast: {description: no LSE, requires: {need_lse: {eq: false, because: writes no LSE}}}
  lse: {description: with LSE}
  slow: {description: anywhere}
rows:
"""


def make(rows: str):
    return load_table(HEAD + textwrap.indent(textwrap.dedent(rows), "  "), name="check_demo.yaml")


def kinds(problems):
    return [(p.kind, p.row_id) for p in problems]


GOOD = """\
- id: fast_gfx950
  when: {arch: gfx950, version: {at_least: "0.1.19"}}
  path: fast
  why: w
  source: s
- id: lse_new
  when: {version: {present: true, at_least: "0.1.19"}, num_heads: [16, 32]}
  path: lse
  why: w
  source: s
- id: refuse_cpu
  when: {arch: cpu}
  refuse: no cpu
  why: w
  source: s
- id: fallback
  path: slow
  why: w
  source: s
"""


def test_good_table_passes():
    table = make(GOOD)
    assert check_table(table) == []
    assert_table_ok(table, strict=True)


def test_nullable_domain_gets_null():
    assert make(GOOD).fields["version"].grid() == ("0.1.12", "0.1.19", None)


def test_shadowed_row_names_the_covering_row():
    table = make(
        """\
        - id: wide
          when: {num_heads: {le: 64}}
          path: slow
          why: w
          source: s
        - id: narrow
          when: {num_heads: 32}
          path: lse
          why: w
          source: s
        """
    )
    problems = check_table(table)
    assert kinds(problems) == [("shadowed", "narrow"), ("unused_path", None)]
    assert "earlier row(s) wide" in problems[0].message
    assert problems[0].message.startswith("check_demo.yaml:17: row 'narrow'")
    with pytest.raises(TableCheckError, match="shadowed") as info:
        assert_table_ok(table)
    assert [p.kind for p in info.value.problems] == ["shadowed", "unused_path"]


def test_shadowed_by_several_rows():
    table = make(
        """\
        - id: small
          when: {num_heads: [16, 32]}
          path: slow
          why: w
          source: s
        - id: big
          when: {num_heads: 64}
          path: lse
          why: w
          source: s
        - id: any
          path: fast
          why: w
          source: s
        """
    )
    problems = check_table(table)
    assert kinds(problems) == [("shadowed", "any")]
    assert "earlier row(s) small, big" in problems[0].message


def test_gap_reports_an_example_combination():
    table = make(
        """\
        - id: gfx
          when: {arch: [gfx942, gfx950]}
          path: slow
          why: w
          source: s
        - id: cpu_small
          when: {arch: cpu, num_heads: 16}
          refuse: not here
          why: w
          source: s
        """
    )
    problems = check_table(table)
    gaps = [p for p in problems if p.kind == "gap"]
    assert len(gaps) == 1 and gaps[0].row_id is None
    assert "12 of 54 combination(s) match no row" in gaps[0].message
    assert "e.g. arch=cpu, num_heads=32, need_lse=false, version=0.1.12" in gaps[0].message
    with pytest.raises(TableCheckError, match="arch=cpu, num_heads=32"):
        assert_table_ok(table)


def test_unsatisfiable_row():
    table = make(
        """\
        - id: impossible
          when: {num_heads: {gt: 64}, arch: cpu}
          path: lse
          why: w
          source: s
        - id: contradictory
          when: {num_heads: {ge: 32, le: 16}}
          path: lse
          why: w
          source: s
        - id: fallback
          path: slow
          why: w
          source: s
        """
    )
    problems = check_table(table)
    assert kinds(problems) == [
        ("unsatisfiable", "impossible"),
        ("unsatisfiable", "contradictory"),
        ("unused_path", None),
    ]
    assert "no declared value of num_heads satisfies its conditions" in problems[0].message
    assert "no declared value of num_heads" in problems[1].message


def test_path_requires_narrow_their_rows_and_the_rest_falls_through():
    """A path's requires are part of every row naming it: combinations they exclude fall through to later
    rows (no problem as long as one answers them), and are a gap when none does."""
    rows = """\
        - id: fast_everywhere
          when: {arch: gfx950}
          path: fast
          why: w
          source: s
        - id: fallback
          path: slow
          why: w
          source: s
        """
    table = make(rows)
    assert kinds(check_table(table)) == [("unused_path", None)]
    assert table.select({"arch": "gfx950", "num_heads": 16, "need_lse": True, "version": None}).row.id == "fallback"
    assert table.select({"arch": "gfx950", "num_heads": 16, "need_lse": False, "version": None}).row.id == "fast_everywhere"
    gap = make(rows.split("        - id: fallback")[0])
    problems = check_table(gap)
    assert [p.kind for p in problems if p.level == "error"] == ["gap"]
    assert "45 of 54 combination(s) match no row" in problems[0].message  # 9 = gfx950 x need_lse false x 3 x 3


def test_requires_never_satisfiable_is_unsatisfiable():
    table = make(
        """\
        - id: fast_lse
          when: {need_lse: true}
          path: fast
          why: w
          source: s
        - id: fallback
          path: slow
          why: w
          source: s
        """
    )
    problems = check_table(table)
    assert kinds(problems) == [("unsatisfiable", "fast_lse"), ("unused_path", None)]
    assert "path 'fast' requires conditions that never hold together with the row's" in problems[0].message


def test_row_repeating_its_path_is_a_warning():
    """Rows say only what is particular to them: a condition the path's requires already imply, or a param
    equal to the path's default, is reported (as a warning)."""
    head = HEAD.replace("fast: {description: no LSE, requires: {need_lse: {eq: false, because: writes no LSE}}}",
                        "fast: {description: no LSE, requires: {need_lse: {eq: false}, num_heads: {le: 32}}, "
                        "params: {splits: 2, block: 64}}")
    rows = """\
        - id: fast_repeats
          when: {arch: gfx950, need_lse: false, num_heads: {le: 64}}
          path: fast
          params: {splits: 2, block: 32}
          why: w
          source: s
        - id: fast_narrower
          when: {num_heads: 16}
          path: fast
          why: w
          source: s
        - id: fallback
          path: slow
          why: w
          source: s
        """
    table = load_table(head + textwrap.indent(textwrap.dedent(rows), "  "), name="check_demo.yaml")
    problems = check_table(table)
    assert kinds(problems) == [("redundant_condition", "fast_repeats"), ("redundant_condition", "fast_repeats"),
                               ("redundant_param", "fast_repeats"), ("unused_path", None)]
    assert {p.level for p in problems} == {"warning"}
    assert "its condition on need_lse adds nothing: path 'fast' already requires it (eq false)" in problems[0].message
    assert "its condition on num_heads adds nothing" in problems[1].message
    assert "params splits: 2 repeats the default of path 'fast'" in problems[2].message
    assert_table_ok(table)
    with pytest.raises(TableCheckError, match="redundant_condition"):
        assert_table_ok(table, strict=True)


def test_unused_path_is_a_warning():
    table = make(
        """\
        - id: fallback
          path: slow
          why: w
          source: s
        """
    )
    problems = check_table(table)
    assert kinds(problems) == [("unused_path", None), ("unused_path", None)]
    assert {p.level for p in problems} == {"warning"}
    assert "path 'fast' is declared but no row names it" in problems[0].message
    assert_table_ok(table)  # warnings alone pass
    with pytest.raises(TableCheckError, match="unused_path"):
        assert_table_ok(table, strict=True)


def test_undeclared_path_in_table_built_in_code():
    import attrs

    table = make(GOOD)
    bad_row = attrs.evolve(table.rows[-1], path="ghost")
    table = attrs.evolve(table, rows=table.rows[:-1] + (bad_row,))
    assert ("undeclared_path", "fallback") in kinds(check_table(table))


def test_checker_agrees_with_select():
    """A table the checker finds clean (no gap, no shadowed row) has a winning row for every combination select is
    given, and every row wins somewhere (the check called, not assumed: a mutation audit, forty-seventh session)."""
    import itertools

    table = make(GOOD)
    assert not [p for p in check_table(table) if p.kind in ("gap", "shadowed")]
    grids = [f.grid() for f in table.fields.values()]
    winners = set()
    for combo in itertools.product(*grids):
        sel = table.select(dict(zip(table.fields, combo)))
        assert sel.row is not None
        winners.add(sel.row.id)
    assert winners == {row.id for row in table.rows}


def test_large_grid_completes():
    """~300k combinations, 15 fields, 20 rows: the checker must finish (no timing assert)."""
    sizes = [4, 6, 2, 2, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    lines = ["table: big", "fields:"]
    for i, size in enumerate(sizes):
        lines.append(f"  f{i}: {{type: int, domain: {list(range(size))}}}")
    lines += ["paths:", "  a: {requires: {f14: {eq: 0}}}", "  b: {}", "rows:"]
    for r in range(19):
        field = r % 14
        path = "a" if r % 2 else "b"
        lines += [
            f"  - id: r{r}",
            f"    when: {{f{field}: {{ge: {1 + r // 14}}}, f{(field + 1) % 14}: {r % 2}}}",
            f"    path: {path}",
            "    why: w",
            "    source: s",
        ]
    lines += ["  - id: fallback", "    path: b", "    why: w", "    source: s"]
    table = load_table("\n".join(lines) + "\n")
    problems = check_table(table)
    assert problems and all(p.kind in ("shadowed", "unsatisfiable") for p in problems)  # rows past r13 repeat a field
    assert not any(p.kind == "gap" for p in problems)
    # the table it proved is the one written: r0 (f0 >= 1, f1 == 0) wins where it holds, the fallback where none does
    assert table.select({f"f{i}": 1 if i == 0 else 0 for i in range(len(sizes))}).row.id == "r0"
    assert table.select({f"f{i}": 0 for i in range(len(sizes))}).row.id == "fallback"


@pytest.mark.parametrize("first,second,value", [
    ("{num_heads: {ne: 48}}", None, 48),  # a value between the declared 32 and 64
    ("{num_heads: {lt: 40}}", "{num_heads: {gt: 40}}", 40),  # the threshold itself
    ("{num_heads: {le: 100}}", None, 101),  # past the largest declared value
    ("{num_heads: {range: [10, 20]}}", "{num_heads: {not_in: [17, 18, 19, 20, 21]}}", 21),
    ("{num_heads: {multiple_of: 16}}", None, 17),  # every declared value is a multiple: the one past 16 is not
])
def test_a_gap_between_declared_int_values_is_found(first, second, value):
    """With ``thresholds`` the rows' thresholds on an open int field are enumerated beside its declared domain, so a
    combination the declared values skip (a gap only a call with that value would meet) is found."""
    rows = f"- id: first\n  when: {first}\n  path: slow\n  why: w\n  source: s\n"
    if second:
        rows += f"- id: second\n  when: {second}\n  path: slow\n  why: w\n  source: s\n"
    assert [p for p in check_table(make(rows)) if p.kind == "gap"] == []  # the declared values alone: covered
    problems = check_table(make(rows), thresholds=True)
    gaps = [p for p in problems if p.kind == "gap"]
    assert len(gaps) == 1 and f"num_heads={value}" in str(gaps[0]), [str(p) for p in problems]


def test_every_residue_between_two_thresholds_is_enumerated():
    """``multiple_of`` beside ranges (a break test, forty-second session): 43, the odd value between ``le: 41`` and
    ``ge: 45``, matches no row when the third row takes the even ones only; the thresholds' neighbours (40-42, 44-46)
    miss it, so each residue after each threshold is enumerated too. And a row that only an undeclared
    multiple can match (``multiple_of: 3`` and ``ge: 65``: 66) is not called unsatisfiable."""
    rows = ("- id: even\n  when: {num_heads: {multiple_of: 2}}\n  path: slow\n  why: w\n  source: s\n"
            "- id: small\n  when: {num_heads: {le: 41}}\n  path: slow\n  why: w\n  source: s\n"
            "- id: big\n  when: {num_heads: {ge: 45}}\n  path: slow\n  why: w\n  source: s\n")
    gaps = [str(p) for p in check_table(make(rows), thresholds=True) if p.kind == "gap"]
    assert len(gaps) == 1 and "num_heads=43" in gaps[0], gaps
    rows = ("- id: three_big\n  when: {num_heads: {multiple_of: 3, ge: 65}}\n  path: slow\n  why: w\n  source: s\n"
            "- id: rest\n  path: slow\n  why: w\n  source: s\n")
    assert not [p for p in check_table(make(rows), thresholds=True) if p.kind == "unsatisfiable"]


def test_no_threshold_value_below_the_smallest_declared_one():
    """The declared domain's smallest value is the field's floor: ``ge: 16`` over ``[16, 32, 64]`` has no gap at 15."""
    rows = "- id: first\n  when: {num_heads: {ge: 16}}\n  path: slow\n  why: w\n  source: s\n"
    assert [p for p in check_table(make(rows), thresholds=True) if p.kind == "gap"] == []


@pytest.mark.parametrize("when,bad", [
    ("{arch: [gfx942, gfx95O]}", "gfx95O"),  # an in-list typo: the row silently missed gfx950 (a break test)
    ("{arch: {ne: cuda}}", "cuda"),
    ("{arch: {not_in: [gfx942, sm90]}}", "sm90"),
])
def test_a_str_value_outside_the_field_domain_is_an_error(when, bad):
    """A value a row compares a ``str`` field with must be in the field's declared domain, which is the table's
    vocabulary of that field: a misspelling inside an ``in`` list of an open field loaded and passed the checker,
    and the row silently stopped matching that target (forty-third session)."""
    table = make(GOOD.replace("- id: fallback\n", f"- id: typo\n  when: {when}\n  path: lse\n  why: w\n  source: s\n"
                              "- id: fallback\n"))
    problems = [p for p in check_table(table) if p.kind == "unknown_value"]
    assert [p.row_id for p in problems] == ["typo"] and problems[0].level == "error"
    assert bad in problems[0].message and "not in the field's declared domain [gfx942, gfx950, cpu]" in str(
        problems[0])
    with pytest.raises(TableCheckError, match="unknown_value"):
        assert_table_ok(table)


def test_a_path_requirement_value_outside_the_domain_is_an_error():
    table = load_table(HEAD.replace("requires: {need_lse: {eq: false, because: writes no LSE}}",
                                    "requires: {arch: [gfx950, gfx9SO]}") + textwrap.indent(GOOD, "  "),
                       name="check_demo.yaml")
    problems = [p for p in check_table(table) if p.kind == "unknown_value"]
    assert len(problems) == 1 and problems[0].row_id is None and "path 'fast'" in problems[0].message


def test_a_table_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    """A stray Latin-1 byte stopped ``mla-sink tables`` with "'utf-8' codec can't decode byte 0xe9", naming no file,
    and the tables after it went unchecked (a break test, forty-third session)."""
    from mla_sink.dispatch import TableError

    path = tmp_path / "t.yaml"
    path.write_bytes((HEAD + textwrap.indent(GOOD, "  ")).encode().replace(b"why: w", b"why: caf\xe9", 1))
    line = (HEAD + textwrap.indent(GOOD, "  ")).splitlines().index("    why: w") + 1
    with pytest.raises(TableError, match=rf"t\.yaml:{line}: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_table(path)


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x7f", "\x80", "\ufffe"])
def test_a_character_yaml_does_not_take_is_named_with_its_line(char):
    """Valid UTF-8 that YAML refuses (a NUL, a C1 control, U+FFFE) ended ``mla-sink tables`` in a PyYAML ReaderError
    traceback naming "<unicode string>" (a break test, forty-third session)."""
    from mla_sink.dispatch import TableError

    text = HEAD + textwrap.indent(GOOD, "  ")
    line = text.splitlines().index("    why: w") + 1
    with pytest.raises(TableError, match=rf"t\.yaml:{line}: invalid YAML: unacceptable character U\+{ord(char):04X}"):
        load_table(text.replace("why: w", f"why: w{char}", 1), name="t.yaml")


def test_the_threshold_check_sees_a_float_field_s_gaps():
    """``ne: 5.0`` on a float field left 5.0 unanswered and passed ``thresholds=True``, which enumerated int fields
    only (a break test, forty-third session): the floats next to each threshold are enumerated too."""
    head = HEAD.replace("  need_lse: {type: bool}\n",
                        "  need_lse: {type: bool}\n  cap: {type: float, domain: [0.0, 30.0]}\n")
    rows = GOOD.replace("- id: fallback\n", "- id: fallback\n  when: {cap: {ne: 5.0}}\n")
    table = load_table(head + textwrap.indent(rows, "  "), name="check_demo.yaml")
    assert check_table(table) == []  # 5.0 is not declared: the declared grid has no gap
    gaps = [p for p in check_table(table, thresholds=True) if p.kind == "gap"]
    assert len(gaps) == 1 and "cap=5.0" in gaps[0].message
