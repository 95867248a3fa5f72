"""The Gluon kernels' launch tables (tables/gluon_fp8.yaml, tables/gluon_seesaw.yaml), on the CPU and without Triton:
they load, the rule-table checker proves them (every combination one row, no row shadowed), their lookups give what
the launchers need, and a malformed table is refused at load naming the row and the field. That the launch
arguments follow them is tests/test_gluon_fp8_launch_args.py's job."""

from __future__ import annotations

import pytest

from mla_sink import dispatch
from mla_sink.core.dtypes import HALF_KEYS
from mla_sink.core import tables as core_tables
from mla_sink.core.tables import table_path
from mla_sink.kernels.gluon import tuning

FP8 = tuning.gluon_fp8_table
SEESAW = tuning.gluon_seesaw_table


@pytest.mark.parametrize("load", [FP8, SEESAW], ids=["gluon_fp8", "gluon_seesaw"])
def test_tables_load_and_pass_the_checker(load):
    table = load()
    assert dispatch.check_table(table) == []  # no gap, no shadowed row, and no warning either
    assert all(row.why and row.source for row in table.rows)


def _head_blocks() -> list:
    """The head blocks of the fp8 table's path rows, in order."""
    table = FP8()
    return sorted({table.row_params(row)["head_block"] for row in table.rows if not row.is_refusal})


def _short(blocks: int) -> bool:
    """A CTA of one or two blocks (the table's ``*_short`` rows)."""
    return blocks <= 2


def test_every_kv_dtype_head_block_split_and_cta_length_gets_exactly_one_path_row():
    """For every (kv dtype, head count 0-32, split, blocks a CTA) one path row answers, with the smallest head block
    that holds the heads (CTAs of one or two blocks: 16-head blocks, two CTAs a token past 16 heads); every path row
    answers some of them; more heads are refused."""
    table = FP8()
    blocks = _head_blocks()
    assert blocks == sorted(blocks) and len(blocks) >= 2
    seen = set()
    for kv in tuning.fp8_kv_dtypes():
        for split in (False, True):
            for n in (0, 1, 2, 3, 16, 32, 1 << 20):
                for heads in range(0, blocks[-1] + 1):
                    sel = tuning.fp8_selection(kv, "bf16", heads, split, n)
                    assert not sel.refused and sel.path in tuning.FP8_PATHS, (kv, heads, split, n, sel.reason)
                    arr = tuning.fp8_arrangement(kv, "bf16", heads, split, n)
                    want = blocks[0] if _short(n) else min(b for b in blocks if b >= heads)
                    assert arr.head_block == want, (kv, heads, split, n)
                    assert arr.row == sel.row.id and sel.path == tuning.COLUMN_SPLIT
                    seen.add(sel.row.id)
                with pytest.raises(ValueError, match=f"at most {blocks[-1]} heads.*row more_than_32_heads"):
                    tuning.fp8_arrangement(kv, "bf16", blocks[-1] + 1, split, n)
    assert seen == {row.id for row in table.rows if not row.is_refusal}


@pytest.mark.parametrize("ids_per_split,topk,blocks", [(64, 2048, 1), (65, 2048, 2), (128, 2048, 2), (1024, 2048, 16),
                                                       (2048, 2048, 32), (4096, 100, 2), (64, 1, 1), (0, 0, 0)])
def test_the_blocks_of_a_cta(ids_per_split, topk, blocks):
    """The table's ``blocks``: 64-id blocks of one CTA's id range, no more than topk holds."""
    assert tuning.cta_blocks(ids_per_split, topk) == blocks


def test_q_dtypes_each_cache_is_read_with():
    """e4m3 caches take bf16 / fp16 q, V3.2 rows bf16 only; every other q dtype key is refused by a row."""
    read = {kv: {q for q in FP8().fields["q_dtype"].domain if not tuning.fp8_selection(kv, q, 16, False, 32).refused}
            for kv in tuning.fp8_kv_dtypes()}
    assert read == {"fp8_e4m3": set(HALF_KEYS), "fp8_ds_mla": {"bf16"}}
    with pytest.raises(ValueError, match="read with bf16 q only.*row ds_mla_q_not_bf16"):
        tuning.fp8_arrangement("fp8_ds_mla", "fp16", 16, False, 32)
    with pytest.raises(ValueError, match="bf16 or fp16 q.*row e4m3_q_not_half"):
        tuning.fp8_arrangement("fp8_e4m3", "fp8_e4m3", 16, True, 1)
    with pytest.raises(ValueError, match="q_dtype"):
        tuning.fp8_arrangement("fp8_e4m3", "fp32", 16, True, 1)  # not a dtype key


def test_the_measured_arrangements():
    """The rows' numbers as the measurements left them (the tables' why / source say where from)."""
    def get(kv, heads, split, blocks):
        a = tuning.fp8_arrangement(kv, "bf16", heads, split, blocks)
        return (a.head_block, a.consumer_regs, a.producer_regs, a.producer_rows, a.lines,
                a.deferred_row_sum, a.scores_only, a.producers)

    def early(kv, heads, split, blocks):
        return tuning.fp8_arrangement(kv, "bf16", heads, split, blocks).early_ids

    for split in (False, True):
        for kv in tuning.fp8_kv_dtypes():  # one- and two-block CTAs: the column split, the row sum once a block,
            # V3.2's first consumer on the scores only (thirty-third session)
            for blocks in (1, 2):
                only = kv == "fp8_ds_mla"
                assert get(kv, 16, split, blocks) == (16, 104, 152, 64, True, False, only, 1)
                assert get(kv, 17, split, blocks) == (16, 104, 152, 64, True, False, only, 1)  # 2 CTAs
                # V3.2's short CTAs load their first ids before q (thirty-fifth session); e4m3's have no such loads
                assert early(kv, 16, split, blocks) is only and early(kv, 32, split, blocks) is only
        # long id ranges keep each block's ids at its own turn (a block ahead lost 20 us at H=32 T=256)
        assert not any(early(kv, h, split, 32) for kv in tuning.fp8_kv_dtypes() for h in (16, 32))
        # V3.2's long ranges at 16 heads (seventy-sixth session) and 32 (seventy-second): the column split with two
        # producers of 32-row steps; unsplit, each keeps its next step in flight
        for heads in (1, 16, 17, 32):
            block = 16 if heads <= 16 else 32
            want = (block, 112, 88, 32, True, True, False, 2) if split else \
                (block, 104, 96, 32, True, True, False, 2)
            assert get("fp8_ds_mla", heads, split, 16) == get("fp8_ds_mla", heads, split, 32) == want, heads
        # producer_ahead and the first consumer's half of P V in flight: V3.2's unsplit launches of more than two
        # blocks only
        for kv in tuning.fp8_kv_dtypes():
            for h in (1, 16, 17, 32):
                for b in (1, 2, 3, 16, 32):
                    want_on = kv == "fp8_ds_mla" and not split and b > 2
                    a = tuning.fp8_arrangement(kv, "bf16", h, split, b)
                    assert a.pv_overlap is want_on and a.producer_ahead is want_on, (kv, h, split, b)
    # e4m3's long ranges: two producers of 32-row steps, unsplit at 32 heads since the seventy-fourth session, split
    # and at 16 heads since the seventy-sixth
    for heads, split, blocks in ((16, False, 32), (16, True, 16), (32, False, 32), (17, True, 3), (1, False, 3)):
        want = (16 if heads <= 16 else 32, 112, 88, 32, True, True, False, 2)
        assert get("fp8_e4m3", heads, split, blocks) == want, (heads, split, blocks)
    # staged ids (forty-first session): e4m3's long id ranges, not its one- and two-block CTAs nor its 16-head splits;
    # never V3.2, whose consumers need the ids before the stage is filled
    staged = {(kv, h, split, blocks): tuning.fp8_arrangement(kv, "bf16", h, split, blocks).staged_ids
              for kv in tuning.fp8_kv_dtypes() for h in (16, 32) for split in (False, True)
              for blocks in (1, 2, 16, 32)}
    assert {k for k, on in staged.items() if on} == {
        ("fp8_e4m3", 16, False, 16), ("fp8_e4m3", 16, False, 32), ("fp8_e4m3", 32, False, 16),
        ("fp8_e4m3", 32, False, 32), ("fp8_e4m3", 32, True, 16), ("fp8_e4m3", 32, True, 32)}
    assert {kv: tuning.seesaw_producer_regs(kv) for kv in SEESAW().fields["kv_dtype"].domain} == {
        "bf16": 72, "fp16": 72, "fp8_e4m3": 80, "fp8_ds_mla": 72}
    assert {tuning.seesaw_consumer_regs(kv) for kv in SEESAW().fields["kv_dtype"].domain} == {216}
    with pytest.raises(ValueError, match="kv_dtype"):
        tuning.seesaw_producer_regs("fp8_e4m3fnuz")


# ---- malformed tables ------------------------------------------------------------------------------------------

def _edited(name: str, old: str, new: str, row: str | None = None):
    """``tables/<name>.yaml`` with its one ``old`` replaced by ``new`` - inside the row ``row`` only, where given
    (another row may hold the same text) - loaded as ``edited.yaml``."""
    text = table_path(name).read_text()
    start, end = 0, len(text)
    if row is not None:
        start = text.index(f"  - id: {row}\n")
        end = text.find("\n  - id: ", start + 1)  # the next row, or the end of the file
        end = len(text) if end < 0 else end
    segment = text[start:end]
    assert segment.count(old) == 1, (row, old)
    return dispatch.load_table(text[:start] + segment.replace(old, new) + text[end:], name="edited.yaml")


def _params_line(row: str) -> str:
    """The ``params:`` line of ``tables/gluon_fp8.yaml``'s row ``row`` (the first after its id; two rows may have the
    same one: :func:`_edited` with ``row`` edits it in one of them)."""
    lines = table_path("gluon_fp8").read_text().splitlines()
    start = lines.index(f"  - id: {row}")
    return next(line for line in lines[start:] if line.startswith("    params: "))


E4M3_H16 = ("{head_block: 16, consumer_regs: 112, producer_regs: 88, producers: 2, producer_rows: 32, "
            "deferred_row_sum: true, staged_ids: true, l2_prefetch: false}")


@pytest.mark.parametrize("new,message", [
    (E4M3_H16.replace("consumer_regs: 112, ", ""),
     r"row 'e4m3_h16': params must be exactly .*missing \['consumer_regs'\]"),
    (E4M3_H16.replace(", deferred_row_sum: true", ""),
     r"row 'e4m3_h16': params must be exactly .*missing \['deferred_row_sum'\]"),
    (E4M3_H16.replace("deferred_row_sum: true", "deferred_row_sum: 1"),
     r"row 'e4m3_h16': params deferred_row_sum: expected bool, got 1"),
    (E4M3_H16.replace("}", ", stages: 2}"), r"row 'e4m3_h16': params .*unknown \['stages'\]"),
    (E4M3_H16.replace("consumer_regs: 112", "consumer_regs: 140"),
     r"row 'e4m3_h16': params consumer_regs: setmaxnreg takes a multiple of 8 in \[24, 256\], got 140"),
    (E4M3_H16.replace("}", ", lines: 1}"), r"row 'e4m3_h16': params lines: expected bool, got 1"),
    (E4M3_H16.replace("producer_rows: 32", "producer_rows: 0"),
     r"row 'e4m3_h16': params producer_rows: expected a pos"),
    (E4M3_H16.replace("producer_rows: 32", "producer_rows: 48"),
     r"row 'e4m3_h16': params producer_rows: expected a divisor of 64 .* got 48"),
    (E4M3_H16.replace("producer_rows: 32", "producer_rows: 4"),
     r"row 'e4m3_h16': params producer_rows: expected a divisor of 64 .*a multiple of 8 .* got 4"),
    (E4M3_H16.replace("head_block: 16", "head_block: 8"),
     r"row 'e4m3_h16': params head_block: expected one of \(16, 32\) \(the kernel's head blocks\), got 8"),
    (E4M3_H16.replace("head_block: 16", "head_block: 24"), r"row 'e4m3_h16': params head_block: expected one of"),
    (E4M3_H16.replace("}", ", scores_only: 1}"), r"row 'e4m3_h16': params scores_only: expected bool, got 1"),
    (E4M3_H16.replace("}", ", early_ids: 0}"), r"row 'e4m3_h16': params early_ids: expected bool, got 0"),
    (E4M3_H16.replace("staged_ids: true", "staged_ids: 1"), r"row 'e4m3_h16': params staged_ids: expected bool, got 1"),
    (E4M3_H16.replace("}", ", warp_max: 1}"), r"row 'e4m3_h16': params warp_max: expected bool, got 1"),
])
def test_a_bad_fp8_row_is_refused_at_load_naming_the_row_and_field(new, message):
    table = _edited("gluon_fp8", E4M3_H16, new)
    with pytest.raises(dispatch.TableError, match=r"edited\.yaml:\d+: " + message):
        tuning.check_fp8_table(table)


def test_meta_by_second_with_early_ids_is_refused():
    """The second consumer that loads every block's ids and the first consumer that loads its first ids early are
    exclusive (the kernel asserts it): refused at load, naming the row."""
    text = table_path("gluon_fp8").read_text()
    old = "scores_only: true,\n             early_ids: true}"
    assert old in text
    table = dispatch.load_table(text.replace(old, old.replace("}", ", meta_by_second: true}"), 1), name="edited.yaml")
    with pytest.raises(dispatch.TableError, match=r"edited\.yaml:\d+: row 'ds_mla_h16_short': params meta_by_second: "
                                                  r"not with early_ids"):
        tuning.check_fp8_table(table)


@pytest.mark.parametrize("row", ["ds_mla_h32", "ds_mla_h32_split", "ds_mla_h16", "ds_mla_h16_split"])
def test_staged_ids_on_a_row_that_serves_v32_rows_is_refused(row):
    """V3.2's consumers load each block's ids before its stage is filled (the tile scales' loads need them), so a row
    that can match the V3.2 cache may not stage them: refused at load, naming the row."""
    text = table_path("gluon_fp8").read_text()
    start = text.index(f"  - id: {row}\n")
    params = text.index("    params: {", start)
    end = text.index("}\n", params)
    table = dispatch.load_table(text[:end] + ", staged_ids: true" + text[end:], name="edited.yaml")
    with pytest.raises(dispatch.TableError, match=rf"edited\.yaml:\d+: row '{row}': params staged_ids: only rows whose "
                                                  r"kv_dtype excludes \['fp8_ds_mla'\]"):
        tuning.check_fp8_table(table)


@pytest.mark.parametrize("regs,producers,message", [
    ("consumer_regs: 256, producer_regs: 256", 1, r"504 - 256 - 1 x 256 = -8 registers"),
    ("consumer_regs: 136, producer_regs: 192", 2, r"512 - 136 - 2 x 192 = -8 registers"),
    ("consumer_regs: 24, producer_regs: 104", 2, r"512 - 24 - 2 x 104 = 280 registers")])
def test_workers_leaving_the_default_partition_no_legal_count_are_refused(regs, producers, message):
    """Three warpgroups share 504 registers a thread-slot, four (two producers) 512 (tuning.partition_regs); the
    first consumer gets what the workers leave, which must be a legal setmaxnreg count."""
    new = E4M3_H16.replace("consumer_regs: 112, producer_regs: 88, producers: 2", f"{regs}, producers: {producers}")
    with pytest.raises(dispatch.TableError, match=r"row 'e4m3_h16': .*default partition gets " + message
                       + r", outside \[24, 256\]"):
        tuning.check_fp8_table(_edited("gluon_fp8", E4M3_H16, new))


def test_the_register_file_split_per_warpgroup_count():
    """What the SASS of the kernel's arrangements has (setmaxnreg counts adding up per thread-slot)."""
    assert [tuning.partition_regs(n) for n in (3, 4)] == [504, 512]


@pytest.mark.parametrize("count", [0, 3])
def test_a_producer_count_the_kernel_does_not_build_is_refused(count):
    new = E4M3_H16.replace("producers: 2", f"producers: {count}")
    with pytest.raises(dispatch.TableError, match=rf"row 'e4m3_h16': params producers: "
                       + (r"expected one of \(1, 2\)" if count else r"expected a positive int")):
        tuning.check_fp8_table(_edited("gluon_fp8", E4M3_H16, new))


@pytest.mark.parametrize("ahead_row", ["ds_mla_h16", "ds_mla_h32"])
@pytest.mark.parametrize("edit", ["kv", "producers", "rows", "lines"])
def test_producer_ahead_only_where_the_kernel_builds_it(edit, ahead_row):
    """``producer_ahead`` (each producer's next step in flight) needs V3.2 rows only, two producers, steps of less
    than a block and whole lines: any other row that asks for it is refused at load, naming the row and the param."""
    if edit == "kv":  # an e4m3 row with two producers of half-block steps asking for it
        old = E4M3_H16
        new = E4M3_H16.replace("}", ", producer_ahead: true}")
        row = "e4m3_h16"
    else:
        old = _params_line(ahead_row)
        assert "producer_ahead: true" in old
        new = {"producers": old.replace("producers: 2", "producers: 1").replace("consumer_regs: 104",
                                                                                 "consumer_regs: 248"),
               "rows": old.replace("producer_rows: 32", "producer_rows: 64"),
               "lines": old.replace("}", ", lines: false}")}[edit]
        row = ahead_row
    with pytest.raises(dispatch.TableError, match=rf"row '{row}': params producer_ahead: only rows whose kv_dtype "
                                                  r"is the V3\.2 rows"):
        tuning.check_fp8_table(_edited("gluon_fp8", old, new, row))


@pytest.mark.parametrize("overlap_row", ["ds_mla_h16", "ds_mla_h32"])
@pytest.mark.parametrize("edit", ["rope", "meta", "scores_only", "kv"])
def test_pv_overlap_only_where_the_first_consumer_has_no_global_load(edit, overlap_row):
    """``pv_overlap`` needs the column split's second consumer to take the RoPE copies and the ids and tile scales
    (``rope_by_second``, ``meta_by_second``), a first consumer with a half of ``P V`` (not ``scores_only``) and V3.2
    rows: any other row asking for it is refused at load, naming the row and the param."""
    old = _params_line(overlap_row)
    assert "pv_overlap: true" in old
    new = {"rope": old.replace("rope_by_second: true", "rope_by_second: false"),
           "meta": old.replace("meta_by_second: true", "meta_by_second: false"),
           "scores_only": old.replace("}", ", scores_only: true}")}.get(edit)
    row = overlap_row
    if edit == "kv":  # e4m3's split row on the column split
        old = _params_line("e4m3_h32_split")
        new = old.replace("}", ", pv_overlap: true}")
        row = "e4m3_h32_split"
    with pytest.raises(dispatch.TableError, match=rf"row '{row}': params pv_overlap: only with rope_by_second"):
        tuning.check_fp8_table(_edited("gluon_fp8", old, new, row))


def test_a_bad_path_default_is_refused_even_where_every_row_overrides_it():
    old = ("params: {producer_rows: 64, lines: true, scores_only: false, early_ids: false, staged_ids: false, "
           "warp_max: true, rope_by_second: false, meta_by_second: false, l2_prefetch: true, producers: 1, "
           "producer_ahead: false, pv_overlap: false}\n"
           "    description: both consumers read every block")
    table = _edited("gluon_fp8", old, old.replace("lines: true", "lines: true, deferred_row_sum: maybe"))
    with pytest.raises(dispatch.TableError, match=r"edited\.yaml:\d+: path 'column_split': params deferred_row_sum: "
                                                  r"expected bool, got 'maybe'"):
        tuning.check_fp8_table(table)


def test_a_gap_between_the_declared_block_counts_is_refused():
    """``blocks`` is an open count: a row that leaves out a value the domain does not declare (16 blocks a CTA, T=64)
    is a gap a launch would meet, found at load, not at the launch."""
    old = "  - id: e4m3_h16\n    when:\n      kv_dtype: fp8_e4m3\n"
    table = _edited("gluon_fp8", old, old + "      blocks: {ne: 16}\n")
    assert dispatch.check_table(table) == []  # the declared values alone do not show it
    with pytest.raises(dispatch.TableError, match=r"either side of each row's head and block thresholds: .*gap.*"
                                                  r"blocks=16"):
        tuning.check_fp8_table(table)


@pytest.mark.parametrize("old,new", [
    ("  kv_dtype:\n    type: str\n    closed: true", "  kv_dtype:\n    type: str\n    closed: false"),
    ("  blocks:\n    type: int\n", "  blocks:\n    type: int\n    closed: true\n"),
    ("  blocks:\n    type: int\n", "  blocks:\n    type: float\n"),
])
def test_fields_that_would_hide_or_refuse_a_count_are_refused(old, new):
    """A closed count (a launch of another count refused at the lookup) or a float one (no threshold enumerated)
    is refused at load, naming the fields."""
    with pytest.raises(dispatch.TableError, match=r"edited\.yaml: the fields must be"):
        tuning.check_fp8_table(_edited("gluon_fp8", old, new))


def test_a_threshold_at_the_least_count_finds_no_gap_below_it():
    """``range: [0, 16]`` means ``le: 16`` for every head count: no gap at -1."""
    old = 'num_heads: {le: 16, because: "16-head blocks"}\n    path: column_split\n    params: {head_block: 16, '
    table = _edited("gluon_fp8", old + "consumer_regs: 112", old.replace("{le: 16,", "{range: [0, 16],")
                    + "consumer_regs: 112")
    tuning.check_fp8_table(table)


def test_the_shipped_loader_refuses_a_bad_table_at_load(monkeypatch, tmp_path):
    """Through the cached loader itself: a malformed row (the engine's loader, naming file, line, row and field) and
    a bad param (this module's check) are errors at the first lookup, not wrong launches."""
    text = table_path("gluon_fp8").read_text()
    path = tmp_path / "gluon_fp8.yaml"
    monkeypatch.setattr(core_tables, "table_path", lambda name: path)  # the loader every table shares
    try:
        for new, message in [
                (E4M3_H16.replace("}", "}\n    sm: 90"), r"gluon_fp8.yaml:\d+: row 'e4m3_h16': unknown row key"),
                (E4M3_H16.replace("producer_regs: 88", "producer_regs: 300"),
                 r"gluon_fp8.yaml:\d+: row 'e4m3_h16': params producer_regs: setmaxnreg")]:
            path.write_text(text.replace(E4M3_H16, new))
            tuning._load.cache_clear()
            tuning.fp8_selection.cache_clear()
            tuning.fp8_arrangement.cache_clear()
            with pytest.raises(dispatch.TableError, match=message):
                tuning.fp8_arrangement("fp8_e4m3", "bf16", 16, False, 32)
    finally:
        tuning._load.cache_clear()
        tuning.fp8_selection.cache_clear()
        tuning.fp8_arrangement.cache_clear()


def test_a_gap_or_a_shadowed_row_fails_the_checker():
    gap = _edited("gluon_fp8", "      split: {eq: true, because: \"split launches take the column split\"}\n",
                  "      split: {eq: true, because: \"split launches take the column split\"}\n"
                  "      q_dtype: fp16\n")
    with pytest.raises(dispatch.TableCheckError, match="gap"):
        dispatch.assert_table_ok(gap)
    text = table_path("gluon_fp8").read_text()
    start, end = text.index("  - id: e4m3_h32_split"), text.index("  - id: ds_mla_h16")
    moved = text[:start] + text[end:] + text[start:end]
    # e4m3's split row after a 17-32-head row that no longer tests the KV dtype: it never wins
    table = dispatch.load_table(moved.replace("kv_dtype: fp8_ds_mla\n      num_heads: {gt: 16",
                                              "num_heads: {gt: 16"), name="edited.yaml")
    with pytest.raises(dispatch.TableCheckError, match="e4m3_h32_split.*shadowed"):
        dispatch.assert_table_ok(table)


def test_the_fp8_paths_and_the_seesaw_params_are_checked():
    text = table_path("gluon_fp8").read_text()
    renamed = dispatch.load_table(text.replace("column_split", "columns"), name="edited.yaml")
    with pytest.raises(dispatch.TableError, match="paths must be the arrangements"):
        tuning.check_fp8_table(renamed)
    seesaw = _edited("gluon_seesaw", "params: {producer_regs: 80}", "params: {producer_regs: 80, gather_rows: 64}")
    with pytest.raises(dispatch.TableError, match=r"row 'e4m3_producer_80': params .*unknown \['gather_rows'\]"):
        tuning.check_seesaw_table(seesaw)
    seesaw = _edited("gluon_seesaw", "params: {producer_regs: 80}", "params: {producer_regs: 80, consumer_regs: 220}")
    with pytest.raises(dispatch.TableError, match=r"row 'e4m3_producer_80': params consumer_regs: setmaxnreg takes"):
        tuning.check_seesaw_table(seesaw)
